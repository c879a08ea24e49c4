"""The discrete-event simulator: jobs arrive, wait in a queue, start when a policy places them,
and hold their GPUs until they end.

Events are job arrivals and job ends, processed in time order; at one instant ends come first
(their GPUs are free again), then arrivals join the queue, then the queue is served by one of the
disciplines of :mod:`airflow_hetero_gpu.sim.disciplines`:

* ``admission`` (default): the product's queue, :class:`~airflow_hetero_gpu.core.admission.Admission`
  with the policy as its placer: priority with aging, backfill outside the GPUs claimed for the
  heads (docs/queue.md); jobs that arrive at the same instant are ordered by job id, as in
  the product;
* ``fifo``: first in, first out; the head is offered to the policy when some allowed card type
  has enough free GPUs, and while it waits so does everyone behind it, except that with
  ``backfill = B > 0`` up to ``B`` jobs behind it are tried (no reservation for the head);
* ``greedy``: every waiting job that fits starts, in arrival order (the product before its queue:
  each waiting task took whatever fitted when it looked).

Gang, all or nothing: a job starts on exactly its ``gpus`` GPUs or not at all, and keeps them
until it ends. Its run time is the trace's duration times a slowdown for the distance between
its GPUs, ``1 + comm_cost * (d(S) - 1)`` (:func:`run_time`; ``comm_cost = 0`` replays the trace's
durations as they are). A job that asks for more GPUs than its card types have in all can
never start and is rejected at the outset (reported, not queued).

With ``preemption`` (the admission queue only) each pass may stop running jobs for a waiting
one (:mod:`airflow_hetero_gpu.sim.preempt`): a victim frees its GPUs when its grace ends (a
*stop* event, after the ends of that instant), goes back to the queue with its original arrival
and later runs only the work it had not checkpointed.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.core.admission import DEFAULT_AGING_INTERVAL_S
from airflow_hetero_gpu.sim.disciplines import QUEUES, make_queue
from airflow_hetero_gpu.sim.policies.base import BasePolicy, Policy
from airflow_hetero_gpu.sim.preempt import Preempter, SimPreemption
from airflow_hetero_gpu.sim.state import ClusterView
from airflow_hetero_gpu.sim.trace import Job

_END, _STOP, _ARRIVAL, _TICK = 0, 1, 2, 3


@dataclass
class JobRecord:
    """What happened to one job."""

    id: str
    gpus: int
    arrival: float
    start: float
    end: float
    keys: tuple[GpuKey, ...]
    hosts: int
    distance: float  # d(S) of its GPUs, SPEC §5
    one_host_possible: bool  # some allowed host had job.gpus free GPUs when it started
    decision_s: float  # time spent in policy.place for this job, all attempts
    attempts: int
    duration: float = 0.0  # the trace's run time (end - start is it times the slowdown)
    card_type: str = ""
    team: str = ""
    priority: int = 0
    borrowed: int = 0  # GPUs above its team's quota when it (last) started (with teams; docs/teams.md)
    preemptions: int = 0  # times it was preempted (start: its first start, end: its last end)
    lost_gpu_s: float = 0.0  # GPU-seconds of work lost to them

    @property
    def wait(self) -> float:
        return self.start - self.arrival


@dataclass
class SimResult:
    """One policy's run over one trace."""

    policy: str
    total_gpus: int
    records: list[JobRecord]
    rejected: list[tuple[str, str]]  # (job id, why)
    times: np.ndarray  # event instants
    allocated: np.ndarray  # GPUs held after the events of that instant
    queued: np.ndarray  # jobs waiting after the events of that instant
    decision_s: np.ndarray  # every policy.place call's duration
    wall_s: float = 0.0
    backfill: int = 0
    comm_cost: float = 0.0
    queue: str = "admission"
    extra: dict = field(default_factory=dict)
    events: list = field(default_factory=list)  # (time_s, event, job_id, gpus, detail)


class PolicyError(RuntimeError):
    """A policy answered something that is not a valid gang placement."""


def run_time(duration: float, distance: float, gpus: int, comm_cost: float) -> float:
    """The run time of a job on GPUs ``distance`` apart (d(S), SPEC §5).

    The trace's duration is taken as the run time on an all-NVLink set (d = 1); each unit of
    mean distance above that adds ``comm_cost`` of it, a crude stand-in for the share of a
    training step spent in collective communication, whose time grows with path length
    (PCIe d = 2..6, between hosts 10 x switch tier). One-GPU jobs do not communicate.
    """
    if gpus <= 1 or comm_cost == 0:
        return duration
    return duration * (1.0 + comm_cost * max(0.0, distance - 1.0))


