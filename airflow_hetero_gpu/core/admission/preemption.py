"""Preemption, a rule of the admission pass: which running jobs a waiting job may stop to start.

    rules = PreemptionRules(min_runtime_s=600, delay_s=60)
    adm.run(queue, now=now, reserved=..., running=[RunningJob(...), ...], preemption=rules)
    for pre in result.preemptions: ...   # pre.victims stop, pre.preemptor waits on its claim

**When** (docs/preemption.md): a job that cannot start now, that has waited at least
``delay_s`` and would head a pool, may preempt (a) running jobs of lower priority (of its own
team; without teams, of the whole fleet) that would queue behind it, and (b), when it is within
its team's quota, jobs of other teams that run on borrowed quota (a reclaim: whatever their
priority, and even those that said ``preemptible=False``) (:func:`~.order.rank_key` with
their original time enqueued: a victim goes back to the queue with its place, so one that would
rank ahead, having waited long enough for aging to lift it, would take its GPUs straight back).
Never a job that says ``preemptible=False``, never one that has run less than ``min_runtime_s``
since it (re)started, never one already being stopped, and never for a job that would still
not fit once the victims ended.

**Whom**: whole jobs only. The candidates are taken in order of :func:`victim_key`: fewest
GPU-seconds of work lost (time since the last checkpoint × GPUs) first, then borrowers before
in-quota jobs, then lower priority, then job id; they are released one at a time until
``plan()`` places the preemptor on GPUs that are free or held by released candidates, and the
victims are the released candidates whose GPUs that placement uses (the smallest set in that
order that lets it start where ``plan()`` puts it).

The preemptor then heads its pool with a claim on exactly those GPUs, so nothing else takes
them while the victims stop; while any victim still stops for it, it does not preempt again.
Pure: no I/O, no clock; the caller passes ``now`` on the queue's clock.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from airflow_hetero_gpu.core.admission.defaults import (  # noqa: F401 - re-exported
    DEFAULT_MIN_RUNTIME_S, DEFAULT_PREEMPTION_DELAY_S, DEFAULT_PREEMPTION_GRACE_S,
)
from airflow_hetero_gpu.core.admission.claims import keep_claim, record_claim
from airflow_hetero_gpu.core.admission.model import QueueEntry
from airflow_hetero_gpu.core.admission.order import rank_key
from airflow_hetero_gpu.core.admission.running import RunningColumns, gather
from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.errors import RequestError


def _seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise RequestError(f"{name}: expected a number of seconds >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class PreemptionRules:
    """When preemption may happen: a victim ran at least ``min_runtime_s`` since it (re)started;
    the preemptor waited at least ``delay_s``."""

    min_runtime_s: float = DEFAULT_MIN_RUNTIME_S
    delay_s: float = DEFAULT_PREEMPTION_DELAY_S

    def __post_init__(self) -> None:
        _seconds("min_runtime_s", self.min_runtime_s)
        _seconds("preemption_delay_s", self.delay_s)


@dataclass(frozen=True)
class RunningJob:
    """A job holding GPUs, as preemption sees it (times on the queue's clock).

    ``started_at``: its last (re)start; ``checkpoint_at``: its last checkpoint (None: none since
    it started, so all its work since ``started_at`` would be lost). ``borrowed``: it runs on
    quota lent by another team (always reclaimable). ``preempting``: the preemptor it is being
    stopped for (it is no candidate again while it stops).
    """

    job_id: str
    gpus: tuple[GpuKey, ...]
    priority: int = 0
    started_at: float = 0.0
    checkpoint_at: float | None = None
    team: str | None = None
    preemptible: bool = True
    borrowed: bool = False
    preempting: str | None = None
    enqueued_at: float | None = None  # its original time enqueued (None: started_at)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(GpuKey(*k) for k in self.gpus))
        if self.enqueued_at is None:
            object.__setattr__(self, "enqueued_at", self.started_at)

    def lost_gpu_s(self, now: float) -> float:
        """GPU-seconds of work lost if it were stopped at ``now``: time since its last checkpoint
        (or its start) times its GPUs."""
        since = self.started_at if self.checkpoint_at is None else max(self.started_at, self.checkpoint_at)
        return max(0.0, now - since) * len(self.gpus)


@dataclass(frozen=True)
class Preemption:
    """One decision: ``victims`` stop so that ``preemptor`` can start on ``gpus``."""

    preemptor: str
    priority: int
    team: str | None
    victims: tuple[str, ...]
    gpus: tuple[GpuKey, ...]
    lost_gpu_s: Mapping[str, float] = field(default_factory=dict)  # per victim
    reasons: Mapping[str, str] = field(default_factory=dict)  # per victim: "priority 5 > 1"

    @property
    def total_lost_gpu_s(self) -> float:
        return float(sum(self.lost_gpu_s.values()))

    def to_json(self) -> dict:
        return {"preemptor": self.preemptor, "priority": self.priority, "team": self.team,
                "victims": list(self.victims), "gpus": [list(k) for k in self.gpus],
                "lost_gpu_s": dict(self.lost_gpu_s), "reasons": dict(self.reasons)}


def team_of(entry: QueueEntry) -> str | None:
    """The waiting job's team (None where teams are not configured)."""
    return getattr(entry, "team", None)


def reclaims(entry: QueueEntry, job: RunningJob, borrowed: bool | None = None) -> bool:
    """Whether stopping ``job`` for ``entry`` is a reclaim: ``job`` runs on borrowed quota
    (``borrowed``, as the pass computed it; None: the job's own ``borrowed``) and belongs to
    another team than ``entry`` (which the caller knows to be within its quota)."""
    team = team_of(entry)
    return (job.borrowed if borrowed is None else borrowed) and team is not None and job.team != team


def reason(entry: QueueEntry, victim: RunningJob, reclaim: bool = False, borrowed: bool | None = None) -> str:
    """``priority 5 > 1`` (``team prod, ...`` with teams; ``; reclaim of prod's quota`` when
    the victim runs on quota lent to it)."""
    sign = ">" if entry.priority > victim.priority else ("=" if entry.priority == victim.priority else "<")
    text = f"priority {entry.priority} {sign} {victim.priority}"
    team = team_of(entry)
    if team is not None:
        text = f"team {team}, {text}"
    if reclaim and reclaims(entry, victim, borrowed):
        text += f"; reclaim of {team}'s quota"
    return text


def eligible(entry: QueueEntry, job: RunningJob, now: float, rules: PreemptionRules,
             aging_interval_s: float | None = None, *, reclaim: bool = False) -> bool:
    """Whether ``job`` may be stopped for ``entry``: :meth:`Candidates.eligible`, the one
    predicate, asked about one job. The priority rule: a lower-priority job of its own team (or of
    the whole fleet without teams) that ran ``min_runtime_s``, said it may be preempted, is not
    already stopping, and would rank behind ``entry`` back in the queue; or, with ``reclaim``
    (``entry`` is within its team's quota), any job of another team that runs on borrowed quota
    now and ran ``min_runtime_s``, whatever its priority and even if it said ``preemptible=False``."""
    return bool(Candidates([job], now, rules, aging_interval_s).eligible(entry, reclaim=reclaim)[0])


def victim_key(now: float):
    """Order of the candidates: least work lost, borrowers first, lowest priority, job id."""
    return lambda j: (j.lost_gpu_s(now), not j.borrowed, j.priority, j.job_id)


def in_progress(running: Iterable[RunningJob]) -> dict[str, list[str]]:
    """Preemptor -> the victims still stopping for it."""
    out: dict[str, list[str]] = {}
    for j in running:
        if j.preempting is not None:
            out.setdefault(j.preempting, []).append(j.job_id)
    return out


def _stopping_and_lowest(running: Iterable[RunningJob]) -> tuple[dict[str, list[str]], float]:
    """:func:`in_progress` of ``running`` and the lowest priority of a job there that is not
    being stopped and may be preempted (inf: none), in one walk over the jobs."""
    out: dict[str, list[str]] = {}
    lowest = math.inf
    for j in running:
        by = j.preempting
        if by is not None:
            out.setdefault(by, []).append(j.job_id)
        elif j.preemptible and j.priority < lowest:
            lowest = j.priority
    return out, lowest


def choose(p, entry: QueueEntry, open_pools: np.ndarray, candidates: Sequence[RunningJob], now: float,
           reclaim: bool = False, borrowers: set[str] | None = None, where: tuple | None = None) -> Preemption | None:
    """The victims that let ``entry`` start, or None (see the module docstring).

    ``p`` is the pass's :class:`~airflow_hetero_gpu.core.admission.passstate.PassState`,
    ``open_pools`` the pools the job accepts that have no head yet, ``candidates`` the running
    jobs it may stop, in victim order (:class:`Candidates` picks them); ``where``: (flat, offsets,
    numbers), the candidates' GPU positions as :meth:`.running.RunningColumns.gpu_positions` gives
    them and each candidate's number there (None: looked up from their keys).

    The candidates are released one at a time; ``plan()`` is asked once releasing them could
    free enough GPUs in one open pool (:func:`_first_enough` finds that point), then after each
    further release until it places the job.
    """
    if not candidates or not open_pools.any():
        return None
    c = p.cluster
    closed = p.claimed | ~open_pools[c.pool_of]
    room = (p.usable & ~closed).astype(bool)
    free = np.bincount(c.pool_of[room & ~p.blocked], minlength=len(c.pools))
    first, released, picked = _first_enough(p, candidates, closed, room, free, open_pools, entry.request.gpus, where)
    for i in range(first, len(candidates)):
        job = candidates[i]
        keys = [k for k in job.gpus if k in c.position]
        if len(keys) != len(job.gpus):
            continue  # it holds a GPU the cluster no longer lists: it cannot be placed on anyway
        pos = p.positions(keys)
        if closed[pos].any() or not p.held[pos].all():
            continue  # its GPUs are claimed for a head ahead, or in a pool this job may not use
        released[pos] = True
        picked.append(job)
        placement = p.adm.placer(entry, closed | (p.held & ~released), p.holders, idle=released)
        if not placement.placed:
            continue
        used = set(GpuKey(*k) for k in placement.gpus)
        victims = [j for j in picked if used & set(j.gpus)]
        if not victims:
            return None  # it fits without stopping anyone: not a preemption (cannot happen after try_start)
        return Preemption(entry.job_id, entry.priority, team_of(entry), tuple(j.job_id for j in victims),
                          tuple(sorted(used)), {j.job_id: round(j.lost_gpu_s(now), 3) for j in victims},
                          {j.job_id: reason(entry, j, reclaim, None if borrowers is None else j.job_id in borrowers)
                           for j in victims})
    return None


#: :func:`_first_enough` looks at the candidates in chunks of this many, then four times more each
#: time: a preemptor usually finds its victims among the first few, while a pass also asks about
#: hundreds of candidates for jobs that no release can seat (their GPUs claimed, or in pools the job
#: may not use)
FIRST_CHUNK = 16


def _first_enough(p, candidates: Sequence[RunningJob], closed: np.ndarray, room: np.ndarray, free: np.ndarray,
                  open_pools: np.ndarray, need: int, where: tuple | None = None) -> tuple[int, np.ndarray, list[RunningJob]]:
    """Where releasing the candidates in order first frees ``need`` GPUs in one open pool: its
    index (``len(candidates)``: never), the GPUs released before it and the candidates released
    before it. A candidate is released when every GPU of it is listed by the cluster, held, not
    claimed for a head ahead and in a pool the job may use; what it frees counts in the pools
    with room. Computed with numpy over chunks of candidates (the same answer as one at a time)."""
    c = p.cluster
    npools = len(c.pools)
    released = np.zeros(len(c.gpus), dtype=bool)
    picked: list[RunningJob] = []
    total = free.copy()
    get = c.position.get
    start, size = 0, FIRST_CHUNK
    while start < len(candidates):
        chunk = candidates[start:start + size]
        n = len(chunk)
        if where is not None:
            pos, lens = gather(where[0], where[1], where[2][start:start + size])
        else:
            lens = np.fromiter((len(j.gpus) for j in chunk), dtype=np.int64, count=n)
            pos = np.fromiter((-1 if (q := get(k)) is None else q for j in chunk for k in j.gpus),
                              dtype=np.int64, count=int(lens.sum()))
        owner = np.repeat(np.arange(n), lens)
        listed = pos >= 0
        at = np.where(listed, pos, 0)
        ok = np.bincount(owner[~listed | closed[at] | ~p.held[at]], minlength=n) == 0
        counted = ok[owner] & room[at]
        gained = np.bincount(owner[counted] * npools + c.pool_of[at[counted]],
                             minlength=n * npools).reshape(n, npools)
        cum = np.cumsum(gained, axis=0) + total
        hits = np.flatnonzero(ok & (cum[:, open_pools].max(axis=1) >= need))
        upto = int(hits[0]) if len(hits) else n
        before = ok[:upto]
        released[at[ok[owner] & (owner < upto)]] = True
        picked += [chunk[i] for i in np.flatnonzero(before).tolist()]
        if len(hits):
            return start + upto, released, picked
        total = cum[-1]
        start += n
        size *= 4
    return len(candidates), released, picked


class _Picked(Sequence):
    """``[jobs[i] for i in idx]``, each read when asked for (a list of some 27,000 running jobs
    at 100,000 GPUs per claim, of which a preemptor reads the first few)."""

    def __init__(self, jobs: Sequence[RunningJob], idx: np.ndarray) -> None:
        self.jobs, self.idx = jobs, idx

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.jobs[j] for j in self.idx[i].tolist()]
        return self.jobs[int(self.idx[i])]


