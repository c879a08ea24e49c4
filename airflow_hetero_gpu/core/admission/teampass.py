"""The admission pass with team quotas (docs/teams.md): the same steps as without (start now,
head and claim, backfill, impossible), walked in two rounds.

1. **Within quota.** The queue in its order (priority with aging), only the jobs that fit their
   team's unused quota on some pool they accept; they may use only such pools. One that cannot
   start keeps its quota (nobody borrows it) and becomes a head or waits as usual.
2. **Borrowing.** The rest, team by team, lowest fair-share value first (re-evaluated after every
   admission; ties to the job first in the queue): a job starts only on pools where quota lets it
   borrow (idle lendable quota of other teams, up to its borrowing limit); blocked by quota, it
   waits with the quota's standing as its reason and claims nothing.

So an in-quota job is never held behind a borrowing job's claim (borrowing heads claim after every
in-quota job of the pass), and no team goes above quota + borrowing limit.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from airflow_hetero_gpu.core.admission.claims import claim_for
from airflow_hetero_gpu.core.admission.model import Admitted, QueueEntry
from airflow_hetero_gpu.core.admission.order import ordinal
from airflow_hetero_gpu.core.admission.passstate import PassState, Shape
from airflow_hetero_gpu.core.admission.quota import DEFAULT_TEAM, QuotaBook, Teams
from airflow_hetero_gpu.core.model import GpuKey


@dataclass(frozen=True)
class QuotaInput:
    """What a pass with teams needs besides the queue: the applied teams, the team of every job
    holding GPUs (absent: the default team) and each team's decayed borrowed GPU-seconds."""

    teams: Teams
    team_of: Mapping[str, str] = field(default_factory=dict)
    history: Mapping[str, float] = field(default_factory=dict)
    default_team: str = DEFAULT_TEAM


def team_of(entry: QueueEntry, quotas: QuotaInput) -> str:
    return entry.team or quotas.default_team


