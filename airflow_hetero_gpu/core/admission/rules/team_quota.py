"""The team-quota rule (docs/teams.md): which pools a team's job may use now, within its quota or
by borrowing idle quota that others lend (:class:`~airflow_hetero_gpu.core.admission.quota.QuotaBook`
keeps the accounts).

* **Within quota** (stage 1 of :mod:`.fair_share`): only pools of card types where its team's
  unused quota holds the whole job; none: the job is deferred to the borrowers' stage. One that
  cannot start keeps its quota (nobody borrows it) and becomes a head or waits as usual.
* **Borrowing** (stage 2): only pools where quota lets it borrow (idle lendable quota of other
  teams, up to its borrowing limit); none: it waits with the quota's standing as its reason and
  claims nothing.

No team goes above quota + borrowing limit. Quota is a matter of card type: one question per card
type, not per pool.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from airflow_hetero_gpu.core.admission.model import QueueEntry, ReasonKind
from airflow_hetero_gpu.core.admission.preemption import RunningJob
from airflow_hetero_gpu.core.admission.quota import DEFAULT_TEAM, QuotaBook, Teams
from airflow_hetero_gpu.core.admission.records import Item, Reason, Stage, Verdict
from airflow_hetero_gpu.core.admission.rules.base import Rule
from airflow_hetero_gpu.core.model import GpuKey

#: unused quota above this counts as this much (a quota of 10**20 GPUs must not overflow numpy)
ROOM_CAP = 2 ** 62


@dataclass(frozen=True)
class QuotaInput:
    """What a pass with teams needs besides the queue: the applied teams, the team of every job
    holding GPUs (absent: the default team) and each team's decayed borrowed GPU-seconds."""

    teams: Teams
    team_of: Mapping[str, str] = field(default_factory=dict)
    history: Mapping[str, float] = field(default_factory=dict)
    default_team: str = DEFAULT_TEAM

    def team(self, entry: QueueEntry) -> str:
        return entry.team or self.default_team


