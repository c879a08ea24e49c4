"""The discrete-event simulator: jobs arrive, queue FIFO, start when a policy places them, and
hold their GPUs until they end.

Events are job arrivals and job ends, processed in time order; at one instant ends come first
(their GPUs are free again), then arrivals join the queue, then the queue is served:

* the queue is first in, first out: the head job is offered to the policy when some allowed
  card type has enough free GPUs; if the policy places it, it starts now and the next job is the
  head; otherwise the head waits;
* with ``backfill = B > 0``, when the head waits, up to ``B`` jobs behind it are tried in order
  and any that can be placed start now (no reservation for the head: a large head job can be
  overtaken repeatedly; ``B = 0`` is strict FIFO).

Gang, all or nothing: a job starts on exactly its ``gpus`` GPUs or not at all, and keeps them
until it ends. Its run time is the trace's duration times a slowdown for the distance between
its GPUs, ``1 + comm_cost * (d(S) - 1)`` (:func:`run_time`; ``comm_cost = 0`` replays the trace's
durations as they are). A job that asks for more GPUs than its card types have in all can
never start and is rejected at the outset (reported, not queued).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.sim.policies.base import BasePolicy, Policy
from airflow_hetero_gpu.sim.state import ClusterView
from airflow_hetero_gpu.sim.trace import Job

_END, _ARRIVAL = 0, 1


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
    extra: dict = field(default_factory=dict)


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


def simulate(cluster: Cluster, jobs: Sequence[Job], policy: Policy, *, backfill: int = 0,
             comm_cost: float = 0.0, span: str = "as-needed", check: bool = True) -> SimResult:
    """Replay ``jobs`` on ``cluster`` with ``policy``; deterministic for a deterministic policy."""
    started = time.perf_counter()
    view = ClusterView(cluster)
    if isinstance(policy, BasePolicy):
        policy.prepare(view, jobs)
    rejected: list[tuple[str, str]] = []
    heap: list[tuple[float, int, int, int]] = []
    for i, job in enumerate(jobs):
        cap = view.capacity_for(job.gpu_types)
        if job.gpus > cap:
            types = "|".join(job.gpu_types) or "any"
            rejected.append((job.id, f"asks for {job.gpus} GPUs of {types}; the largest allowed card type has {cap}"))
            continue
        heapq.heappush(heap, (job.arrival, _ARRIVAL, i, i))
    seq = len(jobs)
    queue: list[int] = []
    records: dict[int, JobRecord] = {}
    spent = [0.0] * len(jobs)
    attempts = [0] * len(jobs)
    calls: list[float] = []
    times: list[float] = []
    allocated: list[int] = []
    queued: list[int] = []

    host_max = {}

    def try_start(i: int, now: float) -> bool:
        job = jobs[i]
        one_host_only = False
        if span == "never":
            if job.gpu_types not in host_max:
                mask = view.allowed_hosts(job.gpu_types)
                host_max[job.gpu_types] = int(view.host_capacity[mask].max()) if mask.any() else 0
            one_host_only = job.gpus <= host_max[job.gpu_types]
        if one_host_only:
            if not view.one_host_fits(job.gpus, job.gpu_types):
                return False
        elif not view.fits(job.gpus, job.gpu_types):
            return False
        one_host = job.gpus > 1 and view.one_host_fits(job.gpus, job.gpu_types)
        t0 = time.perf_counter()
        keys = policy.place(view, job)
        dt = time.perf_counter() - t0
        calls.append(dt)
        spent[i] += dt
        attempts[i] += 1
        if keys is None or (one_host_only and len({k[0] for k in keys}) > 1):
            return False
        if check:
            _check(view, job, keys, policy.name)
        keys = tuple(sorted(GpuKey(*k) for k in keys))
        view.allocate(job.id, keys)
        distance = cluster.mean_distance(keys)
        end = now + run_time(job.duration, distance, job.gpus, comm_cost)
        nonlocal seq
        heapq.heappush(heap, (end, _END, seq, i))
        seq += 1
        records[i] = JobRecord(
            job.id, job.gpus, job.arrival, now, end, keys, len({k.host for k in keys}),
            distance, one_host or job.gpus == 1, spent[i], attempts[i], job.duration,
            cluster.gpu(keys[0]).name,
        )
        return True

    def serve(now: float) -> None:
        i, looked = 0, 0  # looked: jobs behind the head offered so far
        while i < len(queue):
            if i > 0:
                if looked >= backfill:
                    break
                looked += 1
            if try_start(queue[i], now):
                queue.pop(i)
                continue
            if backfill == 0:
                break
            i += 1

    while heap:
        now = heap[0][0]
        while heap and heap[0][0] == now:
            _, kind, _, i = heapq.heappop(heap)
            if kind == _END:
                view.release(jobs[i].id)
            else:
                queue.append(i)
        serve(now)
        times.append(now)
        allocated.append(view.allocated)
        queued.append(len(queue))
    if queue:  # cannot happen: every queued job fits an empty cluster and ends free GPUs
        raise AssertionError(f"{len(queue)} jobs left in the queue")
    ordered = [records[i] for i in sorted(records)]
    return SimResult(
        policy=policy.name, total_gpus=view.total_gpus, records=ordered, rejected=rejected,
        times=np.array(times), allocated=np.array(allocated), queued=np.array(queued),
        decision_s=np.array(calls), wall_s=time.perf_counter() - started, backfill=backfill,
        comm_cost=comm_cost,
    )
