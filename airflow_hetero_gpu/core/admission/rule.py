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
from airflow_hetero_gpu.core.admission.kept import KeptHeld
from airflow_hetero_gpu.core.admission.model import AdmissionResult, QueueEntry
from airflow_hetero_gpu.core.admission.order import DEFAULT_AGING_INTERVAL_S, check_aging, ordered
from airflow_hetero_gpu.core.admission.passstate import PassState
from airflow_hetero_gpu.core.admission.placer import Placer, PlannerPlacer
from airflow_hetero_gpu.core.admission.preemption import PassPreemption, PreemptionRules, RunningJob
from airflow_hetero_gpu.core.admission.rules.base import Ordering, Rule
from airflow_hetero_gpu.core.admission.rules.fair_share import FairShareOrder
from airflow_hetero_gpu.core.admission.rules.max_jobs import max_jobs_rule
from airflow_hetero_gpu.core.admission.rules.preemption import PreemptionRule
from airflow_hetero_gpu.core.admission.rules.queue_order import QueueOrder
from airflow_hetero_gpu.core.admission.rules.team_quota import QuotaInput, TeamQuotaRule
from airflow_hetero_gpu.core.admission.walk import walk_queue
from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.config import ClusterConfig
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.core.planner import cluster_state
from airflow_hetero_gpu.core.plankept import KeptPlans
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
        static = self._static(cluster, config, weights)
        self._base, self.loaded, self.host_pool, self._accepts, plans, self.kept_held = static
        self.placer = placer or PlannerPlacer(cluster, evicted=self.evicted, config=self.config, drained=self.drained,
                                              kept=plans)
        self.on_drained = self._base.on_drained
        self.healthy = self._base.healthy  # healthy and not evicted

    def _static(self, cluster: Cluster, config: ClusterConfig | None, weights) -> tuple:
        """What depends only on the cluster, its configuration, the evictions and the drained
        hosts: kept on the cluster object for the next pass over it with the same evictions and
        drains (the ledger keeps its cluster between passes), built here otherwise. The planner's
        pool reports (:class:`~airflow_hetero_gpu.core.plankept.KeptPlans`) are kept with them:
        each is keyed by its request and its pool's reserved GPUs, so a pass after a change finds
        the reports of the pools it did not touch; and the last pass's starting arrays and teams'
        holdings (:class:`~airflow_hetero_gpu.core.admission.kept.KeptHeld`), handed back while the
        reservations are equal to those they were computed from."""
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
        plans = KeptPlans(cluster, evicted=self.evicted, config=self.config, drained=self.drained)
        out = (base, loaded, np.where(mixed, -1, first), {}, plans, KeptHeld())
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
        ordering, rules = self._rules(p, now, reserved, explain, quotas, running, preemption)
        return walk_queue(self, p, ordering, rules, entries, now, explain=explain)

    def _rules(self, p: PassState, now: float, reserved, explain: bool, quotas: QuotaInput | None,
               running: Sequence[RunningJob], preemption: PreemptionRules | None) -> tuple[Ordering, list[Rule]]:
        """The pass's ordering and rules: only those that apply (no teams: no quota, fair-share or
        max_jobs rule; preemption off: no preemption rule)."""
        teams = quotas is not None and bool(quotas.teams)
        rules: list[Rule] = []
        ordering: Ordering = QueueOrder()
        borrowing, some_borrow, borrowing_many = None, False, None
        if teams:
            cap = max_jobs_rule(quotas.teams, quotas.team_of)
            rules += [cap] if cap is not None else []
            quota = TeamQuotaRule(self, p, quotas, reserved, explain=explain)
            rules.append(quota)
            ordering = FairShareOrder(quotas.team, quota.book.fair_share)
            borrowing, some_borrow, borrowing_many = quota.borrows, bool(quota.over), quota.borrows_many
        if preemption is not None and running:
            rules.append(PreemptionRule(PassPreemption(running, preemption, now, self.aging, teams=teams,
                                                        borrowing=borrowing, some_borrow=some_borrow,
                                                        columns=self._columns,
                                                        borrowing_many=borrowing_many)))
        return ordering, rules

    def _columns(self, running: Sequence[RunningJob], build: bool = True):
        """The running jobs' columns kept with the cluster's state (``build`` False: None where
        none are kept for these very jobs, nothing built)."""
        return self.kept_held.columns(running, self.cluster, build=build)


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
