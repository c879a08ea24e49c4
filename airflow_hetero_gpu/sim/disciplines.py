"""The simulator's queue disciplines: how waiting jobs are offered to the placement policy.

* :class:`AdmissionQueue` (``admission``, the default): the product's admission function
  (:class:`~airflow_hetero_gpu.core.admission.Admission`) with the policy behind a
  :class:`PolicyPlacer`, so every policy, baselines included, runs under the product's queue;
* :class:`FifoQueue` (``fifo``): strict first in, first out, optionally trying ``backfill`` jobs
  behind a waiting head (no reservation for it);
* ``greedy``: a :class:`FifoQueue` that tries every waiting job in arrival order.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Mapping, Protocol, Sequence

import numpy as np

from airflow_hetero_gpu.core.admission import Admission, Placement, QueueEntry, QuotaInput, Teams, rank_key
from airflow_hetero_gpu.core.admission.quota import DEFAULT_TEAM, decay, team_use
from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.sim import QUEUES
from airflow_hetero_gpu.sim.state import ClusterView
from airflow_hetero_gpu.sim.trace import Job

class Replay(Protocol):
    """What a discipline needs of the simulator's run (``engine.Run``)."""

    records: dict
    cluster: Cluster
    jobs: Sequence[Job]
    view: ClusterView
    index: Mapping[str, int]
    one_host_seen: dict[int, bool]

    def fits(self, view: ClusterView, job: Job) -> bool: ...  # pragma: no cover - protocol

    def place(self, i: int, view: ClusterView) -> tuple[GpuKey, ...] | None: ...  # pragma: no cover

    def start(self, i: int, keys: Sequence[GpuKey], now: float, one_host: bool) -> None: ...  # pragma: no cover

    def try_start(self, i: int, now: float) -> bool: ...  # pragma: no cover


class FifoQueue:
    """First in, first out; ``backfill`` jobs behind a waiting head are tried (inf: all)."""

    def __init__(self, run: Replay, backfill: float = 0) -> None:
        self.run = run
        self.backfill = backfill
        self.queue: list[int] = []

    def __len__(self) -> int:
        return len(self.queue)

    def add(self, i: int) -> None:
        self.queue.append(i)

    def serve(self, now: float) -> None:
        i, looked = 0, 0  # looked: jobs behind the head offered so far
        while i < len(self.queue):
            if i > 0:
                if looked >= self.backfill:
                    break
                looked += 1
            if self.run.try_start(self.queue[i], now):
                self.queue.pop(i)
                continue
            if self.backfill == 0:
                break
            i += 1


class PolicyPlacer:
    """A simulator policy as the admission function's placer: it sees a view where only the GPUs
    the pass allows are free (claimed ones hidden; for a target, held ones shown free)."""

    def __init__(self, run: Replay) -> None:
        self.run = run

    def __call__(self, entry: QueueEntry, blocked: np.ndarray, holders: Mapping[GpuKey, str],
                 idle: np.ndarray | None = None) -> Placement:
        run = self.run
        i = run.index[entry.job_id]
        job = run.jobs[i]
        view = run.view.masked(~blocked)
        if not run.fits(view, job):
            return Placement()
        if idle is None:
            run.one_host_seen[i] = job.gpus > 1 and view.one_host_fits(job.gpus, job.gpu_types)
        keys = run.place(i, view)
        return Placement(keys) if keys else Placement()