def _check(view: ClusterView, job: Job, keys: Sequence[tuple[str, int]], policy: str) -> None:
    if len(keys) != job.gpus:
        raise PolicyError(f"{policy}: job {job.id} asked for {job.gpus} GPUs, got {len(keys)}")
    try:
        pos = view.positions(keys)
    except KeyError as err:
        raise PolicyError(f"{policy}: job {job.id}: unknown GPU {err}") from None
    if len(set(pos.tolist())) != len(pos) or not view.free[pos].all():
        raise PolicyError(f"{policy}: job {job.id}: GPUs not free or repeated: {[str(GpuKey(*k)) for k in keys]}")
    models = set(view.host_model_id[view.host_of[pos]].tolist())
    if len(models) != 1 or not view.allowed_models(job.gpu_types)[models.pop()]:
        raise PolicyError(f"{policy}: job {job.id}: GPUs of a card type it may not use, or of several")


class Run:
    """The state of one replay; the queue disciplines call :meth:`place` and :meth:`start`."""

    def __init__(self, cluster: Cluster, jobs: Sequence[Job], policy: Policy, *, comm_cost: float,
                 span: str, check: bool, preemption: SimPreemption | None = None) -> None:
        self.cluster, self.jobs, self.policy = cluster, jobs, policy
        self.comm_cost, self.span, self.check = comm_cost, span, check
        self.view = ClusterView(cluster)
        self.index = {job.id: i for i, job in enumerate(jobs)}
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = len(jobs)
        self.records: dict[int, JobRecord] = {}
        self.spent = [0.0] * len(jobs)
        self.attempts = [0] * len(jobs)
        self.calls: list[float] = []
        self.one_host_seen: dict[int, bool] = {}  # whether one host had room, as the job last saw it
        self._host_max: dict[tuple[str, ...], int] = {}
        self.preempt = Preempter(preemption)
        self.end_seq: dict[int, int] = {}  # running job -> the seq of its live end event
        self.now = -math.inf

    def wake(self, at: float) -> None:
        """An admission pass at ``at`` (when a preemption may become allowed: a preemptor's delay
        or a running job's minimum run time passes), unless that is not in the future."""
        if at > self.now and math.isfinite(at):
            heapq.heappush(self.heap, (at, _TICK, self.seq, -1))
            self.seq += 1

    def one_host_only(self, job: Job) -> bool:
        """``span="never"`` and some allowed host is large enough for the whole job."""
        if self.span != "never":
            return False
        if job.gpu_types not in self._host_max:
            mask = self.view.allowed_hosts(job.gpu_types)
            self._host_max[job.gpu_types] = int(self.view.host_capacity[mask].max()) if mask.any() else 0
        return job.gpus <= self._host_max[job.gpu_types]

    def fits(self, view: ClusterView, job: Job) -> bool:
        if self.one_host_only(job):
            return view.one_host_fits(job.gpus, job.gpu_types)
        return view.fits(job.gpus, job.gpu_types)

    def place(self, i: int, view: ClusterView) -> tuple[GpuKey, ...] | None:
        """Ask the policy for job ``i``'s GPUs in ``view`` (the job must fit it); timed and checked."""
        job = self.jobs[i]
        t0 = time.perf_counter()
        keys = self.policy.place(view, job)
        dt = time.perf_counter() - t0
        self.calls.append(dt)
        self.spent[i] += dt
        self.attempts[i] += 1
        if keys is None or (self.one_host_only(job) and len({k[0] for k in keys}) > 1):
            return None
        if self.check:
            _check(view, job, keys, self.policy.name)
        return tuple(sorted(GpuKey(*k) for k in keys))

    def start(self, i: int, keys: Sequence[GpuKey], now: float, one_host: bool) -> None:
        job = self.jobs[i]
        self.view.allocate(job.id, keys)
        distance = self.cluster.mean_distance(keys)
        slow = run_time(1.0, distance, job.gpus, self.comm_cost)
        end = now + self.preempt.remaining(i, job.duration) * slow
        heapq.heappush(self.heap, (end, _END, self.seq, i))
        self.end_seq[i] = self.seq
        self.seq += 1
        first = self.records.get(i)
        self.records[i] = JobRecord(
            job.id, job.gpus, job.arrival, first.start if first else now, end, tuple(keys),
            len({k.host for k in keys}), distance, one_host or job.gpus == 1, self.spent[i], self.attempts[i],
            job.duration, self.cluster.gpu(keys[0]).name, job.team, job.priority,
        )
        self.preempt.on_start(i, job.id, job.gpus, now, slow)
        if self.preempt.on:
            self.wake(now + self.preempt.settings.rules.min_runtime_s)

    def signal(self, victim: str, preemptor: str, now: float) -> None:
        """The admission pass chose ``victim`` for ``preemptor``: it stops when its grace ends."""
        i = self.index[victim]
        at = self.preempt.signal(i, self.jobs[i], preemptor, now)
        heapq.heappush(self.heap, (at, _STOP, self.seq, i))
        self.seq += 1

    def stop(self, i: int, now: float) -> bool:
        """A victim's grace ended: it frees its GPUs (False: it had ended first)."""
        if not self.preempt.stop(i, self.jobs[i], now):
            return False
        self.end_seq.pop(i, None)
        self.view.release(self.jobs[i].id)
        return True

    def end(self, i: int, seq: int, now: float) -> bool:
        """Job ``i``'s end event: False when it is stale (the run it ended was preempted)."""
        if self.end_seq.get(i) != seq:
            return False
        del self.end_seq[i]
        self.view.release(self.jobs[i].id)
        self.preempt.on_end(i, self.jobs[i].id, self.jobs[i].gpus, now)
        return True

    def try_start(self, i: int, now: float) -> bool:
        """Place job ``i`` on the free GPUs and start it (the FIFO and greedy disciplines)."""
        job = self.jobs[i]
        if not self.fits(self.view, job):
            return False
        one_host = job.gpus > 1 and self.view.one_host_fits(job.gpus, job.gpu_types)
        keys = self.place(i, self.view)
        if keys is None:
            return False
        self.start(i, keys, now, one_host)
        return True


