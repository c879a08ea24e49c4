"""plan() for many questions on one cluster, each pool's report kept while its inputs stay the same.

An admission pass asks the planner a question per job it starts and a few per head it claims
for, each time with the reservations as a mask over the cluster's GPUs. Between two questions a
job admitted or a claim made changes the GPUs of one pool; every other pool's report (its stage,
its counts, the GPUs it would give, their score) is what it was. :func:`~.planner.pool_report`
reads only the pool's own GPUs, so :class:`KeptPlans` keeps each report under the request, the
pool and the pool's slice of the mask (and, for a target question, of the GPUs counted as idle),
and computes only the pools whose slice is new. The answer is :func:`~.planner.plan`'s with
``explain=False`` for the same arguments (tests/test_core_plan_kept.py compares them).

What depends on the cluster, the evictions, the drains and the configuration alone (healthy,
drained, the GPUs usable at all, each memory ask's mask, the unhealthy list) is computed once per
cluster; the kept object lives as long as the admission's static state
(:meth:`~.admission.rule.Admission._static`), so a pass after a renewal finds the reports of the
pass before it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from airflow_hetero_gpu.core import filters
from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.config import ClusterConfig
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest, PlanResult, PoolReport
from airflow_hetero_gpu.core.planner import check_mig_request, cluster_state, conclude, pool_report, unhealthy_gpus
from airflow_hetero_gpu.core.view import ClusterState, PoolView

#: reports kept at most (each keyed by a pool's packed mask: about 2.5 kB at 20,000 GPUs a pool)
LIMIT = 4096


class _Parts:
    """What :func:`~.planner.cluster_state` computes from one cluster (or a released copy) alone."""

    def __init__(self, cluster: Cluster, evicted, config: ClusterConfig, drained) -> None:
        base = cluster_state(cluster, PlanRequest(1), {}, evicted, config, drained=drained)
        self.cluster = cluster
        self.base = base
        self.usable = base.healthy & cluster.schedulable & ~base.on_drained
        self.block_foreign = config.thresholds.foreign_processes == "block"
        self.memory: dict[float, np.ndarray] = {}
        self.unhealthy: list | None = None
        # the last mask seen, each pool's packed slice of it and its load array (None until
        # asked for): the next call's mask differs only where an admission or a claim changed it.
        # One tuple, replaced whole, so that passes in two threads never mix two masks' parts
        self._last: tuple[np.ndarray, list[bytes], np.ndarray | None] | None = None

    def slices(self, mask: np.ndarray) -> list[bytes]:
        """Each pool's slice of ``mask``, packed: recomputed only for the pools where it changed."""
        c = self.cluster
        last = self._last
        if last is None:
            slices = [np.packbits(mask[p.positions]).tobytes() for p in c.pools]
            self._last = (mask.copy(), slices, None)
            return slices
        old, slices, load = last
        changed = np.flatnonzero(mask != old)
        if len(changed):
            slices = list(slices)
            for i in np.unique(c.pool_of[changed]).tolist():
                slices[i] = np.packbits(mask[c.pools[i].positions]).tobytes()
            if load is not None:  # never written to once made: a copy follows the mask
                load = load.copy()
                load[changed] = np.where(mask[changed], 1.0, c.base_load[changed])
            self._last = (mask.copy(), slices, load)
        return slices

    def load(self, mask: np.ndarray) -> np.ndarray:
        """The base load with the GPUs in ``mask`` at 1 (made from the last mask's when it is that one)."""
        last = self._last
        if last is not None and np.array_equal(mask, last[0]):
            if last[2] is None:
                load = self.cluster.base_load.copy()
                load[last[0]] = 1.0
                self._last = (last[0], last[1], load)
                return load
            return last[2]
        load = self.cluster.base_load.copy()
        load[mask] = 1.0
        return load

    def memory_ok(self, mib) -> np.ndarray | None:
        if not mib:
            return None
        ok = self.memory.get(mib)
        if ok is None:
            with np.errstate(invalid="ignore"):
                ok = self.memory[mib] = self.cluster.memory_free >= mib  # unknown (nan) is not enough
        return ok

    def state(self, request: PlanRequest, reserved: Mapping[GpuKey, str], mask: np.ndarray) -> ClusterState:
        """cluster_state(cluster, request, reserved, reserved_mask=mask, ...), array for array."""
        b, c = self.base, self.cluster
        n = len(c.gpus)
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (n,):
            raise ValueError(f"reserved_mask: expected {n} entries, got {mask.shape}")
        load = self.load(mask)
        busy = load > b.thresholds.busy_utilization
        memory_ok = self.memory_ok(request.gpu_memory_mib)
        outside = c.has_processes & ~mask if self.block_foreign else np.zeros(n, dtype=bool)
        available = self.usable & ~mask & ~busy & ~outside
        if memory_ok is not None:
            available &= memory_ok
        else:
            memory_ok = np.ones(n, dtype=bool)
        return ClusterState(c, request, b.thresholds, reserved, b.evicted, mask, b.healthy, load, busy, memory_ok,
                            available, outside, b.drained, b.on_drained)