class AdmissionQueue:
    """The product's queue: one admission pass per event instant, claims kept between passes.

    With ``teams`` (docs/teams.md) the pass applies their quotas; the queue keeps what the ledger
    keeps: the team and card type of every running job, and each team's borrowed GPU-seconds
    decayed by the half-life (the fair-share history), where what a team borrows is computed
    from what its jobs hold now (:func:`~airflow_hetero_gpu.core.admission.quota.team_use`). With preemption on
    (the run's ``preempt``, docs/preemption.md) every pass sees the running jobs and the victims it
    decides are signalled through the run.
    """

    def __init__(self, run: Replay, aging_interval_s: float | None, teams: Teams | None = None) -> None:
        self.run = run
        self.aging = aging_interval_s
        self.teams = teams if teams else None
        self.team_of: dict[str, str] = {}  # running job -> team
        self.card_of: dict[str, str] = {}  # running job -> the card type it runs on
        self.pool_card = {pool.id: pool.card_type for pool in run.cluster.pools}
        self.history: dict[str, float] = {}  # team -> decayed borrowed GPU-seconds
        self.last = 0.0
        settings = getattr(run, "preempt", None)
        self.rules = settings.settings.rules if settings is not None and settings.on else None
        self.admission = Admission(run.cluster, placer=PolicyPlacer(run), aging_interval_s=aging_interval_s)
        self.entries: list[QueueEntry] = []  # in queue order
        self.keys: list[tuple] = []  # their rank keys, for bisect
        self.claimed: set[str] = set()  # jobs whose entry holds a claim
        self.by_id: dict[str, QueueEntry] = {}
        self._requests: dict[tuple, PlanRequest] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def _request(self, job: Job) -> PlanRequest:
        key = (job.gpus, job.gpu_types)
        req = self._requests.get(key)
        if req is None:
            types = job.gpu_types[0] if len(job.gpu_types) == 1 else (tuple(job.gpu_types) or None)
            req = self._requests[key] = PlanRequest(job.gpus, types)
        return req

    def add(self, i: int) -> None:
        job = self.run.jobs[i]
        entry = QueueEntry(job.id, self._request(job), job.priority, job.arrival, (),
                           (job.team or DEFAULT_TEAM) if self.teams else None)
        key = rank_key(entry, self.aging)
        at = bisect.bisect(self.keys, key)
        self.keys.insert(at, key)
        self.entries.insert(at, entry)
        self.by_id[job.id] = entry
        if self.rules is not None:
            self.run.wake(job.arrival + self.rules.delay_s)

    def _holding(self, job_id: str) -> tuple[GpuKey, ...]:
        view = self.run.view
        return tuple(view.key(p) for p in view.holding[job_id])

    def _running(self, now: float) -> list:
        """The running jobs for the pass's preemption rule, with the team each started under
        (teams off: no team, so any lower-priority job is a candidate); the pass works out which
        of them run on borrowed quota now."""
        run = self.run
        return [dataclasses.replace(r, team=self.team_of.get(r.job_id) if self.teams else None)
                for r in run.preempt.running(run.jobs, self._holding, now)]

    def _at(self, entry: QueueEntry) -> int:
        return bisect.bisect_left(self.keys, rank_key(entry, self.aging))

    def _age(self, now: float) -> None:
        """Bring the decayed borrowed GPU-seconds up to ``now`` (b GPUs borrowed over dt add
        b * h / ln 2 * (1 - 2^(-dt/h)), the integral of the decayed usage); b is what each team
        holds above its quota (:func:`~airflow_hetero_gpu.core.admission.quota.team_use`, from the
        jobs still holding GPUs), as the ledger counts it."""
        dt = now - self.last
        if dt <= 0 or self.teams is None:
            return
        holding = self.run.view.holding
        self.team_of = {j: t for j, t in self.team_of.items() if j in holding}
        h = self.teams.usage_half_life_s
        for team in list(self.history):
            self.history[team] = decay(self.history[team], dt, h)
        gain = h / math.log(2) * (1 - 0.5 ** (dt / h))
        usage: dict[tuple[str, str], int] = {}
        for job, team in self.team_of.items():
            key = (team, self.card_of[job])
            usage[key] = usage.get(key, 0) + len(holding[job])
        for team, use in team_use(self.teams, usage).items():
            if use.borrowed:
                self.history[team] = self.history.get(team, 0.0) + use.borrowed * gain
        self.last = now

    def serve(self, now: float) -> None:
        self._age(now)
        if not self.entries:
            return
        run = self.run
        view = run.view
        quotas = QuotaInput(self.teams, self.team_of, self.history) if self.teams else None
        running = self._running(now) if self.rules is not None else ()
        result = self.admission.run(self.entries, now=now, reserved=view.reserved, reserved_mask=~view.free,
                                    explain=False, in_order=True, quotas=quotas, running=running,
                                    preemption=self.rules)
        for pre in result.preemptions:
            for victim in pre.victims:
                run.signal(victim, pre.preemptor, now)
        claims = result.claims
        if not (result.admitted or self.claimed or claims):
            return
        by_id = self.by_id
        for a in result.admitted:
            i = run.index[a.job_id]
            run.start(i, a.gpus, now, run.one_host_seen.pop(i, False))
            if a.team is not None:
                self.team_of[a.job_id] = a.team
                self.card_of[a.job_id] = self.pool_card.get(a.pool, a.pool)
                if a.borrowed:  # how many it borrowed when it started (the report's; not the truth after)
                    run.records[i].borrowed = a.borrowed
            at = self._at(by_id.pop(a.job_id))
            del self.entries[at], self.keys[at]
        for job_id in self.claimed | set(claims):
            entry = by_id.get(job_id)
            if entry is None:
                continue  # started
            gpus = claims[job_id].gpus if job_id in claims else ()
            if entry.claim != gpus:
                by_id[job_id] = self.entries[self._at(entry)] = dataclasses.replace(entry, claim=gpus)
        self.claimed = set(claims)


def make_queue(name: str, run: Replay, *, backfill: int = 0, aging_interval_s: float | None = None,
               teams: Teams | None = None):
    if teams and name != "admission":
        raise ValueError(f"teams: only the admission queue applies quotas, got queue {name!r}")
    if name == "admission":
        return AdmissionQueue(run, aging_interval_s, teams)
    if name == "fifo":
        return FifoQueue(run, backfill)
    if name == "greedy":
        return FifoQueue(run, math.inf)
    raise ValueError(f"queue: expected one of {', '.join(QUEUES)}, got {name!r}")
