"""The running jobs as columns (numpy arrays in the order given), what preemption reads of them
whatever the time of the pass: :class:`~.preemption.Candidates` sorts them in victim order for
each pass's ``now``, and :func:`~.preemption.choose` finds their GPUs' positions here instead of
looking every GPU key up again.

A pass at 10,000 GPUs reads some 2,700 running jobs this way, at 100,000 GPUs some 27,000. The
columns depend only on the jobs (frozen :class:`~.preemption.RunningJob` objects) and the cluster,
so :meth:`~.kept.KeptHeld.columns` keeps them while a pass is given the very same job objects in
the same order (it holds them, so their ids cannot be reused by others).
"""

from __future__ import annotations

import itertools
import math
import operator
from typing import Any, Sequence

import numpy as np


def _read_only(*arrays: np.ndarray) -> None:
    for a in arrays:
        a.flags.writeable = False


class RunningColumns:
    """Per running job, in the order of ``running``: its start, the start of the work it would
    lose (``since``: its last checkpoint, else its start), GPUs, priority, whether it is not being
    stopped (``idle``), may be preempted, its own ``borrowed`` flag, original time enqueued, id and
    team; and, built on first use, its GPUs' positions in ``cluster`` (:meth:`gpu_positions`)."""

    def __init__(self, running: Sequence[Any], cluster: Any) -> None:
        self.cluster = cluster
        self.running = tuple(running)  # its own: what it reads later is what it was given
        n = len(running)

        def column(name: str, dtype) -> np.ndarray:  # one C-level walk over the jobs per column
            return np.fromiter(map(operator.attrgetter(name), running), dtype=dtype, count=n)

        self.started = column("started_at", np.float64)
        ckpt = column("checkpoint_at", np.float64)  # None: nan
        self.since = np.where(np.isnan(ckpt), self.started, np.fmax(self.started, ckpt))
        self.ngpus = np.fromiter(map(len, map(operator.attrgetter("gpus"), running)), dtype=np.int64, count=n)
        self.own_borrowed = column("borrowed", bool)
        self.priority = column("priority", np.int64)
        self.idle = np.fromiter(map(operator.is_, map(operator.attrgetter("preempting"), running), itertools.repeat(None)),
                                dtype=bool, count=n)
        self.preemptible = column("preemptible", bool)
        self.enqueued = column("enqueued_at", np.float64)
        self.ids = np.array([j.job_id for j in running], dtype=str)
        self.team = column("team", object)
        _read_only(self.started, self.since, self.ngpus, self.own_borrowed, self.priority, self.idle,
                   self.preemptible, self.enqueued, self.ids, self.team)
        self._positions: tuple[np.ndarray, np.ndarray] | None = None
        self._first: tuple[np.ndarray, np.ndarray] | None = None  # see first_positions
        self._stopping: dict[str, tuple[str, ...]] | None = None  # see stopping
        self._lowest: float | None = None  # see lowest_preemptible

    def stopping(self) -> dict[str, list[str]]:
        """Preemptor -> the jobs still stopping for it (``preemption.in_progress`` of the jobs, in
        their order), read from the few jobs being stopped, once per columns (a new dict each
        call: the caller's own)."""
        if self._stopping is None:
            out: dict[str, list[str]] = {}
            for i in np.flatnonzero(~self.idle).tolist():
                job = self.running[i]
                out.setdefault(job.preempting, []).append(job.job_id)
            self._stopping = {k: tuple(v) for k, v in out.items()}
        return {k: list(v) for k, v in self._stopping.items()}

    def lowest_preemptible(self) -> float:
        """The lowest priority of a job not being stopped that may be preempted (inf: none), of the
        jobs' own priorities (not the columns' integers), once per columns."""
        if self._lowest is None:
            rows = np.flatnonzero(self.idle & self.preemptible).tolist()
            self._lowest = min((self.running[i].priority for i in rows), default=math.inf)
        return self._lowest

    def gpu_positions(self) -> tuple[np.ndarray, np.ndarray]:
        """Every job's GPU positions, concatenated in job order (-1: a GPU the cluster does not
        list), and where each job's start (``offsets``, one more than the jobs)."""
        if self._positions is None:
            flat = self.cluster.positions_of(list(itertools.chain.from_iterable(j.gpus for j in self.running)))
            offsets = np.zeros(len(self.running) + 1, dtype=np.int64)
            np.cumsum(self.ngpus, out=offsets[1:])
            _read_only(flat, offsets)
            self._positions = (flat, offsets)
        return self._positions

    def first_positions(self, rows: np.ndarray) -> np.ndarray:
        """Each job's first GPU's position (-1: none, or one the cluster does not list), looked up
        for the jobs in the mask ``rows`` that were not before (the others' entries: -1 unless
        an earlier call looked them up)."""
        if self._first is None:
            self._first = (np.full(len(self.running), -1, dtype=np.int64), np.zeros(len(self.running), dtype=bool))
        first, known = self._first
        get = self.cluster.position.get
        for i in np.flatnonzero(rows & ~known).tolist():
            gpus = self.running[i].gpus
            q = get(gpus[0]) if gpus else None
            first[i] = -1 if q is None else q
            known[i] = True
        return first


def gather(flat: np.ndarray, offsets: np.ndarray, jobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The GPU positions of the jobs numbered ``jobs`` (in that order), concatenated, and the
    number of GPUs of each."""
    lens = offsets[jobs + 1] - offsets[jobs]
    total = int(lens.sum())
    starts = np.repeat(offsets[jobs], lens)
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    return flat[starts + within], lens
