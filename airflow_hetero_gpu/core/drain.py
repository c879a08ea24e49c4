"""Drained hosts: taken out of placement for maintenance (``hetero-gpu drain``).

A drained host's GPUs are never placed on or claimed for a queued job; the jobs running there
run on (their GPUs stay reserved) until they end, or until the drain's deadline
(docs/operations.md). The ledger keeps the drains; the planner and the admission pass take them
as an input (``drained``: host -> reason), like the evictions.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from airflow_hetero_gpu.core.cluster import Cluster

DRAINED = "drained"


def drained_mask(cluster: Cluster, drained: Mapping[str, str] | None) -> np.ndarray:
    """The GPUs (and MIG instances) of the drained hosts, as a mask over ``cluster.gpus``."""
    mask = np.zeros(len(cluster.gpus), dtype=bool)
    if drained:
        ids = [i for i, h in enumerate(cluster.hosts) if h in drained]
        if ids:
            mask = np.isin(cluster.host_of, ids)
    return mask


def drain_reason(host: str, reason: str) -> str:
    """``node01 drained: driver upgrade``."""
    return f"{host} {DRAINED}: {reason}"


__all__ = ["DRAINED", "drain_reason", "drained_mask"]
