"""Fragmentation ``FR = |{i : busy < u_i < full}| / n`` over the pool's n healthy GPUs.

Range [0, 1]; a GPU loaded between the busy and full thresholds is a fragment: too busy to be
given to a job, not busy enough to be well used. Its default weight is negative.
"""

from __future__ import annotations

from airflow_hetero_gpu.core.view import PoolView


def fragmentation(view: PoolView) -> float:
    return view.memo("fragmentation", lambda: _fragmentation(view))  # the same for every request


def _fragmentation(view: PoolView) -> float:
    loads = view.healthy_loads
    if len(loads) == 0:
        return 0.0
    th = view.thresholds
    fragments = (loads > th.busy_utilization) & (loads < th.full_utilization)
    return float(fragments.sum()) / len(loads)
