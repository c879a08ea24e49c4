"""Who chooses GPUs for the admission pass: the planner, behind a small seam.

An admission pass asks a :class:`Placer` two kinds of question about a waiting job:

* **start** (``idle is None``): its GPUs now, with ``blocked`` marking every GPU it may not use
  (held by live reservations, by jobs admitted earlier in the pass, claimed for a head ahead of it);
* **target** (``idle`` given): its GPUs as if the jobs holding the ``idle`` GPUs had ended, with
  ``blocked`` marking GPUs it may not claim.

:class:`PlannerPlacer` answers both with :func:`~airflow_hetero_gpu.core.planner.plan` (the
product's placer), through :class:`~airflow_hetero_gpu.core.plankept.KeptPlans`, which keeps the
reports of the pools whose GPUs did not change since it last answered; the simulator wraps its
baseline policies the same way, so one admission function runs every policy.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

import numpy as np

from airflow_hetero_gpu.core.admission.model import QueueEntry
from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.config import ClusterConfig
from airflow_hetero_gpu.core.model import GpuKey, PlanResult
from airflow_hetero_gpu.core.plankept import KeptPlans


@dataclass(frozen=True)
class Placement:
    """A placer's answer: ``gpus`` (empty: not placed), their pool, plan()'s result when it has one."""

    gpus: tuple[GpuKey, ...] = ()
    pool: str | None = None
    result: PlanResult | None = None

    @property
    def placed(self) -> bool:
        return bool(self.gpus)

    def why_not(self) -> str | None:
        """The planner's reason for the pool that came closest (most available GPUs), if any."""
        if self.result is None or self.placed:
            return None
        reports = [p for p in self.result.pools if p.stage != "rejected"] or list(self.result.pools)
        if not reports:
            return None
        best = max(reports, key=lambda p: p.available)  # the first such pool in id order
        reason = best.reason_text()
        return f"{best.pool}: {reason}" if reason else None


class Placer(Protocol):
    def __call__(self, entry: QueueEntry, blocked: np.ndarray, holders: Mapping[GpuKey, str],
                 idle: np.ndarray | None = None) -> Placement:  # pragma: no cover - protocol
        ...


class PlannerPlacer:
    """plan() as the placer.

    In a target question the GPUs in ``idle`` (held by running jobs) count as they will be once
    released: idle (load 0) with all their memory free, whatever the last collection measured
    while the job ran on them.
    """

    def __init__(self, cluster: Cluster, *, evicted: Mapping[GpuKey, Sequence[str]] | None = None,
                 config: ClusterConfig | None = None, drained: Mapping[str, str] | None = None,
                 kept: KeptPlans | None = None) -> None:
        self.cluster = cluster
        self.evicted = evicted or {}
        self.drained = drained or {}
        self.config = config
        # plan() with every pool's report kept while its GPUs do not change (one admission keeps
        # it on the cluster between passes): the same answers
        self.kept = kept or KeptPlans(cluster, evicted=self.evicted, config=config, drained=self.drained)
        self._released: tuple[np.ndarray, Cluster] | None = None

    def released(self, idle: np.ndarray) -> Cluster:
        """The cluster with the ``idle`` GPUs unloaded (a shallow copy; the last one is reused)."""
        if self._released is not None and np.array_equal(self._released[0], idle):
            return self._released[1]
        base = self.cluster
        total = base.memory_total  # computed once per cluster, not per pass
        c = copy.copy(base)
        c.base_load = np.where(idle, 0.0, base.base_load)  # one pass over the arrays each
        c.has_processes = base.has_processes & ~idle  # the job's processes end with it
        c.memory_free = np.where(idle & base.memory_known, total, base.memory_free)
        self._released = (idle.copy(), c)
        return c

    def __call__(self, entry: QueueEntry, blocked: np.ndarray, holders: Mapping[GpuKey, str],
                 idle: np.ndarray | None = None) -> Placement:
        cluster = self.cluster if idle is None else self.released(idle)
        result = self.kept.plan(entry.request, holders, blocked, cluster=cluster, idle=idle)
        if result.decision is None:
            return Placement(result=result)
        # the scheduling pool's selection: the decision's GPUs' keys, without making them again
        chosen = next(r.selection for r in result.pools if r.stage == "scheduling")
        return Placement(tuple(chosen), result.decision.pool, result)