class TeamQuotaRule(Rule):
    """The quota rule of one pass; ``adm`` is the Admission, ``p`` the pass state."""

    def __init__(self, adm, p, quotas: QuotaInput, reserved: Mapping[GpuKey, str] | None, *, explain: bool) -> None:
        c = adm.cluster
        self.cluster, self.p = c, p
        self.pool_card = [pool.card_type for pool in c.pools]
        self.cards = cards = sorted(set(self.pool_card))
        self.pool_code = np.array([cards.index(t) for t in self.pool_card], dtype=np.int64)
        self.pool_code_list = self.pool_code.tolist()
        gpu_code, healthy = _card_codes(adm, self.pool_code, len(cards))
        usage = holdings(p, quotas, reserved or {}, cards, gpu_code)
        self.book = QuotaBook(quotas.teams, {t: int(n) for t, n in zip(cards, healthy.tolist()) if n}, usage,
                              quotas.history, reasons=explain)
        self.explain = explain
        self.default_team = quotas.default_team
        # (team, card type) where the team holds more than its quota now, before this pass starts
        # anyone: the one meaning of "borrowed" (quota.team_use), read by the reclaim rule
        self.over = {(t, c) for t in {t for (t, _) in usage} for c, n in self.book.borrowed_by_card(t).items() if n}
        self.over_teams = {t for (t, _) in self.over}
        self._rooms: dict[tuple[str, int], np.ndarray] = {}  # see _room()
        self._verdicts: dict[tuple, tuple] = {}  # see verdict()
        self._notes: dict[tuple, Reason] = {}  # see note()
        self._cards: dict[int, tuple] = {}  # id(shape) -> (shape, its first pool's card type): see card()
        self.waiting_gpus: list[tuple[str, str, int]] = []  # (team, card type, GPUs) for the standing

    def borrows(self, job: RunningJob) -> bool:
        """Whether ``job`` runs on borrowed quota now: its team holds more than its quota on the
        job's card type (a team back within its quota has no reclaimable job, whatever its jobs
        borrowed when they started)."""
        if not self.over or (job.team or self.default_team) not in self.over_teams:
            return False
        pos = self.cluster.position.get(job.gpus[0]) if job.gpus else None
        if pos is None:
            return False
        return (job.team or self.default_team, self.pool_card[int(self.cluster.pool_of[pos])]) in self.over

    def borrows_many(self, cols) -> list[bool]:
        """:meth:`borrows` of every job of the :class:`~..running.RunningColumns` ``cols``, with
        the jobs' first GPUs' positions looked up once (kept with the columns)."""
        n = len(cols.ids)
        if not self.over or cols.cluster is not self.cluster:
            return [False] * n if not self.over else [self.borrows(j) for j in cols.running]
        teams = [t or self.default_team for t in cols.team.tolist()]
        rows = np.array([t in self.over_teams for t in teams], dtype=bool)
        first = cols.first_positions(rows & (cols.ngpus > 0))
        found = rows & (first >= 0)
        card = np.full(n, -1, dtype=np.int64)
        card[found] = self.pool_code[self.cluster.pool_of[first[found]]]
        return [bool(f) and (t, self.cards[c]) in self.over for f, t, c in zip(found.tolist(), teams, card.tolist())]

    def _room(self, team: str) -> np.ndarray:
        """The team's unused quota per card type (of :attr:`cards`), until its accounts change."""
        key = (team, self.book.team_version(team))
        hit = self._rooms.get(key)
        if hit is None:
            rooms = [min(max(self.book.room(team, c), -ROOM_CAP), ROOM_CAP) for c in self.cards]
            hit = self._rooms[key] = np.array(rooms, dtype=np.int64)
        return hit

    def verdict(self, walk, item: Item, shape) -> Verdict:
        """The pools ``item`` may use now. A function of its team's accounts (within quota) or of
        every team's (borrowing) and of its request's pools: one answer per team, stage and shape
        until the accounts change (hundreds of waiting jobs share a few shapes). The answers are
        read-only: the walk only reads them."""
        if item.stage is not Stage.BORROWING:
            key = (item.team, self.book.team_version(item.team), id(shape), False)
        else:
            key = (item.team, self.book.version, id(shape), True)
        hit = self._verdicts.get(key)
        if hit is None or hit[0] is not shape:
            hit = self._verdicts[key] = (shape, self._verdict(item, shape))
        return hit[1]

    def _verdict(self, item: Item, shape) -> Verdict:
        # a cluster has a few pools and card types: plain Python over them (numpy's per-call cost
        # is most of a verdict on arrays of 8)
        gpus, code_of = item.entry.request.gpus, self.pool_code_list
        usable = [i for i, ok in enumerate(shape.ok.tolist()) if ok]
        if item.stage is not Stage.BORROWING:
            room = self._room(item.team).tolist()
            fits = [i for i in usable if room[code_of[i]] >= gpus]
            pools = self._mask(fits)
            return Verdict(pools) if fits else Verdict(pools, refusal=Reason(ReasonKind.QUOTA), defer=True)
        checks: dict[int, object] = {}  # card code -> the book's answer, in pool order: the first refusal says why
        for i in usable:
            if code_of[i] not in checks:
                checks[code_of[i]] = self.book.check(item.team, self.cards[code_of[i]], gpus)
        fits = [i for i in usable if checks[code_of[i]].allowed]
        if not fits:
            why = next((chk.why for chk in checks.values() if not chk.allowed and chk.why), "")
            return Verdict(self._mask(fits), refusal=Reason(ReasonKind.QUOTA, why))
        return Verdict(self._mask(fits), {i: int(checks[code_of[i]].borrow) for i in fits})

    def _mask(self, pools: list[int]) -> np.ndarray:
        """A read-only mask over the cluster's pools with ``pools`` set."""
        out = np.zeros(len(self.pool_card), dtype=bool)
        out[pools] = True
        out.flags.writeable = False
        return out

    def card(self, shape, claim) -> str:
        if claim is not None:
            return self.pool_card[int(self.cluster.pool_of[self.p.positions(claim.gpus[:1])[0]])]
        hit = self._cards.get(id(shape))  # once per shape (its pools do not change in a pass)
        if hit is None or hit[0] is not shape:
            first = int(shape.ok.argmax())  # the first pool it may use (it has one: it was not impossible)
            if not shape.ok[first]:
                raise IndexError("a waiting job with no pool")
            hit = self._cards[id(shape)] = (shape, self.pool_card[first])
        return hit[1]

    def started(self, walk, item: Item, admitted, pool: int) -> None:
        self.book.take(item.team, self.pool_card[pool], item.entry.request.gpus)

    def held(self, walk, item: Item, shape, claim, refused: bool) -> None:
        card = self.card(shape, claim)
        self.waiting_gpus.append((item.team, card, item.entry.request.gpus))
        if item.stage is Stage.WITHIN_QUOTA and not refused:
            self.book.keep(item.team, card, item.entry.request.gpus)

    def note(self, walk, item: Item) -> Reason:
        hit = self._notes.get((item.team, item.stage))  # one per team and stage (a Reason is frozen)
        if hit is None:
            if item.stage is Stage.WITHIN_QUOTA:
                hit = Reason(ReasonKind.NOTE, f"team {item.team}: within its quota (kept for it while it waits)")
            else:
                hit = Reason(ReasonKind.NOTE, f"team {item.team}: borrows above its quota")
            self._notes[(item.team, item.stage)] = hit
        return hit

    def finish(self, walk, result):
        if self.explain:  # the simulator (explain=False) does not read the standing
            result.teams = self.book.standing(self.waiting_gpus)
        return result


