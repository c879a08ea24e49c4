"""One admission pass: which waiting jobs start now, and which GPUs are held for the heads.

The rule (docs/queue.md has it with a worked example):

1. The queue is walked in order (:mod:`~airflow_hetero_gpu.core.admission.order`: priority with
   aging, then time enqueued).
2. A job that no pool of the cluster as it is can ever hold (card type, task type, more GPUs than
   a pool has healthy: the planner's primary filters) is **impossible**: reported with the
   planner's reasons, it never claims and never blocks anyone.
3. Every other job **starts now** when the planner places it on GPUs that are neither held (live
   reservations, jobs admitted earlier in this pass) nor claimed for a head ahead of it; a head
   whose claim is on one host takes only a one-host answer (it waits for a host, not spanning).
4. A job that cannot start becomes the **head** of the pools it accepts that have no head yet and
   gets a **claim** there (:mod:`~airflow_hetero_gpu.core.admission.claims`): the GPUs ``plan()``
   gives it as if the jobs holding them had ended. No job behind it may start on a claimed GPU, so
   backfill never delays a head. A pool has one head at a time; a job whose pools all have a head
   waits behind them (it still starts at once wherever it fits outside the claims).
5. With ``preemption`` rules and the ``running`` jobs given, a job that cannot start may instead
   preempt running jobs of lower priority and claim the GPUs they free
   (:mod:`~airflow_hetero_gpu.core.admission.preemption`); ``result.preemptions`` lists them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

from airflow_hetero_gpu.core import filters
from airflow_hetero_gpu.core.admission import reasons
from airflow_hetero_gpu.core.admission.claims import claim_for
from airflow_hetero_gpu.core.admission.model import Admitted, AdmissionResult, QueueEntry, Waiting
from airflow_hetero_gpu.core.admission.order import (
    DEFAULT_AGING_INTERVAL_S, check_aging, effective_priority, ordered,
)
from airflow_hetero_gpu.core.admission.passstate import PassState, Shape
from airflow_hetero_gpu.core.admission.preemption import PassPreemption, PreemptionRules, RunningJob
from airflow_hetero_gpu.core.admission.placer import Placer, PlannerPlacer
from airflow_hetero_gpu.core.admission.teampass import QuotaInput, TeamWalk, quota_reason
from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.config import ClusterConfig
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.core.planner import cluster_state
from airflow_hetero_gpu.core.view import PoolView
from airflow_hetero_gpu.errors import RequestError


class Admission:
    """Admission on one cluster with one set of evictions; :meth:`run` is one pass.

    Build it once per cluster state (the ledger: once per transaction; the simulator: once per
    run) and call :meth:`run` with the queue and the live reservations. ``placer`` defaults to
    the planner (:class:`~airflow_hetero_gpu.core.admission.placer.PlannerPlacer`).
    """

    def __init__(self, cluster: Cluster, *, evicted: Mapping[GpuKey, Sequence[str]] | None = None,
                 config: ClusterConfig | None = None, weights: Mapping[str, float] | None = None,
                 aging_interval_s: float | None = DEFAULT_AGING_INTERVAL_S, placer: Placer | None = None,
                 drained: Mapping[str, str] | None = None) -> None:
        self.cluster = cluster
        self.drained = dict(drained or {})  # drained host -> reason: never placed on or claimed
        self.config = (config or cluster.config).with_weights(weights)
        self.evicted = {GpuKey(*k): tuple(v) for k, v in (evicted or {}).items()}
        self.aging = check_aging(aging_interval_s)
        self.placer = placer or PlannerPlacer(cluster, evicted=self.evicted, config=self.config, drained=self.drained)
        static = self._static(cluster, config, weights)
        self._base, self.loaded, self.host_pool, self._accepts = static
        self.on_drained = self._base.on_drained
        self.healthy = self._base.healthy  # healthy and not evicted

    def _static(self, cluster: Cluster, config: ClusterConfig | None, weights) -> tuple:
        """What depends only on the cluster, its configuration, the evictions and the drained
        hosts: kept on the cluster object for the next pass over it with the same evictions and
        drains (the ledger keeps its cluster between passes), built here otherwise."""
        key = None
        if (config is None or config is cluster.config) and not weights:
            key = (frozenset(self.evicted.items()), frozenset(self.drained.items()))
            owner, kept = cluster.__dict__.get("_admission_static", (None, None))
            if owner is not cluster:  # none yet, or a shallow copy's (with other loads): its own
                kept = {}
                cluster.__dict__["_admission_static"] = (cluster, kept)
            hit = kept.get(key)
            if hit is not None:
                return hit
        base = cluster_state(cluster, PlanRequest(1), {}, self.evicted, self.config, drained=self.drained)
        # loaded above the busy threshold by something the ledger does not know about (unless held)
        loaded = cluster.base_load > self.config.thresholds.busy_utilization
        if self.config.thresholds.foreign_processes == "block":  # in use outside the scheduler
            loaded = loaded | cluster.has_processes
        # each host's pool, -1 for a host without GPUs or with GPUs in several pools
        starts = cluster.host_start
        has_gpus = np.diff(starts) > 0
        first = np.full(len(cluster.hosts), -1, dtype=np.int64)
        first[has_gpus] = cluster.pool_of[starts[:-1][has_gpus]]
        mixed = np.zeros(len(cluster.hosts), dtype=bool)
        np.logical_or.at(mixed, cluster.host_of, cluster.pool_of != first[cluster.host_of])
        out = (base, loaded, np.where(mixed, -1, first), {})
        if key is not None:
            if len(kept) >= 8:  # evictions and drains come and go: keep the latest few
                kept.pop(next(iter(kept)))
            kept[key] = out
        return out

    def accepts(self, request: PlanRequest) -> tuple[np.ndarray, dict[str, str]]:
        """Which pools pass the planner's primary filters for ``request`` (a mask over
        ``cluster.pools``), and the first failing filter's reason for the others. Depends only on
        the cluster, the evictions and the drains, so it is kept with them (see :meth:`_static`)."""
        hit = self._accepts.get(request)
        if hit is None:
            state = dataclasses.replace(self._base, request=request)
            ok = np.zeros(len(self.cluster.pools), dtype=bool)
            why: dict[str, str] = {}
            for i, pool in enumerate(self.cluster.pools):
                view = PoolView(pool, state)
                reason = next((r for r in (f(view) for f in filters.PRIMARY) if r is not None), None)
                if reason is None:
                    ok[i] = True
                else:
                    why[pool.id] = reason
            hit = self._accepts[request] = (ok, why)
        return hit

    def run(self, queue: Sequence[QueueEntry], *, now: float, reserved: Mapping[GpuKey, str] | None = None,
            reserved_mask: np.ndarray | None = None, explain: bool = True, in_order: bool = False,
            quotas: QuotaInput | None = None, running: Sequence[RunningJob] = (),
            preemption: PreemptionRules | None = None) -> AdmissionResult:
        """Decide who starts now and what is claimed for the heads.

        ``reserved`` maps GPUs held by live reservations to their job id; ``reserved_mask``
        (optional) is the same as a boolean mask over ``cluster.gpus`` (then ``reserved`` only
        names holders). ``explain=False`` skips the reasons and lists only heads and impossible
        entries in ``waiting`` (the simulator). ``in_order=True``: the caller passes the queue
        already in queue order (the simulator keeps it sorted; nothing checks it). ``quotas``:
        the teams' quotas (docs/teams.md); None or no team configured: the pass without quotas.
        ``running`` (the jobs holding GPUs) and ``preemption`` (its rules; None: off) turn
        preemption on (docs/preemption.md).
        """
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            raise RequestError(f"now: expected seconds, got {now!r}")
        entries = list(queue) if in_order else ordered(queue, self.aging)
        p = PassState(self, reserved, reserved_mask)
        teams = quotas is not None and bool(quotas.teams)
        pre = (PassPreemption(running, preemption, now, self.aging, teams=teams)
               if preemption is not None and running else None)
        if teams:
            result = self._run_teams(now, entries, p, reserved, quotas, explain, pre)
            return pre.annotate(result) if pre else result
        shapes: dict[int, Shape] = {}  # id(request) -> what this pass learnt about it
        by_value: dict[PlanRequest, Shape] = {}
        admitted: list[Admitted] = []
        waiting: list[tuple] = []  # (position, entry, state, claim, shape, heads it waits behind)
        position = 0  # among the jobs that keep waiting
        # without reasons the walk may stop once nothing behind can start or claim: every request
        # still to come is known dead and no entry still to come holds a claim
        unseen = set() if explain else {id(e.request) for e in entries}
        claims_left = 0 if explain else sum(1 for e in entries if e.claim)
        live: set[int] = set()  # ids of the shapes seen that are not dead (impossible ones stay)
        for rank, entry in enumerate(entries, 1):
            shape = shapes.get(id(entry.request))
            if shape is None:
                shape = by_value.get(entry.request)
                if shape is None:
                    shape = by_value[entry.request] = Shape(entry.request, *self.accepts(entry.request))
                shapes[id(entry.request)] = shape
                if not explain:
                    unseen.discard(id(entry.request))
                    if not shape.dead:
                        live.add(id(shape))
            if not explain:
                if entry.claim:
                    claims_left -= 1
                elif not unseen and not live and not claims_left:
                    break
            if shape.dead and not entry.claim:
                position += 1
                if explain:
                    waiting.append((position, entry, "waiting", None, shape, p.heads_for(shape.ok)))
                continue
            if not shape.ok.any():
                position += 1
                waiting.append((position, entry, "impossible", None, shape, []))
                continue
            placement = p.try_start(entry, shape)
            if placement is not None:
                p.admit(entry.job_id, placement.gpus)
                pool = placement.pool or self.cluster.pool_of_gpu(placement.gpus[0]).id
                decision = placement.result.decision if placement.result is not None else None
                admitted.append(Admitted(entry.job_id, rank, tuple(placement.gpus), pool, decision))
                continue
            position += 1
            claim = (pre.claim(p, entry, shape) if pre else None) or claim_for(p, entry, shape)
            if claim is not None:
                waiting.append((position, entry, "head", claim, shape, []))
                continue
            shape.dead = True  # for good in this pass: held and claimed GPUs only grow
            live.discard(id(shape))
            if explain:
                waiting.append((position, entry, "waiting", None, shape, p.heads_for(shape.ok)))
        result = self._result(now, entries, admitted, waiting, p, explain)
        return pre.annotate(result) if pre else result

    def _run_teams(self, now: float, entries, p: PassState, reserved, quotas: QuotaInput,
                   explain: bool, pre: PassPreemption | None = None) -> AdmissionResult:
        """The pass with quotas (:mod:`~airflow_hetero_gpu.core.admission.teampass`)."""
        by_value: dict[PlanRequest, Shape] = {}

        def shape_of(entry: QueueEntry) -> Shape:
            shape = by_value.get(entry.request)
            if shape is None:
                shape = by_value[entry.request] = Shape(entry.request, *self.accepts(entry.request))
            return shape

        walk = TeamWalk(self, p, quotas, reserved, explain, pre)
        walk.walk(entries, shape_of)
        result = self._result(now, entries, walk.admitted, walk.waiting, p, explain)
        if explain:  # the simulator (explain=False) does not read the standing
            result.teams = walk.book.standing(walk.waiting_gpus)
        return result

    def _result(self, now: float, entries, admitted, waiting, p: PassState, explain: bool) -> AdmissionResult:
        out: list[Waiting] = []
        pool_ids = [pool.id for pool in self.cluster.pools]
        ahead = np.zeros(len(pool_ids), dtype=np.int64)  # waiting jobs so far that accept each pool
        for position, entry, state, claim, shape, heads, *note in waiting:
            kind, extra = note[0] if note else ("note", "")
            text = ""
            if explain and kind == "quota":
                text = quota_reason(position, extra)
            elif explain:
                if state == "impossible":
                    text = reasons.impossible(entry.request, shape.rejected)
                elif state == "head":
                    text = reasons.head(position, claim)
                else:
                    single = pool_ids[int(np.flatnonzero(shape.ok)[0])] if int(shape.ok.sum()) == 1 else None
                    pool_pos = int(ahead[shape.ok].max()) + 1 if single else None
                    text = reasons.waiting(position, heads, single, pool_pos, shape.why_not, shape.no_target)
                if extra:
                    text += f"; {extra}"
            if explain and state != "impossible":
                ahead[shape.ok] += 1
            out.append(Waiting(entry.job_id, position, state, text, effective_priority(entry, now, self.aging),
                               claim, tuple(h.job_id for h in heads)))
        return AdmissionResult(now, admitted, out, entries)


def admit(cluster: Cluster, queue: Sequence[QueueEntry], *, now: float,
          reserved: Mapping[GpuKey, str] | None = None, evicted: Mapping[GpuKey, Sequence[str]] | None = None,
          config: ClusterConfig | None = None, weights: Mapping[str, float] | None = None,
          aging_interval_s: float | None = DEFAULT_AGING_INTERVAL_S, explain: bool = True,
          quotas: QuotaInput | None = None, drained: Mapping[str, str] | None = None,
          running: Sequence[RunningJob] = (), preemption: PreemptionRules | None = None) -> AdmissionResult:
    """One admission pass with the planner (the product's call): see :class:`Admission`."""
    adm = Admission(cluster, evicted=evicted, config=config, weights=weights, aging_interval_s=aging_interval_s,
                    drained=drained)
    return adm.run(queue, now=now, reserved=reserved, explain=explain, quotas=quotas, running=running,
                   preemption=preemption)