class TeamWalk:
    """One pass's walk with quotas; ``adm`` is the Admission, ``p`` the pass state."""

    def __init__(self, adm, p: PassState, quotas: QuotaInput, reserved: Mapping[GpuKey, str] | None,
                 explain: bool, pre=None) -> None:
        self.adm, self.p, self.quotas, self.explain = adm, p, quotas, explain
        self.pre = pre  # preemption.PassPreemption, or None: preemption off
        c = adm.cluster
        self.pool_card = [pool.card_type for pool in c.pools]
        self.cards = cards = sorted(set(self.pool_card))
        self.pool_code = np.array([cards.index(t) for t in self.pool_card], dtype=np.int64)
        gpu_code = self.pool_code[c.pool_of] if len(c.gpus) else np.zeros(0, dtype=np.int64)
        healthy = np.bincount(gpu_code[adm.healthy], minlength=len(cards))
        self.book = QuotaBook(quotas.teams, {t: int(n) for t, n in zip(cards, healthy.tolist()) if n},
                              self._usage(p, quotas, reserved or {}, cards, gpu_code), quotas.history,
                              reasons=explain)
        self._rooms: dict[tuple[str, int], np.ndarray] = {}  # see _room()
        self.admitted: list[Admitted] = []
        self.waiting: list[tuple] = []
        self.waiting_gpus: list[tuple[str, str, int]] = []  # (team, card type, GPUs) for the standing
        self.position = 0

    @staticmethod
    def _usage(p: PassState, quotas: QuotaInput, reserved: Mapping[GpuKey, str], cards: list[str],
               gpu_code: np.ndarray) -> dict[tuple[str, str], int]:
        """(team, card type) -> GPUs its live reservations hold (counted with numpy: a fleet of
        10,000 GPUs has about as many reservations, every pass)."""
        if not reserved:
            return {}
        names = list(dict.fromkeys([quotas.default_team, *quotas.team_of.values()]))
        index = {t: i for i, t in enumerate(names)}
        job_code = {job: index[t] for job, t in quotas.team_of.items()}
        codes = np.fromiter(map(job_code.get, reserved.values(), itertools.repeat(0)), dtype=np.int64,
                            count=len(reserved))
        pos = p.reserved_positions()
        found = pos >= 0
        found[found] = p.held[pos[found]]  # with a reserved_mask, only the GPUs it marks held
        counts = np.bincount(codes[found] * len(cards) + gpu_code[pos[found]], minlength=len(names) * len(cards))
        return {(names[i // len(cards)], cards[i % len(cards)]): int(counts[i]) for i in np.flatnonzero(counts).tolist()}

    # --- helpers ---------------------------------------------------------------------------------
    def _mask(self, pools: np.ndarray) -> np.ndarray | None:
        """GPUs outside the pools in ``pools`` (None when that is nothing to add)."""
        return ~pools[self.adm.cluster.pool_of]

    def _room(self, team: str) -> np.ndarray:
        """The team's unused quota per card type (of :attr:`cards`), until its accounts change."""
        key = (team, self.book.team_version(team))
        hit = self._rooms.get(key)
        if hit is None:
            hit = self._rooms[key] = np.array([self.book.room(team, c) for c in self.cards], dtype=np.int64)
        return hit

    def _pools(self, team: str, shape: Shape, gpus: int, *, borrowing: bool) -> tuple[np.ndarray, dict[int, int], str]:
        """Pools the job may use now: within quota (``borrowing`` False) or by borrowing; the
        borrowed GPUs per such pool, and the quota's reason when there are none. Quota is a
        matter of card type: one question per card type, not per pool."""
        if not borrowing:
            return shape.ok & (self._room(team)[self.pool_code] >= gpus), {}, ""
        codes = list(dict.fromkeys(self.pool_code[shape.ok].tolist()))  # in pool order: the first refusal says why
        allowed = np.zeros(len(self.cards), dtype=bool)
        borrowed = np.zeros(len(self.cards), dtype=np.int64)
        why = ""
        for code in codes:
            card = self.cards[code]
            chk = self.book.check(team, card, gpus)
            allowed[code], borrowed[code] = chk.allowed, chk.borrow
            if not chk.allowed and not why:
                why = chk.why
        ok = shape.ok & allowed[self.pool_code]
        borrow = {i: int(borrowed[self.pool_code[i]]) for i in np.flatnonzero(ok).tolist()}
        return ok, borrow, why

    def _card(self, shape: Shape, claim) -> str:
        if claim is not None:
            return self.pool_card[int(self.adm.cluster.pool_of[self.p.positions(claim.gpus[:1])[0]])]
        return self.pool_card[int(np.flatnonzero(shape.ok)[0])]

    def _wait(self, entry, state, claim, shape, heads, note, team, card) -> None:
        self.position += 1
        self.waiting.append((self.position, entry, state, claim, shape, heads, note))
        if state != "impossible":
            self.waiting_gpus.append((team, card, entry.request.gpus))

    def _try(self, rank: int, entry: QueueEntry, shape: Shape, pools: np.ndarray, borrow: dict[int, int],
             team: str) -> bool:
        """Start the job on ``pools`` now; True when it started."""
        sub = shape if np.array_equal(pools, shape.ok) else Shape(shape.request, pools, shape.rejected)
        if sub.dead and not entry.claim:
            return False
        placement = self.p.try_start(entry, sub, None if sub is shape else self._mask(pools))
        if placement is None:
            return False
        p = self.p
        pos = p.admit(entry.job_id, placement.gpus)
        pool_i = int(self.adm.cluster.pool_of[pos[0]])
        pool = placement.pool or self.adm.cluster.pools[pool_i].id
        decision = placement.result.decision if placement.result is not None else None
        card = self.pool_card[pool_i]
        borrowed = borrow.get(pool_i, 0)
        self.book.take(team, card, entry.request.gpus)
        self.admitted.append(Admitted(entry.job_id, rank, tuple(placement.gpus), pool, decision, team, borrowed))
        return True

    def _hold(self, entry, shape: Shape, pools: np.ndarray, team: str, note: tuple, *, within: bool) -> str:
        """A job that could use ``pools`` but did not start: head (with a claim) or waiting. With
        preemption on, a job may first stop lower-priority jobs of its team, and a job ``within``
        its quota also other teams' jobs that run on borrowed quota (docs/preemption.md)."""
        sub = shape if np.array_equal(pools, shape.ok) else Shape(shape.request, pools, shape.rejected)
        claim = self.pre.claim(self.p, entry, sub, reclaim=within) if self.pre is not None else None
        if claim is None:
            claim = None if sub.dead and not entry.claim else claim_for(self.p, entry, sub)
        if claim is None:
            sub.dead = True
        card = self._card(sub, claim)
        state = "head" if claim is not None else "waiting"
        self._wait(entry, state, claim, sub, [] if claim else self.p.heads_for(sub.ok), note, team, card)
        return card

    # --- the two rounds ----------------------------------------------------------------------
    def walk(self, entries, shape_of) -> None:
        deferred: list[tuple[int, QueueEntry, Shape]] = []
        for rank, entry in enumerate(entries, 1):
            shape = shape_of(entry)
            team = team_of(entry, self.quotas)
            if not shape.ok.any():
                self._wait(entry, "impossible", None, shape, [], ("note", ""), team, "")
                continue
            pools, borrow, _ = self._pools(team, shape, entry.request.gpus, borrowing=False)
            if not pools.any():
                deferred.append((rank, entry, shape))
                continue
            if self._try(rank, entry, shape, pools, borrow, team):
                continue
            card = self._hold(entry, shape, pools, team, self._note(team, entry, within=True), within=True)
            self.book.keep(team, card, entry.request.gpus)
        self._borrowers(deferred)

    def _borrowers(self, deferred: list[tuple[int, QueueEntry, Shape]]) -> None:
        by_team: dict[str, list[tuple[int, QueueEntry, Shape]]] = {}
        for item in deferred:
            by_team.setdefault(team_of(item[1], self.quotas), []).append(item)
        while by_team:
            team = min(by_team, key=lambda t: (self.book.fair_share(t), by_team[t][0][0], t))
            queue = by_team[team]
            while queue:
                rank, entry, shape = queue.pop(0)
                pools, borrow, why = self._pools(team, shape, entry.request.gpus, borrowing=True)
                if not pools.any():
                    self._wait(entry, "waiting", None, shape, [], ("quota", why), team, self._card(shape, None))
                    continue
                if self._try(rank, entry, shape, pools, borrow, team):
                    break
                self._hold(entry, shape, pools, team, self._note(team, entry, within=False), within=False)
            if not queue:
                del by_team[team]

    def _note(self, team: str, entry: QueueEntry, *, within: bool) -> tuple[str, str]:
        """What the job's reason adds: ("note", text) after the usual reason."""
        if not self.explain:
            return ("note", "")
        if within:
            return ("note", f"team {team}: within its quota (kept for it while it waits)")
        return ("note", f"team {team}: borrows above its quota")


def quota_reason(position: int, why: str) -> str:
    """The reason of a job that quota stops: ``3rd in the queue, blocked by quota: team intern: …``."""
    lead = "head of the queue" if position == 1 else f"{ordinal(position)} in the queue"
    return f"{lead}, blocked by quota: {why}"
