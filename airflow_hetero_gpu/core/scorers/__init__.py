"""Score terms of the seed's evaluation (SPEC §7), after the Kubernetes scheduler's score plugins.

A scorer is a small pure function ``(PoolView) -> float`` with a documented range. The
evaluation is ``sum(weight[name] * scorer(view))`` over :data:`SCORERS`; adding a term means one
new module here, one line in :data:`SCORERS`, and its weight in ``cluster.yaml``'s ``weights``.
"""

from __future__ import annotations

from typing import Callable

from airflow_hetero_gpu.core.scorers.fragmentation import fragmentation
from airflow_hetero_gpu.core.scorers.free_blocks import free_blocks
from airflow_hetero_gpu.core.scorers.load_balance import load_balance
from airflow_hetero_gpu.core.scorers.topology import topology_score
from airflow_hetero_gpu.core.view import PoolView

Scorer = Callable[[PoolView], float]

SCORERS: dict[str, Scorer] = {
    "load_balance": load_balance,
    "fragmentation": fragmentation,
    "topology": topology_score,
    "free_blocks": free_blocks,
}

__all__ = ["SCORERS", "Scorer", "fragmentation", "free_blocks", "load_balance", "topology_score"]
