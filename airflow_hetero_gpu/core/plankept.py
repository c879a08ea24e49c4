"""plan() for many questions on one cluster, each pool's report kept while its inputs stay the same.

An admission pass asks the planner a question per job it starts and a few per head it claims
for, each time with the reservations as a mask over the cluster's GPUs. Between two questions a
job admitted or a claim made changes the GPUs of one pool; every other pool's report (its stage,
its counts, the GPUs it would give, their score) is what it was. :func:`~.planner.pool_report`
reads only the pool's own GPUs, so :class:`KeptPlans` keeps each report under the pool, the
request's k and memory ask (past the primary filters, whose verdict is kept per request and pool,
nothing else of the request is read) and the pool's slice of the mask (and, for a target
question, of the GPUs counted as idle), and computes only the pools whose slice is new. The
answer is :func:`~.planner.plan`'s with ``explain=False`` for the same arguments
(tests/test_core_plan_kept.py compares them).

A question's arrays (:class:`_Now`) are the last question's, patched in place where the mask
changed (a question asked before computes its own again if it is read later), and a
pool's view cache (its slices of them, and what filters, candidates and scorers keep with
:meth:`~.view.PoolView.memo`) is shared by every request under one mask and memory ask. A pool
the change touched gets the last question's slices copied and written at the changed positions,
not gathered again from the whole arrays (tests/test_core_plan_now.py compares all of it with
what is computed from scratch).

What depends on the cluster, the evictions, the drains and the configuration alone (healthy,
drained, the GPUs usable at all, each memory ask's mask, the unhealthy list) is computed once per
cluster; the kept object lives as long as the admission's static state
(:meth:`~.admission.rule.Admission._static`), so a pass after a renewal finds the reports of the
pass before it.
"""

from __future__ import annotations

import threading
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from airflow_hetero_gpu.core import filters
from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.config import ClusterConfig
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest, PlanResult, PoolReport
from airflow_hetero_gpu.core.planner import (
    check_mig_request, cluster_state, conclude, first_failure, pool_report, unhealthy_gpus,
)
from airflow_hetero_gpu.core.view import ClusterState, PoolView

_UNASKED = object()

#: reports kept at most (each keyed by a pool's packed mask: about 2.5 kB at 20,000 GPUs a pool)
LIMIT = 4096


def _frozen(*arrays: np.ndarray) -> None:
    for a in arrays:
        a.flags.writeable = False


class _Now:
    """What :func:`~.planner.cluster_state` computes from one reserved mask: the load, busy,
    outside and available arrays (available before any memory ask), each pool's packed slice of
    the mask, and each pool's slices of them that the pool reports read (by pool index:
    ``(i, "loads")``, ``(i, mib)``).

    The four arrays of the latest mask are patched in place for the next one (:meth:`_Parts.now`):
    a question asked earlier then no longer owns them (``_arrays`` None) and, if read again (for a
    reason written later), computes its own from its mask. What it handed out before stays its
    own: the pools' slices are copies, and a :class:`_Call`'s state is built again."""

    __slots__ = ("mask", "slices", "_arrays", "_parts", "available", "local")

    def __init__(self, parts, mask, slices, arrays, local) -> None:
        _frozen(mask)
        self.mask, self.slices, self._parts = mask, slices, parts
        self._arrays: tuple | None = arrays  # (load, busy, outside, avail), read-only
        self.available: dict = {}  # memory ask -> available with it
        self.local: dict = local

    def arrays(self) -> tuple:
        got = self._arrays
        if got is None:
            got = self._arrays = self._parts.computed(self.mask)
        return got

    @property
    def load(self) -> np.ndarray:
        return self.arrays()[0]

    @property
    def busy(self) -> np.ndarray:
        return self.arrays()[1]

    @property
    def outside(self) -> np.ndarray:
        return self.arrays()[2]

    @property
    def avail(self) -> np.ndarray:
        return self.arrays()[3]


class _Offsets(NamedTuple):
    pool: np.ndarray  # position -> its index in its pool's positions
    healthy: np.ndarray  # position -> its index in its pool's healthy positions, -1: not healthy


