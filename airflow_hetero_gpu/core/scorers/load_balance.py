"""Load balance ``LB = 1 − (u_max − u_mean)`` over the pool's healthy GPUs. Range [0, 1]; 1 is even."""

from __future__ import annotations

from airflow_hetero_gpu.core.view import PoolView


def load_balance(view: PoolView) -> float:
    return view.memo("load_balance", lambda: _load_balance(view))  # the same for every request


def _load_balance(view: PoolView) -> float:
    loads = view.healthy_loads
    if len(loads) == 0:
        return 0.0
    return 1.0 - (float(loads.max()) - float(loads.mean()))