def _card_codes(adm, pool_code: np.ndarray, ncards: int) -> tuple[np.ndarray, np.ndarray]:
    """Each GPU's card-type code and the healthy GPUs per card type: a function of the cluster
    and its health, kept with the admission's per-cluster state (``KeptHeld.memo``)."""
    def compute():
        c = adm.cluster
        gpu_code = pool_code[c.pool_of] if len(c.gpus) else np.zeros(0, dtype=np.int64)
        gpu_code.flags.writeable = False
        return gpu_code, np.bincount(gpu_code[adm.healthy], minlength=ncards)

    kept = getattr(adm, "kept_held", None)
    return compute() if kept is None else kept.memo(("card codes", pool_code.tobytes(), ncards), compute)


def holdings(p, quotas: QuotaInput, reserved: Mapping[GpuKey, str], cards: list[str],
             gpu_code: np.ndarray) -> dict[tuple[str, str], int]:
    """(team, card type) -> GPUs its live reservations hold (counted with numpy: a fleet of
    10,000 GPUs has about as many reservations, every pass). Kept between passes while the
    reservations, the jobs' teams and the card types are equal (``KeptHeld.holdings``)."""
    if not reserved:
        return {}
    kept = getattr(p.adm, "kept_held", None)
    if kept is None or p.serial is None:
        return _count(p, quotas, cards, gpu_code)
    return kept.holdings(p.serial, quotas.team_of, (quotas.default_team, tuple(cards)),
                         lambda: _count(p, quotas, cards, gpu_code))


def _count(p, quotas: QuotaInput, cards: list[str], gpu_code: np.ndarray) -> dict[tuple[str, str], int]:
    names = list(dict.fromkeys([quotas.default_team, *quotas.team_of.values()]))
    index = {t: i for i, t in enumerate(names)}
    pos, jobs = p.reserved_positions()
    # each holder's team, then its number (a job no team names: the default team's, number 0)
    teams = map(quotas.team_of.get, jobs, itertools.repeat(quotas.default_team))
    codes = np.fromiter(map(index.__getitem__, teams), dtype=np.int64, count=len(jobs))
    found = pos >= 0
    found[found] = p.held[pos[found]]  # with a reserved_mask, only the GPUs it marks held
    counts = np.bincount(codes[found] * len(cards) + gpu_code[pos[found]], minlength=len(names) * len(cards))
    return {(names[i // len(cards)], cards[i % len(cards)]): int(counts[i]) for i in np.flatnonzero(counts).tolist()}