class Candidates:
    """The running jobs of one pass as arrays, in victim order, so that the jobs a waiting job may
    stop are found with numpy: a pass on a fleet of 10,000 GPUs asks about some 1,500 running jobs
    for every waiting job that could preempt. :meth:`eligible` is the preemption predicate; the
    order is :func:`victim_key`'s (``tests/test_preemption_rule.py`` checks the two orders agree)."""

    def __init__(self, running: Sequence[RunningJob], now: float, rules: PreemptionRules,
                 aging_interval_s: float | None, borrowed: Sequence[bool] | None = None,
                 columns: RunningColumns | None = None) -> None:
        """``borrowed``: per job, whether it runs on borrowed quota now (None: its own ``borrowed``);
        ``columns``: the jobs' :class:`~.running.RunningColumns` (None: read here)."""
        cols = columns if columns is not None else RunningColumns(running, None)
        n = len(running)
        lost = np.maximum(0.0, now - cols.since) * cols.ngpus.astype(np.float64)
        borrowed = cols.own_borrowed if borrowed is None else np.array(list(borrowed), dtype=bool)
        order = np.lexsort((cols.ids, cols.priority, ~borrowed, lost))  # victim_key(now), as numpy sorts it
        self.columns = cols
        self.order = order  # each candidate's number in ``running``
        self.ids = cols.ids[order]
        self.jobs = [running[i] for i in order.tolist()]
        self.aging = aging_interval_s
        # what does not depend on the waiting job: not already stopping, ran long enough
        self.open = (cols.idle & (now - cols.started >= rules.min_runtime_s))[order]
        self.borrowed = borrowed[order]
        self.preemptible = cols.preemptible[order]
        self.priority = cols.priority[order]
        enqueued = cols.enqueued[order]
        self.team = cols.team[order] if n else np.zeros(0, dtype=object)
        self.no_team = np.equal(self.team, None).astype(bool)
        # rank_key's first element (the virtual enqueue time, or -priority without aging)
        self.rank0 = -self.priority.astype(np.float64) if aging_interval_s is None else \
            enqueued - self.priority * aging_interval_s
        self.taken = np.zeros(n, dtype=bool)

    def where(self, chosen: np.ndarray) -> tuple | None:
        """For :func:`choose`: the GPU positions of the candidates numbered ``chosen`` here (None
        without a cluster to look them up in)."""
        if self.columns.cluster is None:
            return None
        flat, offsets = self.columns.gpu_positions()
        return flat, offsets, self.order[chosen]

    def eligible(self, entry: QueueEntry, *, reclaim: bool = False) -> np.ndarray:
        """Mask over :attr:`jobs`: those ``entry`` may stop, not yet taken: the one preemption
        predicate (:func:`eligible` asks it about one job; :attr:`PassPreemption.bounds` and the
        ledger's SQL prefilter are necessary conditions of it, checked against it by
        tests/test_preemption_rule.py)."""
        base = self.open & ~self.taken
        team = team_of(entry)
        same_team = self.no_team | (self.team == team) if team is not None else np.ones_like(base)
        mine = rank_key(entry, self.aging)
        behind = self.rank0 > mine[0]
        tie = np.flatnonzero(self.rank0 == mine[0])
        for i in tie.tolist():  # the same first element: the rest of the key decides
            behind[i] = not rank_key(self.jobs[i], self.aging) < mine
        ok = base & self.preemptible & (self.priority < entry.priority) & behind & same_team
        if reclaim and team is not None:
            ok |= base & self.borrowed & (self.team != team)
        return ok

    def take(self, job_ids) -> None:
        self.taken |= np.isin(self.ids, list(job_ids))