def simulate(cluster: Cluster, jobs: Sequence[Job], policy: Policy, *, queue: str = "admission",
             backfill: int = 0, aging_interval_s: float | None = DEFAULT_AGING_INTERVAL_S,
             comm_cost: float = 0.0, span: str = "as-needed", check: bool = True, teams=None,
             preemption: SimPreemption | None = None) -> SimResult:
    """Replay ``jobs`` on ``cluster`` with ``policy``; deterministic for a deterministic policy.

    ``backfill`` applies to ``queue="fifo"`` only; ``aging_interval_s``, ``teams`` (the quotas
    of :mod:`~airflow_hetero_gpu.core.admission.quota`, docs/teams.md) and ``preemption`` (None:
    off) to ``"admission"`` only.
    """
    if queue not in QUEUES:
        raise ValueError(f"queue: expected one of {', '.join(QUEUES)}, got {queue!r}")
    if backfill and queue != "fifo":
        raise ValueError(f"backfill: only the fifo queue backfills a number of jobs, got queue {queue!r}")
    if preemption is not None and queue != "admission":
        raise ValueError(f"preemption: only the admission queue preempts, got queue {queue!r}")
    started = time.perf_counter()
    run = Run(cluster, jobs, policy, comm_cost=comm_cost, span=span, check=check, preemption=preemption)
    view = run.view
    if isinstance(policy, BasePolicy):
        policy.prepare(view, jobs)
    rejected: list[tuple[str, str]] = []
    for i, job in enumerate(jobs):
        cap = view.capacity_for(job.gpu_types)
        if job.gpus > cap:
            types = "|".join(job.gpu_types) or "any"
            rejected.append((job.id, f"asks for {job.gpus} GPUs of {types}; the largest allowed card type has {cap}"))
            continue
        heapq.heappush(run.heap, (job.arrival, _ARRIVAL, i, i))
    waiting = make_queue(queue, run, backfill=backfill, aging_interval_s=aging_interval_s, teams=teams)
    times: list[float] = []
    allocated: list[int] = []
    queued: list[int] = []
    heap = run.heap
    while heap:
        now = run.now = heap[0][0]
        while heap and heap[0][0] == now:
            _, kind, seq, i = heapq.heappop(heap)
            if kind == _END:
                run.end(i, seq, now)
            elif kind == _STOP:
                if run.stop(i, now):
                    waiting.add(i)  # back in the queue with its original arrival and priority
            elif kind == _TICK:
                pass
            else:
                waiting.add(i)
        waiting.serve(now)
        times.append(now)
        allocated.append(view.allocated)
        queued.append(len(waiting))
    if len(waiting):  # cannot happen: every queued job fits an empty cluster and ends free GPUs
        raise AssertionError(f"{len(waiting)} jobs left in the queue")
    for i, rec in run.records.items():
        rec.preemptions, rec.lost_gpu_s = run.preempt.count.get(i, 0), run.preempt.lost.get(i, 0.0)
    ordered = [run.records[i] for i in sorted(run.records)]
    return SimResult(
        policy=policy.name, total_gpus=view.total_gpus, records=ordered, rejected=rejected,
        times=np.array(times), allocated=np.array(allocated), queued=np.array(queued),
        decision_s=np.array(run.calls), wall_s=time.perf_counter() - started, backfill=backfill,
        comm_cost=comm_cost, queue=queue, extra={"teams": bool(teams)} if teams else {},
        events=run.preempt.events,
    )
