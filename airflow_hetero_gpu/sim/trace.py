"""Job traces for the simulator: whole-GPU gang jobs with an arrival time and a run time.

Two inputs are read:

* **Alibaba cluster-trace-gpu-v2023** pod lists (``openb_pod_list_*.csv``, published with
  Weng et al., USENIX ATC'23). A pod asking for ``num_gpu`` GPUs becomes a job of that many
  whole GPUs; CPU-only pods are skipped; a one-GPU pod with ``gpu_milli < 1000`` (a GPU share)
  is rounded up to one whole GPU or dropped (:data:`FRACTIONAL_MODES`). Arrival is
  ``creation_time``; run time is ``deletion_time - scheduled_time``. ``gpu_spec`` (``|``-separated
  models) restricts the card type. The ``multigpu*`` lists carry no time columns: their pods that
  also appear in the default list (same name) take its times; the others, and pods that were
  never scheduled, get times drawn (seeded) from the timed pods, see :func:`fill_missing_times`.
* **A plain CSV** (:func:`read_jobs_csv`) with the columns ``job_id, arrival_s, duration_s, gpus``
  and the optional ``gpu_type`` (``|``-separated allowed card types, empty: any), ``priority``
  (an integer, empty: 0; the admission queue's priority), ``team`` (empty: the default team),
  ``preemptible`` (1 or 0, empty: 1) and ``checkpoint_s`` (seconds between the job's checkpoints,
  empty or 0: none; the work since the last one is lost when it is preempted, docs/preemption.md).

Every reading error is a :class:`~airflow_hetero_gpu.errors.HeteroGpuError` naming the file,
line, column and value.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.sim.csvio import bad, number, open_csv

FRACTIONAL_MODES = ("round-up", "drop")
USER_COLUMNS = ("job_id", "arrival_s", "duration_s", "gpus")
MIN_DURATION_S = 1.0


@dataclass(frozen=True)
class Job:
    """One gang job: ``gpus`` whole GPUs of one card type, held from start to end."""

    id: str
    arrival: float  # seconds
    duration: float  # seconds of run time once started
    gpus: int
    gpu_types: tuple[str, ...] = ()  # allowed card types; empty: any
    gpu_milli: int = 1000  # the source's per-GPU share (fractional pods were rounded up)
    timed: bool = True  # False when arrival/duration were drawn, not read
    priority: int = 0  # the admission queue's priority (higher first; docs/queue.md)
    team: str = ""  # its team (docs/teams.md); empty: the default team
    preemptible: bool = True  # may be preempted (docs/preemption.md)
    checkpoint_s: float = 0.0  # seconds of run time between two checkpoints (0: none)


@dataclass
class Trace:
    """Jobs sorted by arrival (ties keep file order), plus how they were obtained."""

    jobs: list[Job]
    source: str
    notes: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.jobs = sorted(self.jobs, key=lambda j: j.arrival)  # stable: file order on ties

    def gpu_count_histogram(self) -> dict[int, int]:
        hist: dict[int, int] = {}
        for j in self.jobs:
            hist[j.gpus] = hist.get(j.gpus, 0) + 1
        return dict(sorted(hist.items()))

    def limited(self, n: int | None) -> "Trace":
        """The first ``n`` jobs by arrival (all when ``n`` is None)."""
        if n is None or n >= len(self.jobs):
            return self
        return Trace(self.jobs[:n], self.source, [*self.notes, f"limited to the first {n} jobs by arrival"],
                     dict(self.counts))


def _types(text: str) -> tuple[str, ...]:
    # gpu_spec lists duplicates as published ("V100M32|V100M32"); keep the first of each
    seen: dict[str, None] = {}
    for part in text.split("|"):
        if part.strip():
            seen.setdefault(part.strip(), None)
    return tuple(seen)


# --- the user CSV ---------------------------------------------------------------------------
def read_jobs_csv(path: str | Path) -> Trace:
    """Read ``job_id, arrival_s, duration_s, gpus[, gpu_type][, priority][, team][, preemptible][, checkpoint_s]``
    (one job a line)."""
    path = Path(path)
    _, rows = open_csv(path, USER_COLUMNS)
    jobs: list[Job] = []
    seen: dict[str, int] = {}
    for n, row in rows:
        job_id = row["job_id"]
        if not job_id:
            raise bad(path, n, "job_id", job_id, "empty value")
        if job_id in seen:
            raise bad(path, n, "job_id", job_id, f"duplicate of line {seen[job_id]}")
        seen[job_id] = n
        jobs.append(Job(
            id=job_id,
            arrival=number(path, n, "arrival_s", row["arrival_s"], minimum=0),
            duration=max(MIN_DURATION_S, number(path, n, "duration_s", row["duration_s"], minimum=0)),
            gpus=number(path, n, "gpus", row["gpus"], integer=True, minimum=1),
            gpu_types=_types(row.get("gpu_type", "")),
            priority=number(path, n, "priority", row.get("priority", ""), integer=True, allow_empty=True) or 0,
            team=(row.get("team") or "").strip(),
            preemptible=_flag(path, n, "preemptible", row.get("preemptible", "")),
            checkpoint_s=number(path, n, "checkpoint_s", row.get("checkpoint_s", ""), minimum=0,
                                allow_empty=True) or 0.0,
        ))
    if not jobs:
        raise HeteroGpuError(f"{path}: no jobs (only a header)")
    return Trace(jobs, str(path), counts={"rows": len(jobs), "jobs": len(jobs)})


def _flag(path, n, column: str, text: str) -> bool:
    if text in ("", "1"):
        return True
    if text == "0":
        return False
    raise bad(path, n, column, text, "expected 1 or 0")


# --- Alibaba cluster-trace-gpu-v2023 ---------------------------------------------------------
ALIBABA_REQUIRED = ("name", "num_gpu", "gpu_milli")
ALIBABA_TIMES = ("creation_time", "deletion_time", "scheduled_time")
DEFAULT_POD_LIST = "openb_pod_list_default.csv"


@dataclass(frozen=True)
class _Pod:
    name: str
    line: int
    gpus: int
    gpu_milli: int
    gpu_types: tuple[str, ...]
    arrival: float | None
    duration: float | None


def _read_pods(path: Path) -> list[_Pod]:
    header, rows = open_csv(path, ALIBABA_REQUIRED)
    has_times = all(c in header for c in ALIBABA_TIMES)
    pods = []
    for n, row in rows:
        gpus = number(path, n, "num_gpu", row["num_gpu"], integer=True, minimum=0)
        milli = number(path, n, "gpu_milli", row["gpu_milli"], integer=True, minimum=0)
        if milli > 1000:
            raise bad(path, n, "gpu_milli", row["gpu_milli"], "must be at most 1000 (one whole GPU)")
        arrival = duration = None
        if has_times:
            created = number(path, n, "creation_time", row["creation_time"], minimum=0)
            deleted = number(path, n, "deletion_time", row["deletion_time"], minimum=0, allow_empty=True)
            scheduled = number(path, n, "scheduled_time", row["scheduled_time"], minimum=0, allow_empty=True)
            arrival = created
            if scheduled is not None and deleted is not None:
                if deleted < scheduled:
                    raise bad(path, n, "deletion_time", row["deletion_time"],
                               f"before scheduled_time {row['scheduled_time']}")
                duration = max(MIN_DURATION_S, deleted - scheduled)
        pods.append(_Pod(row["name"], n, gpus, milli, _types(row.get("gpu_spec", "")), arrival, duration))
    return pods


def fill_missing_times(jobs: list[Job], rng: random.Random) -> tuple[list[Job], int, int]:
    """Give jobs without times an arrival and a run time drawn from the timed jobs.

    Arrival: a uniformly drawn arrival of a timed job (so untimed jobs follow the trace's
    arrival density). Run time: a uniformly drawn run time of a timed job with the same GPU
    count when there are at least 5 of those, else of any timed job. A job with an arrival but
    no run time (a pod never scheduled) keeps its arrival and only draws a run time.
    Returns (jobs, arrivals drawn, run times drawn).
    """
    arrivals = [j.arrival for j in jobs if not math.isnan(j.arrival)]
    durations_by_k: dict[int, list[float]] = {}
    all_durations: list[float] = []
    for j in jobs:
        if j.timed:
            durations_by_k.setdefault(j.gpus, []).append(j.duration)
            all_durations.append(j.duration)
    if not arrivals or not all_durations:
        raise HeteroGpuError("trace has no pod with creation/scheduled/deletion times to draw times from")
    out, drew_a, drew_d = [], 0, 0
    for j in jobs:
        if j.timed:
            out.append(j)
            continue
        arrival = j.arrival
        if math.isnan(arrival):
            arrival = rng.choice(arrivals)
            drew_a += 1
        pool = durations_by_k.get(j.gpus, [])
        duration = rng.choice(pool if len(pool) >= 5 else all_durations)
        drew_d += 1
        out.append(replace(j, arrival=arrival, duration=duration))
    return out, drew_a, drew_d


def read_alibaba(path: str | Path, *, fractional: str = "round-up", seed: int = 0,
                 times_from: str | Path | None = None) -> Trace:
    """Read an ``openb_pod_list_*.csv`` of cluster-trace-gpu-v2023 into whole-GPU jobs.

    ``times_from``: a pod list with time columns whose times are taken by pod name when ``path``
    has none (default: ``openb_pod_list_default.csv`` beside ``path``, if it exists).
    """
    if fractional not in FRACTIONAL_MODES:
        raise HeteroGpuError(f"--fractional: expected one of {', '.join(FRACTIONAL_MODES)}, got {fractional!r}")
    path = Path(path)
    pods = _read_pods(path)
    notes: list[str] = []
    if pods and all(p.arrival is None for p in pods):
        ref = Path(times_from) if times_from else path.with_name(DEFAULT_POD_LIST)
        if ref.exists() and ref.resolve() != path.resolve():
            by_name = {p.name: p for p in _read_pods(ref)}
            pods = [replace(p, arrival=by_name[p.name].arrival, duration=by_name[p.name].duration)
                    if p.name in by_name and by_name[p.name].gpus == p.gpus else p for p in pods]
            notes.append(f"times taken by pod name from {ref.name}")
        else:
            notes.append(f"{path.name} has no time columns and {ref.name} was not found beside it")
    counts = {"rows": len(pods), "cpu_only": 0, "fractional_rounded_up": 0, "fractional_dropped": 0}
    jobs: list[Job] = []
    for p in pods:
        if p.gpus == 0:
            counts["cpu_only"] += 1
            continue
        if p.gpus == 1 and 0 < p.gpu_milli < 1000:
            if fractional == "drop":
                counts["fractional_dropped"] += 1
                continue
            counts["fractional_rounded_up"] += 1
        if p.gpus > 1 and p.gpu_milli not in (0, 1000):
            raise bad(path, p.line, "gpu_milli", p.gpu_milli, "a multi-GPU pod must ask for whole GPUs (1000)")
        timed = p.arrival is not None and p.duration is not None
        jobs.append(Job(p.name, p.arrival if p.arrival is not None else math.nan,
                        p.duration if p.duration is not None else math.nan,
                        p.gpus, p.gpu_types, p.gpu_milli or 1000, timed))
    if not jobs:
        raise HeteroGpuError(f"{path}: no pod asks for a GPU")
    jobs, drew_a, drew_d = fill_missing_times(jobs, random.Random(seed))
    counts.update(jobs=len(jobs), arrival_drawn=drew_a, duration_drawn=drew_d)
    if drew_d:
        notes.append(f"{drew_d} jobs without a run time (never scheduled, or absent from the timed list) "
                     f"drew one from the timed jobs, {drew_a} of them an arrival too (seed {seed})")
    return Trace(jobs, str(path), notes, counts)


# --- load: compressing arrivals ---------------------------------------------------------------
def offered_load(jobs: Sequence[Job], total_gpus: int, scale: float, lo_q: float = 0.01, hi_q: float = 0.99) -> float:
    """Offered load of the jobs arriving between the ``lo_q`` and ``hi_q`` arrival quantiles once
    arrivals are divided by ``scale``: their GPU-seconds (each run time cut at the window's
    length) over the cluster's GPU-seconds in that window."""
    arr = sorted(j.arrival for j in jobs)
    if len(arr) < 2:
        return 0.0
    lo, hi = arr[round(lo_q * (len(arr) - 1))], arr[round(hi_q * (len(arr) - 1))]  # nearest rank
    window = (hi - lo) / scale
    if window <= 0:
        return math.inf
    work = sum(j.gpus * min(j.duration, window) for j in jobs if lo <= j.arrival <= hi)
    return work / (total_gpus * window)