class _Call:
    """One question's inputs, to write a kept pool's reason when someone reads it."""

    __slots__ = ("parts", "request", "reserved", "mask", "_state")

    def __init__(self, parts: _Parts, request, reserved, mask) -> None:
        self.parts, self.request, self.reserved, self.mask = parts, request, reserved, mask
        self._state: ClusterState | None = None

    def state(self) -> ClusterState:
        if self._state is None:
            self._state = self.parts.state(self.request, self.reserved, self.mask)
        return self._state

    def reason(self, pool) -> str | None:
        view = PoolView(pool, self.state())
        return next((r for r in (f(view) for f in filters.PRESELECT) if r is not None), None)


class KeptPlans:
    """``plan(cluster, request, reserved=..., reserved_mask=..., explain=False)`` for one cluster,
    evictions, drains and configuration, with every pool's report kept by its inputs."""

    def __init__(self, cluster: Cluster, *, evicted: Mapping[GpuKey, Sequence[str]] | None = None,
                 config: ClusterConfig | None = None, drained: Mapping[str, str] | None = None,
                 limit: int = LIMIT) -> None:
        self.cluster = cluster
        self.evicted = evicted or {}
        self.drained = drained or {}
        self.config = config or cluster.config
        self.weights = self.config.weights.model_dump()
        self.limit = limit
        self._parts: dict[int, _Parts] = {}  # id(cluster or released copy) -> its parts (the latest copy's)
        self._kept: dict[tuple, tuple] = {}
        self.computed = 0  # pool reports computed (not found kept): for tests and benchmarks

    def forget(self) -> None:
        """Drop every kept report (the next questions are answered from scratch)."""
        self._kept.clear()
        self._parts.clear()

    def parts(self, cluster: Cluster) -> _Parts:
        got = self._parts.get(id(cluster))
        if got is None or got.cluster is not cluster:
            if cluster is not self.cluster:  # a released copy: keep the latest one only
                self._parts = {k: v for k, v in self._parts.items() if v.cluster is self.cluster}
            got = self._parts[id(cluster)] = _Parts(cluster, self.evicted, self.config, self.drained)
        return got

    def plan(self, request: PlanRequest, reserved: Mapping[GpuKey, str], mask: np.ndarray, *,
             cluster: Cluster | None = None, idle: np.ndarray | None = None) -> PlanResult:
        """The plan for ``request`` with the GPUs in ``mask`` reserved (``reserved`` names their
        holders) on ``cluster`` (default: the kept one; a copy of it with the ``idle`` GPUs
        released, for a target question: then ``idle`` is part of each pool's key)."""
        cluster = cluster if cluster is not None else self.cluster
        check_mig_request(cluster, request)  # a mistake, refused as plan() refuses it
        parts = self.parts(cluster)
        kept, released = self._kept, idle is not None
        reports: list[PoolReport] = []
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (len(cluster.gpus),):
            raise ValueError(f"reserved_mask: expected {len(cluster.gpus)} entries, got {mask.shape}")
        slices = parts.slices(mask)
        call = _Call(parts, request, reserved, mask)
        for i, pool in enumerate(cluster.pools):
            pos = pool.positions
            key = (request, i, slices[i], np.packbits(idle[pos]).tobytes() if released else None)
            row = kept.get(key)
            if row is None:
                rep = pool_report(pool, call.state(), self.weights, explain=False)
                self.computed += 1
                row = (rep.healthy, rep.available, rep.stage, None if rep.explain is not None else rep.reason,
                       rep.score, rep.selection, rep.mean_distance, rep.explain is not None)
                if len(kept) >= self.limit:
                    kept.clear()
                kept[key] = row
            healthy, available, stage, reason, score, selection, distance, later = row
            rep = PoolReport(pool.id, pool.card_type, pool.task_types, len(pos), healthy, available, stage, reason,
                             score, selection, distance)
            if later:
                rep.explain = lambda pool=pool: call.reason(pool)
            reports.append(rep)
        if parts.unhealthy is None:
            parts.unhealthy = unhealthy_gpus(cluster, parts.base)
        return conclude(cluster, request, reports, list(parts.unhealthy))
