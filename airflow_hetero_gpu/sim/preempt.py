"""Preemption in the simulator: the bookkeeping around the admission pass's decisions.

The decisions are the admission function's own (:mod:`airflow_hetero_gpu.core.admission.preemption`):
the queue passes the running jobs to every pass and hands each decided victim here. The model
of what follows (docs/preemption.md, docs/simulation.md):

* at the **signal** the victim's work since its last checkpoint is lost: with ``checkpoint_s`` =
  C > 0 the job checkpoints every C seconds of its run time, so it keeps every whole C it ran;
  with C = 0 it keeps nothing of this run. ``lost_gpu_s`` = (signal - last checkpoint) × GPUs;
* the victim holds its GPUs for the whole ``grace_s`` after the signal (the worst case: a script
  that exits at once frees them sooner), then goes back to the queue with its original arrival
  and priority, and later runs only what it had not kept;
* a victim whose run ends within the grace ends normally (no preemption is counted).

Every ``start``, ``end`` and ``preempt`` is kept as an event ``(time_s, event, job_id, gpus,
detail)`` for ``--events-out``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from airflow_hetero_gpu.core.admission import DEFAULT_PREEMPTION_GRACE_S, PreemptionRules, RunningJob


@dataclass(frozen=True)
class SimPreemption:
    """The simulator's preemption settings."""

    rules: PreemptionRules = PreemptionRules()
    grace_s: float = DEFAULT_PREEMPTION_GRACE_S


class Preempter:
    """Per replay: when each running job (re)started, what it kept, who stops for whom."""

    def __init__(self, settings: SimPreemption | None) -> None:
        self.settings = settings
        self.started: dict[int, float] = {}  # running job -> its last (re)start
        self.slow: dict[int, float] = {}  # running job -> run time per trace second (distance slowdown)
        self.kept: dict[int, float] = {}  # job -> trace seconds of work kept by checkpoints
        self.stopping: dict[int, tuple[str, float]] = {}  # victim -> (preemptor, signal time)
        self.count: dict[int, int] = {}
        self.lost: dict[int, float] = {}
        self.events: list[tuple[float, str, str, int, str]] = []

    @property
    def on(self) -> bool:
        return self.settings is not None

    def remaining(self, i: int, duration: float) -> float:
        """Trace seconds job ``i`` still has to run."""
        return max(0.0, duration - self.kept.get(i, 0.0))

    def on_start(self, i: int, job_id: str, gpus: int, now: float, slow: float) -> None:
        self.started[i] = now
        self.slow[i] = slow
        self.events.append((now, "start", job_id, gpus, ""))

    def on_end(self, i: int, job_id: str, gpus: int, now: float) -> None:
        self.started.pop(i, None)
        self.stopping.pop(i, None)
        self.events.append((now, "end", job_id, gpus, ""))

    def _checkpoint(self, i: int, checkpoint_s: float, at: float) -> tuple[float, float]:
        """(the last checkpoint's time, trace seconds it kept in this run) as of ``at``."""
        start, slow = self.started[i], self.slow[i]
        if checkpoint_s <= 0:
            return start, 0.0
        done = (at - start) / slow  # trace seconds run in this run
        kept = math.floor(done / checkpoint_s + 1e-9) * checkpoint_s
        return start + kept * slow, kept

    def running(self, jobs, holding, now: float) -> list[RunningJob]:
        """The running jobs as the admission pass's preemption rule sees them."""
        out = []
        for i, start in self.started.items():
            job = jobs[i]
            ckpt, _ = self._checkpoint(i, job.checkpoint_s, now)
            stopping = self.stopping.get(i)
            out.append(RunningJob(job.id, holding(job.id), job.priority, start, ckpt, getattr(job, "team", None),
                                  job.preemptible, False, stopping[0] if stopping else None, job.arrival))
        return out

    def signal(self, i: int, job, preemptor: str, now: float) -> float:
        """Job ``i`` is told to stop for ``preemptor``; returns when it frees its GPUs."""
        self.stopping[i] = (preemptor, now)
        self.events.append((now, "preempt", job.id, job.gpus, preemptor))
        return now + self.settings.grace_s

    def stop(self, i: int, job, now: float) -> bool:
        """The grace of a victim passed: account its lost work; False when it had ended already."""
        if i not in self.stopping or i not in self.started:
            return False
        _, at = self.stopping.pop(i)
        ckpt, kept = self._checkpoint(i, job.checkpoint_s, at)
        self.kept[i] = self.kept.get(i, 0.0) + kept
        self.count[i] = self.count.get(i, 0) + 1
        self.lost[i] = self.lost.get(i, 0.0) + (at - ckpt) * job.gpus
        del self.started[i]
        self.events.append((now, "stopped", job.id, job.gpus, f"lost {(at - ckpt) * job.gpus:.0f} GPU-s"))
        return True