def time_scale_for_load(jobs: Sequence[Job], total_gpus: int, load: float) -> float:
    """The factor ``c`` (arrivals divided by it, run times kept) that gives :func:`offered_load`
    ``load``; 1 when the trace already offers at least that much."""
    if load <= 0:
        raise HeteroGpuError(f"--load: must be positive, got {load}")
    if offered_load(jobs, total_gpus, 1.0) >= load:
        return 1.0
    lo, hi = 1.0, 2.0
    while offered_load(jobs, total_gpus, hi) < load:
        lo, hi = hi, hi * 2
        if hi > 1e9:
            raise HeteroGpuError(f"--load {load}: the trace cannot offer that much load by compressing arrivals")
    for _ in range(60):
        mid = (lo + hi) / 2
        if offered_load(jobs, total_gpus, mid) < load:
            lo = mid
        else:
            hi = mid
    return hi


def compress(trace: Trace, scale: float) -> Trace:
    """Time measured from the first arrival, arrivals divided by ``scale``; run times unchanged."""
    if not trace.jobs:
        return trace
    t0 = trace.jobs[0].arrival
    jobs = [replace(j, arrival=(j.arrival - t0) / scale) for j in trace.jobs]
    notes = trace.notes if scale == 1.0 else [*trace.notes, f"arrivals compressed {scale:.4g}x"]
    return Trace(jobs, trace.source, notes, dict(trace.counts))