class _Parts:
    """What :func:`~.planner.cluster_state` computes from one cluster (or a released copy) alone,
    and the arrays of the last reserved mask asked about (:class:`_Now`)."""

    def __init__(self, cluster: Cluster, evicted, config: ClusterConfig, drained, lock,
                 like: "_Parts | None" = None) -> None:
        """``like``: the parts of a cluster this one is a copy of with other loads, processes and
        free memory only (the same GPUs, health, schedulability and pools): what depends on
        those alone is taken from it (the base state's health and drains, the healthy GPUs of
        each pool, their offsets, the unhealthy list), not computed again."""
        n = len(cluster.gpus)
        if like is not None:
            base, self.usable = like.base, like.usable
        else:
            base = cluster_state(cluster, PlanRequest(1), {}, evicted, config, drained=drained)
            self.usable = base.healthy & cluster.schedulable & ~base.on_drained
        self.cluster = cluster
        self.base = base  # read for its thresholds, health, evictions and drains only
        self.busy_utilization = base.thresholds.busy_utilization
        self.block_foreign = config.thresholds.foreign_processes == "block"
        self.memory: dict[float, np.ndarray] = {}
        self.unhealthy: list | None = None
        self.ones = np.ones(n, dtype=bool)
        self.zeros = np.zeros(n, dtype=bool)
        _frozen(self.ones, self.zeros)
        self._healthy: dict[int, tuple[np.ndarray, int, np.ndarray]] = {}
        self.primary: dict[PlanRequest, list] = {}  # request -> each pool's refusal (_UNASKED: not yet)
        # the last mask's arrays (patched in place for the next mask, which differs from it only
        # where an admission or a claim changed it: the KeptPlans' lock is held meanwhile)
        self._now: _Now | None = None
        self._offsets: _Offsets | None = None
        self._idle: tuple[np.ndarray, dict] | None = None  # see idle_slice
        self.lock = lock
        if like is not None:
            self._healthy, self.unhealthy, self._offsets = like._healthy, like.unhealthy, like._offsets

    def now(self, mask: np.ndarray) -> _Now:
        """The arrays of ``mask``: the last mask's, patched in place where ``mask`` differs."""
        last = self._now
        if last is None:
            got = self._fresh(mask)
        else:
            changed = np.flatnonzero(mask != last.mask)
            if not len(changed):
                return last
            if len(changed) <= len(mask) // 8 and last._arrays is not None:
                got = self._patched(last, mask, changed)
            else:
                got = self._fresh(mask)
        self._now = got
        return got

    def computed(self, mask: np.ndarray) -> tuple:
        """The load, busy, outside and available arrays of ``mask`` (read-only, new)."""
        c = self.cluster
        load = c.base_load.copy()
        load[mask] = 1.0
        busy = load > self.busy_utilization
        outside = c.has_processes & ~mask if self.block_foreign else self.zeros  # never patched then
        avail = self.usable & ~mask & ~busy & ~outside
        _frozen(load, busy, outside, avail)
        return load, busy, outside, avail

    def _fresh(self, mask: np.ndarray) -> _Now:
        mask = mask.copy()
        local, slices = {}, []
        for i, p in enumerate(self.cluster.pools):
            local[(i, "mask")] = part = mask[p.positions]
            _frozen(part)
            slices.append(np.packbits(part).tobytes())
        return _Now(self, mask, slices, self.computed(mask), local)

    def _patched(self, last: _Now, mask: np.ndarray, changed: np.ndarray) -> _Now:
        """``_fresh(mask)``, computed at the ``changed`` positions only, in the last mask's arrays
        (every array is the same elementwise formula of the mask, so the other positions keep
        their values); ``last`` no longer owns them."""
        c = self.cluster
        arrays = last._arrays
        last._arrays = None
        load, busy, outside, avail = arrays
        m = mask[changed]
        for a in (load, busy, outside, avail) if self.block_foreign else (load, busy, avail):
            a.flags.writeable = True
        try:
            ld = np.where(m, 1.0, c.base_load[changed])
            bz = ld > self.busy_utilization
            load[changed], busy[changed] = ld, bz
            ok = self.usable[changed] & ~m & ~bz
            if self.block_foreign:
                out = c.has_processes[changed] & ~m
                outside[changed] = out
                ok &= ~out
            avail[changed] = ok
        finally:
            _frozen(load, busy, outside, avail)
        pool_of = c.pool_of[changed]
        touched = set(pool_of.tolist())
        local = {k: v for k, v in last.local.items() if k[0] not in touched}  # the other pools' slices hold
        now = _Now(self, mask.copy(), list(last.slices), arrays, local)
        for i in touched:  # the touched pools' slices: the last ones, patched where the mask changed
            self._patch_slices(now, last.local, i, changed[pool_of == i])
        return now

    def _patch_slices(self, now: _Now, before: dict, i: int, changed: np.ndarray) -> None:
        """Pool ``i``'s slices of the arrays in ``before`` (the last mask's), as they are under
        ``now`` (whose arrays are patched): copies, written at the ``changed`` positions (its own)."""
        offsets = self.offsets()
        at = offsets.pool[changed]
        mask = before.get((i, "mask"))
        if mask is None:
            mask = now.mask[self.cluster.pools[i].positions]
        else:
            mask = mask.copy()
            mask[at] = now.mask[changed]
        _frozen(mask)
        now.local[(i, "mask")] = mask
        now.slices[i] = np.packbits(mask).tobytes()  # the pool's part of every kept report's key
        avail = now.avail[changed]
        for mib in (None, *self.memory):
            got = before.get((i, mib))
            if got is not None:
                old, count = got
                new = old.copy()
                new[at] = avail if mib is None else avail & self.memory[mib][changed]
                _frozen(new)
                now.local[(i, mib)] = (new, count + int(new[at].sum()) - int(old[at].sum()))
        loads = before.get((i, "loads"))
        if loads is not None:
            h = offsets.healthy[changed]
            if (h >= 0).any():
                loads = loads.copy()
                loads[h[h >= 0]] = now.load[changed[h >= 0]]
                _frozen(loads)
            now.local[(i, "loads")] = loads

    def idle_slice(self, idle: np.ndarray, i: int) -> bytes:
        """Pool ``i``'s packed slice of a target question's ``idle`` mask (kept for the last mask:
        the questions on one released copy ask with the same one)."""
        last = self._idle
        if last is None or not np.array_equal(last[0], idle):
            last = self._idle = (idle.copy(), {})
        got = last[1].get(i)
        if got is None:
            got = last[1][i] = np.packbits(idle[self.cluster.pools[i].positions]).tobytes()
        return got

    def offsets(self) -> "_Offsets":
        """Each GPU's place in its pool's positions, and in its pool's healthy positions (-1: not
        healthy): where a pool's slice holds it."""
        got = self._offsets
        if got is None:
            n = len(self.cluster.gpus)
            pool, healthy = np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64)
            for i, p in enumerate(self.cluster.pools):
                pool[p.positions] = np.arange(len(p.positions))
                where = self._healthy_of(i)[2]
                healthy[where] = np.arange(len(where))
            got = self._offsets = _Offsets(pool, healthy)
        return got

    def memory_ok(self, mib) -> np.ndarray | None:
        if not mib:
            return None
        ok = self.memory.get(mib)
        if ok is None:
            with np.errstate(invalid="ignore"):
                ok = self.memory[mib] = self.cluster.memory_free >= mib  # unknown (nan) is not enough
            _frozen(ok)
        return ok

    def available(self, now: _Now, mib) -> np.ndarray:
        if not mib:
            return now.avail
        got = now.available.get(mib)
        if got is None:
            got = now.available[mib] = now.avail & self.memory_ok(mib)
            _frozen(got)
        return got

    def state(self, request: PlanRequest, reserved: Mapping[GpuKey, str], now: _Now) -> ClusterState:
        """cluster_state(cluster, request, reserved, reserved_mask=now.mask, ...), array for array."""
        b = self.base
        memory_ok = self.memory_ok(request.gpu_memory_mib)
        return ClusterState(self.cluster, request, b.thresholds, reserved, b.evicted, now.mask, b.healthy, now.load,
                            now.busy, self.ones if memory_ok is None else memory_ok,
                            self.available(now, request.gpu_memory_mib), now.outside, b.drained, b.on_drained)

    def _healthy_of(self, i: int) -> tuple[np.ndarray, int, np.ndarray]:
        """Pool ``i``'s healthy GPUs (a mask over its positions, their count, their positions)."""
        got = self._healthy.get(i)
        if got is None:
            pool = self.cluster.pools[i]
            mask = self.base.healthy[pool.positions]
            _frozen(mask)
            got = self._healthy[i] = (mask, int(mask.sum()), pool.positions[mask])
        return got

    def _available_of(self, i: int, now: _Now, mib) -> tuple[np.ndarray, int]:
        """Pool ``i``'s available GPUs under ``now`` and memory ask ``mib`` (a mask, its count)."""
        got = now.local.get((i, mib))
        if got is None:
            a = self.available(now, mib)[self.cluster.pools[i].positions]
            _frozen(a)
            got = now.local[(i, mib)] = (a, int(a.sum()))
        return got

    def counts(self, i: int, now: _Now, mib) -> tuple[int, int]:
        """Pool ``i``'s healthy and available GPUs (a report's counts)."""
        return self._healthy_of(i)[1], self._available_of(i, now, mib)[1]

    def view(self, i: int, state: ClusterState, now: _Now) -> PoolView:
        """Pool ``i``'s view of ``state`` (``now``'s), with a cache shared by the views of every
        request with the same memory ask under ``now`` (what a view keeps depends on the pool's
        GPUs' state alone): the pool's slices of the arrays, gathered once, and what the filters,
        candidates and scorers keep there."""
        mib = state.request.gpu_memory_mib or None
        cache = now.local.get((i, "view", mib))
        if cache is None:
            healthy = self._healthy_of(i)
            avail = self._available_of(i, now, mib)
            loads = now.local.get((i, "loads"))
            if loads is None:
                loads = now.local[(i, "loads")] = now.load[healthy[2]]
                _frozen(loads)
            cache = now.local[(i, "view", mib)] = {"healthy": healthy[0], "#healthy": healthy[1], "available": avail[0],
                                                   "#available": avail[1], "healthy_loads": loads}
        return PoolView(self.cluster.pools[i], state, _cache=cache)


