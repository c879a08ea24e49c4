"""Topology score ``TS = 1 / d(S)``: S is the set of k GPUs the job would get in the pool (§7.1).

Range (0, 1]; 1 when every pair of S is one NVLink hop apart (or k = 1).
"""

from __future__ import annotations

from airflow_hetero_gpu.core.view import PoolView


def topology_score(view: PoolView) -> float:
    d = view.selection.mean_distance
    return 1.0 / d if d > 0 else 1.0
