"""Drained hosts: taken out of placement for maintenance (``hetero-gpu drain``).

A drained host's GPUs are never placed on or claimed for a queued job; the jobs running there
run on (their GPUs stay reserved) until they end, or until the drain's deadline
(docs/operations.md). The ledger keeps the drains; the planner and the admission pass take them
as an input (``drained``: host -> reason), like the evictions.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping

import numpy as np

from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.durations import duration

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


def drain_line(d: Any, now: datetime) -> str:
    """``node01 drained: driver upgrade (since 3m05s, by ops; running jobs end in 1h00m)``."""
    when = f"since {duration((now - d.drained_at).total_seconds())}, by {d.drained_by}"
    if d.deadline is None:
        ends = "running jobs finish"
    elif d.deadline > now:
        ends = f"running jobs end in {duration((d.deadline - now).total_seconds())}"
    else:
        ends = "deadline passed" + (f": ended {', '.join(d.ended)}" if d.ended else "")
    return f"{d.host} drained: {d.reason} ({when}; {ends})"


__all__ = ["DRAINED", "drain_line", "drain_reason", "drained_mask"]
