"""What every GPU and every pool looks like now: one state per GPU, the counts per pool.

One place for the numbers that ``hetero-gpu pools``, the health watch and the cluster page
show, so they cannot disagree. Built on the planner's own :func:`~.planner.cluster_state` for a
one-GPU request (reservations hold their GPUs at load 1, evictions take GPUs out), so
*available* here is what the planner would hand out.

A GPU has exactly one state, the first that holds:

* ``unhealthy``: the last collection found a fault (``Gpu.reasons``);
* ``evicted``: the ledger keeps it out of every pool (the health watch's eviction);
* ``reserved``: a live reservation holds it (a job on a drained host runs on: reserved);
* ``drained``: its host is drained (:mod:`.drain`): no new job is placed there;
* ``busy``: its load (SPEC §4) is above ``busy_utilization``, or it is in use outside the
  scheduler (a compute process of someone else, :mod:`.foreign`);
* ``available``: none of the above.

The pool counts are not exclusive: an evicted GPU that is also unhealthy counts in both
``evicted`` and ``unhealthy``, a sick reserved GPU in ``reserved`` and ``unhealthy``; ``healthy`` is
neither unhealthy nor evicted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.core.planner import cluster_state
from airflow_hetero_gpu.core.view import ClusterState

STATES = ("unhealthy", "evicted", "reserved", "drained", "busy", "available")


def fleet_state(cluster: Cluster, reserved: Mapping[GpuKey, str] | None = None,
                evicted: Mapping[GpuKey, Sequence[str]] | None = None,
                drained: Mapping[str, str] | None = None) -> ClusterState:
    """The planner's state of every GPU for a one-GPU request (no memory requirement)."""
    return cluster_state(cluster, PlanRequest(gpus=1), reserved, evicted, drained=drained)


def _drained(state: ClusterState) -> np.ndarray:
    """The GPUs of drained hosts that no job holds (a job's GPUs stay reserved until it ends)."""
    if state.on_drained is None:
        return np.zeros(len(state.cluster.gpus), dtype=bool)
    return state.on_drained & ~state.reserved


def gpu_states(state: ClusterState) -> np.ndarray:
    """The state name of every GPU of ``state.cluster`` (in ``cluster.gpus`` order)."""
    cluster = state.cluster
    evicted = np.zeros(len(cluster.gpus), dtype=bool)
    pos = [cluster.position[k] for k in state.evicted if k in cluster.position]
    if pos:
        evicted[pos] = True
    return np.select(
        [~cluster.healthy, evicted, state.reserved, _drained(state), state.busy | state.outside],
        list(STATES[:5]),
        default=STATES[5],
    ).astype(object)


@dataclass(frozen=True)
class PoolCounts:
    """One candidate pool now: its GPUs and how many of them are in each condition."""

    pool: str
    card_type: str
    task_types: tuple[str, ...]
    hosts: tuple[str, ...]
    gpus: int
    healthy: int      # not unhealthy in the last collection and not evicted
    available: int    # the planner would hand it to a one-GPU request now
    reserved: int     # held by a live reservation
    evicted: int      # kept out by the ledger
    unhealthy: int    # a fault in the last collection
    busy: int         # healthy, not reserved, not drained, loaded above busy_utilization or in use outside
    drained: int = 0  # healthy, not reserved, on a drained host

    def to_json(self) -> dict[str, Any]:
        return {
            "pool": self.pool, "card_type": self.card_type, "task_types": list(self.task_types),
            "hosts": list(self.hosts), "gpus": self.gpus, "healthy": self.healthy,
            "available": self.available, "reserved": self.reserved, "evicted": self.evicted,
            "unhealthy": self.unhealthy, "busy": self.busy, "drained": self.drained,
        }


def pool_counts(cluster: Cluster, reserved: Mapping[GpuKey, str] | None = None,
                evicted: Mapping[GpuKey, Sequence[str]] | None = None, *,
                state: ClusterState | None = None, drained: Mapping[str, str] | None = None) -> list[PoolCounts]:
    """Per candidate pool (in ``cluster.pools`` order), reservations and evictions applied.

    ``state``: a :func:`fleet_state` already computed for the same reservations and evictions.
    """
    state = state if state is not None else fleet_state(cluster, reserved, evicted, drained)
    evicted_mask = np.zeros(len(cluster.gpus), dtype=bool)
    pos = [cluster.position[k] for k in state.evicted if k in cluster.position]
    if pos:
        evicted_mask[pos] = True
    unhealthy = ~cluster.healthy
    drained = state.healthy & _drained(state)
    busy = state.healthy & ~state.reserved & ~drained & (state.busy | state.outside)
    out = []
    for pool in cluster.pools:
        p = pool.positions
        out.append(PoolCounts(
            pool=pool.id,
            card_type=pool.card_type,
            task_types=tuple(pool.task_types),
            hosts=tuple(sorted({cluster.hosts[h] for h in np.unique(cluster.host_of[p]).tolist()})),
            gpus=int(len(p)),
            healthy=int(state.healthy[p].sum()),
            available=int(state.available[p].sum()),
            reserved=int(state.reserved[p].sum()),
            evicted=int(evicted_mask[p].sum()),
            unhealthy=int(unhealthy[p].sum()),
            busy=int(busy[p].sum()),
            drained=int(drained[p].sum()),
        ))
    return out


def totals(counts: Sequence[PoolCounts]) -> dict[str, int]:
    """The pool counts summed over the fleet (every GPU is in exactly one pool)."""
    names = ("gpus", "healthy", "available", "reserved", "evicted", "unhealthy", "busy", "drained")
    return {n: sum(getattr(c, n) for c in counts) for n in names}