class _Call:
    """One question's inputs, to write a kept pool's reason when someone reads it."""

    __slots__ = ("parts", "request", "reserved", "now", "_state", "_of")

    def __init__(self, parts: _Parts, request, reserved, now: _Now) -> None:
        self.parts, self.request, self.reserved, self.now = parts, request, reserved, now
        self._state: ClusterState | None = None
        self._of: tuple | None = None  # the arrays the state was built on

    def state(self) -> ClusterState:
        arrays = self.now.arrays()
        if self._state is None or self._of is not arrays:  # built again once the arrays moved on
            self._state, self._of = self.parts.state(self.request, self.reserved, self.now), arrays
        return self._state

    def reason(self, pool) -> str | None:
        with self.parts.lock:  # another question may be patching the arrays
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
        self._lock = threading.RLock()  # one question at a time: the arrays are patched in place

    def forget(self) -> None:
        """Drop every kept report (the next questions are answered from scratch)."""
        with self._lock:
            self._kept.clear()
            self._parts.clear()

    def parts(self, cluster: Cluster) -> _Parts:
        got = self._parts.get(id(cluster))
        if got is None or got.cluster is not cluster:
            like = None
            if cluster is not self.cluster:  # a released copy: keep the latest one only
                self._parts = {k: v for k, v in self._parts.items() if v.cluster is self.cluster}
                main = self._parts.get(id(self.cluster))
                c = self.cluster
                if main is not None and cluster.gpus is c.gpus and cluster.healthy is c.healthy \
                        and cluster.schedulable is c.schedulable and cluster.pools is c.pools:
                    like = main
            got = self._parts[id(cluster)] = _Parts(cluster, self.evicted, self.config, self.drained, self._lock,
                                                    like)
        return got

    def plan(self, request: PlanRequest, reserved: Mapping[GpuKey, str], mask: np.ndarray, *,
             cluster: Cluster | None = None, idle: np.ndarray | None = None) -> PlanResult:
        """The plan for ``request`` with the GPUs in ``mask`` reserved (``reserved`` names their
        holders) on ``cluster`` (default: the kept one; a copy of it with the ``idle`` GPUs
        released, for a target question: then ``idle`` is part of each pool's key)."""
        with self._lock:
            return self._plan(request, reserved, mask, cluster, idle)

    def _plan(self, request: PlanRequest, reserved: Mapping[GpuKey, str], mask: np.ndarray,
              cluster: Cluster | None, idle: np.ndarray | None) -> PlanResult:
        cluster = cluster if cluster is not None else self.cluster
        check_mig_request(cluster, request)  # a mistake, refused as plan() refuses it
        parts = self.parts(cluster)
        kept, released = self._kept, idle is not None
        reports: list[PoolReport] = []
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (len(cluster.gpus),):
            raise ValueError(f"reserved_mask: expected {len(cluster.gpus)} entries, got {mask.shape}")
        now = parts.now(mask)
        slices = now.slices
        call = _Call(parts, request, reserved, now)
        k, mib = request.gpus, request.gpu_memory_mib or None
        primary = parts.primary.get(request)
        if primary is None:
            if len(parts.primary) >= self.limit:
                parts.primary.clear()
            primary = parts.primary[request] = [_UNASKED] * len(cluster.pools)
        for i, pool in enumerate(cluster.pools):
            pos = pool.positions
            refused = primary[i]
            if refused is _UNASKED:  # the primary filters read the request, the pool and its health
                refused = primary[i] = first_failure(filters.PRIMARY, parts.view(i, call.state(), now))
            if refused is not None:
                healthy, available = parts.counts(i, now, mib)
                reports.append(PoolReport(pool.id, pool.card_type, pool.task_types, len(pos), healthy, available,
                                          "rejected", refused))
                continue
            # past them, a pool's report reads of the request only k and the memory asked
            key = (i, k, mib, slices[i], parts.idle_slice(idle, i) if released else None)
            row = kept.get(key)
            if row is None:
                state = call.state()
                rep = pool_report(pool, state, self.weights, explain=False, view=parts.view(i, state, now))
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