def describe(victims: Sequence[str]) -> str:
    """``preempting j1, j2 for it``: the note on a preemptor's reason."""
    return f"preempting {', '.join(victims)} for it"


class PassPreemption:
    """Preemption during one admission pass: what the pass decided and who still stops for whom."""

    def __init__(self, running: Sequence[RunningJob], rules: PreemptionRules, now: float,
                 aging_interval_s: float | None = None, *, teams: bool = True,
                 borrowing: Callable[[RunningJob], bool] | None = None, some_borrow: bool | None = None,
                 columns: Callable[..., RunningColumns | None] | None = None,
                 borrowing_many: Callable[[RunningColumns], list[bool]] | None = None) -> None:
        # ``teams`` False (no team configured): the whole fleet is one team, whatever team names
        # the jobs carry (the operator always sends one), and reasons name none. ``borrowing``:
        # whether a running job's team holds above its quota now (the pass computes it; None: no
        # job borrows), whatever the job's own ``borrowed`` says; ``some_borrow``: whether any team
        # borrows now (None: ask ``borrowing`` of every job), for :attr:`bounds`
        self.teams = teams
        self._some_borrow = some_borrow
        self._borrowing = borrowing or (lambda job: False)
        self._columns = columns  # running jobs -> their columns (the admission keeps them between passes)
        self._borrowing_many = borrowing_many  # ``borrowing`` of every job of the columns at once
        self._running = running
        self.aging = aging_interval_s
        self.rules = rules
        self.now = now
        # the columns kept from an earlier pass given these very jobs, if any (none are built here:
        # a pass where nobody can preempt does not need them)
        self._kept = columns(running, build=False) if columns is not None else None
        # preemptor -> victims still stopping; without kept columns, the lowest priority that may
        # be preempted is read in the same walk over the jobs (see :attr:`bounds`)
        self._lowest: float | None = None
        if self._kept is not None:
            self.stopping = self._kept.stopping()
        else:
            self.stopping, self._lowest = _stopping_and_lowest(running)
        self.decided: list[Preemption] = []

    @functools.cached_property
    def candidates(self) -> Candidates:
        """The running jobs as arrays in victim order, built at the first waiting job that could
        preempt (a pass where nobody can does not pay for it)."""
        return Candidates(self._running, self.now, self.rules, self.aging, self.borrowed, self.columns)

    @functools.cached_property
    def columns(self) -> RunningColumns:
        """The running jobs' columns: ``columns(running)`` as the pass gave it (kept between passes
        given the same job objects), else read here (without GPU positions)."""
        return self._columns(self._running) if self._columns is not None else RunningColumns(self._running, None)

    @functools.cached_property
    def borrowed(self) -> list[bool]:
        """Per running job, whether it runs on borrowed quota now (as the pass computes it)."""
        if self._borrowing_many is not None:
            return [bool(b) for b in self._borrowing_many(self.columns)]
        return [bool(self._borrowing(job)) for job in self._running]

    @functools.cached_property
    def borrowers(self) -> set[str]:
        return {job.job_id for job, flag in zip(self._running, self.borrowed) if flag}

    @functools.cached_property
    def bounds(self) -> tuple[float, bool]:
        """The lowest priority of a running job that may be preempted at all, and whether any
        runs on borrowed quota: a necessary condition of :meth:`Candidates.eligible` (a waiting
        job whose priority is not above the first, with no borrower to reclaim, has no
        candidate), so the pass need not build :class:`Candidates` for it."""
        cols = self._kept if self._kept is not None else self.__dict__.get("columns")  # those at hand
        if cols is not None:
            lowest = cols.lowest_preemptible()
        elif self._lowest is not None:
            lowest = self._lowest
        else:
            lowest = min([j.priority for j in self._running if j.preempting is None and j.preemptible],
                         default=math.inf)
        if self._some_borrow is not None:  # no team above its quota: no job borrows (a superset is enough)
            return lowest, self._some_borrow
        return lowest, any(flag for job, flag in zip(self._running, self.borrowed) if job.preempting is None)

    def claim(self, p, entry: QueueEntry, shape, *, reclaim: bool = False):
        """A new preemption for ``entry`` and its claim on the GPUs it frees, or None (the caller
        then claims as usual). A preemptor whose victims still stop keeps its claim where it is
        (the GPUs they free), not moved to GPUs of other holders.
        ``reclaim``: the job is within its team's quota, so jobs of other teams on borrowed quota
        are candidates too."""
        if entry.job_id in self.stopping:  # it waits on the GPUs its victims free: its claim stays there
            return keep_claim(p, entry, shape)
        if not self.teams and entry.team is not None:
            entry = dataclasses.replace(entry, team=None)
        open_pools = shape.ok & ~p.headed
        if self.now - entry.enqueued_at < self.rules.delay_s or not open_pools.any():
            return None  # it has not waited long enough, or would not head a pool
        lowest, borrowers = self.bounds
        if entry.priority <= lowest and not (reclaim and borrowers):
            return None  # no running job has a lower priority, and none is reclaimable
        cands = self.candidates
        idx = np.flatnonzero(cands.eligible(entry, reclaim=reclaim))
        chosen = _Picked(cands.jobs, idx)  # read as far as choose() goes: mostly the first few
        pre = choose(p, entry, open_pools, chosen, self.now, reclaim, self.borrowers, cands.where(idx))
        if pre is None:
            return None
        cands.take(pre.victims)
        self.decided.append(pre)
        return record_claim(p, entry, p.positions(pre.gpus), kept=False)

    def annotate(self, result):
        """The preemptors' reasons say whom they preempt."""
        notes = {pre.preemptor: list(pre.victims) for pre in self.decided}
        for job, victims in self.stopping.items():
            notes.setdefault(job, victims)
        if notes:
            result.waiting = [dataclasses.replace(w, reason=f"{w.reason}; {describe(notes[w.job_id])}")
                              if w.job_id in notes and w.reason else w for w in result.waiting]
        result.preemptions = list(self.decided)
        return result


__all__ = ["DEFAULT_MIN_RUNTIME_S", "DEFAULT_PREEMPTION_DELAY_S", "DEFAULT_PREEMPTION_GRACE_S", "PreemptionRules",
           "RunningJob", "Preemption", "Candidates", "choose", "eligible", "reclaims", "victim_key", "in_progress", "describe", "reason", "PassPreemption"]
