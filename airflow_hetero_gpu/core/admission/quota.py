"""Teams and their GPU quotas: the arithmetic the admission pass applies (docs/teams.md).

A team has, per card-type pattern (the ``--gpu-type`` matching rules, ``"*"`` any card), a
``quota`` (GPUs it is entitled to), an optional ``borrowing_limit`` (how far above its quota it may
go on others' idle quota; absent: unlimited) and ``lending_limit`` (how much of its idle quota
others may use; absent: all of it), and a fair-share ``weight``.

* **Buckets.** Each (team, pattern) is a bucket. A team's GPUs of card type C fill its buckets
  whose pattern matches C, most specific first (an exact name before a glob, a longer glob before
  a shorter one, ``"*"`` last); what no bucket has room for is **borrowed** and is counted against
  the team's most specific bucket for C (its *home* bucket, whose ``borrowing_limit`` caps it).
  A card type none of the team's patterns matches has quota 0 and unlimited borrowing.
* **Pending.** A job within its team's unused quota that cannot start yet keeps that quota for
  itself: it is not idle, so nobody borrows it while the job waits.
* **Lending.** Borrowed GPUs must be covered by idle lendable quota: each bucket of another team
  lends ``min(idle, lending_limit)`` to card types its pattern matches, and GPUs of the fleet that
  no quota covers (fleet size minus the sum of the quotas) are lent to anyone. The cover is a
  flow from card types to lenders (networkx' maximum flow); a borrow is allowed only while every
  borrowed GPU is covered.
* **Fair share** of a team: ``(GPUs borrowed now + decayed borrowed GPU-seconds · ln 2 / half-life)
  / weight``, the decayed average of its usage above quota, per unit of weight. Among jobs that
  borrow, the lowest value goes first.

Pure data in, pure data out: the applied teams file (:mod:`~airflow_hetero_gpu.core.admission.teams`),
the teams of running and queued jobs, the decayed history; :class:`QuotaBook` keeps one pass's
accounts.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import networkx as nx

from airflow_hetero_gpu.core.admission.teams import (  # noqa: F401  (re-exported: the vocabulary of quotas)
    DEFAULT_TEAM, DEFAULT_USAGE_HALF_LIFE_S, TeamQuota, Teams, TeamsError, matches, parse_duration, specificity,
    teams_from_mapping, teams_from_text, valid_team_name,
)


def decay(value: float, elapsed_s: float, half_life_s: float) -> float:
    """``value`` after ``elapsed_s`` seconds of halving every ``half_life_s``."""
    return value * 0.5 ** (max(0.0, elapsed_s) / half_life_s)


def share_value(borrowed_now: int, decayed_gpu_s: float, weight: float, half_life_s: float) -> float:
    """The fair-share value (lower goes first): usage above quota, now plus decayed history
    (as an average number of GPUs), per unit of weight."""
    return (borrowed_now + decayed_gpu_s * math.log(2) / half_life_s) / weight


@functools.lru_cache(maxsize=4096)
def max_cover(need: tuple[tuple[str, int], ...], lenders: tuple[tuple[tuple[str, str], int], ...],
              uncovered: int) -> tuple[int, tuple[tuple[tuple[str, str], int], ...]]:
    """The cover of borrowed GPUs ``need`` ((card type, GPUs), ...) by ``lenders`` (((team,
    pattern), GPUs it lends), ...) and the ``uncovered`` GPUs of the fleet: a maximum flow from card
    types to the lenders whose pattern matches them. Returns how many are covered and how many
    each lender covers. A pure function of its arguments, so its answers are kept across passes:
    a steady queue asks the same questions of the same accounts every pass."""
    total = sum(n for _, n in need)
    g = nx.DiGraph()
    for c, n in need:
        g.add_edge("src", ("type", c), capacity=n)
        if uncovered:
            g.add_edge(("type", c), "uncovered", capacity=n)
        for (team, p), supply in lenders:
            if matches(c, p):
                g.add_edge(("type", c), ("lender", team, p), capacity=n)
    if uncovered:
        g.add_edge("uncovered", "sink", capacity=uncovered)
    for (team, p), supply in lenders:
        g.add_edge(("lender", team, p), "sink", capacity=supply)
    if "sink" not in g:
        return 0, ()
    value, flow = nx.maximum_flow(g, "src", "sink")
    lent = []
    for (team, p), _ in lenders:
        got = flow.get(("lender", team, p), {}).get("sink", 0)
        if got:
            lent.append(((team, p), int(got)))
    return min(int(value), total), tuple(lent)


# --- one pass's accounts -------------------------------------------------------------------------
@dataclass(frozen=True)
class QuotaCheck:
    """What a team's job of ``gpus`` GPUs on one card type would do: ``borrow`` of them above
    quota (0: within quota); ``allowed`` False with ``why`` when quota forbids it now."""

    card_type: str
    gpus: int
    borrow: int
    allowed: bool
    why: str = ""


@dataclass
class BucketStanding:
    """One row of ``hetero-gpu teams``: a team's pattern (``""``: card types it has no quota for)."""

    team: str
    pattern: str
    quota: int
    in_use: int = 0
    borrowed: int = 0
    lent: int = 0
    waiting: int = 0
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    def to_json(self) -> dict:
        return {"team": self.team, "pattern": self.pattern or None, "quota": self.quota, "in_use": self.in_use,
                "borrowed": self.borrowed, "lent": self.lent, "waiting": self.waiting,
                "borrowing_limit": self.borrowing_limit, "lending_limit": self.lending_limit}


class QuotaBook:
    """The quota accounts of one admission pass: GPUs in use per team and card type, quota kept
    for waiting jobs within quota, and the borrowed GPUs' cover by lenders."""

    def __init__(self, teams: Teams, card_counts: Mapping[str, int],
                 usage: Mapping[tuple[str, str], int], history: Mapping[str, float] | None = None,
                 *, reasons: bool = True) -> None:
        """``card_counts``: GPUs of the fleet per card type; ``usage``: (team, card type) -> GPUs
        its running jobs hold; ``history``: team -> decayed borrowed GPU-seconds; ``reasons``
        False: refusals carry no text (the simulator)."""
        self.reasons = reasons
        self.teams = teams
        self.card_counts = dict(card_counts)
        self.usage: dict[tuple[str, str], int] = {k: v for k, v in usage.items() if v}
        self.pending: dict[tuple[str, str], int] = {}  # kept for waiting jobs within quota
        self.history = dict(history or {})
        self.uncovered = max(0, sum(self.card_counts.values()) - sum(
            n for t in teams.teams.values() for n in t.quota.values()))
        self._buckets: dict[tuple[str, str], tuple[str, ...]] = {}
        self._others: dict[tuple[str, str], int] = {}  # see _others_quota
        self._fill_cache: dict[str, tuple[dict, dict]] | None = None
        self._failed: dict[tuple[str, str], QuotaCheck] = {}  # smallest refused borrow per (team, card)
        self._answers: tuple[object, dict[tuple[str, str, int], QuotaCheck]] = (None, {})  # see check()
        self._explained: tuple[object, dict[tuple[str, str], str]] = (None, {})  # see explain()
        self._at: tuple[object, tuple] = (None, ())  # see _now()
        self.version = 0  # every change of the accounts adds one (callers keep answers per version)
        self.team_versions: dict[str, int] = {}  # the same per team (see team_version)

    # --- per team ----------------------------------------------------------------------------
    def buckets(self, team: str, card_type: str) -> tuple[str, ...]:
        """The team's patterns matching ``card_type``, most specific first."""
        key = (team, card_type)
        hit = self._buckets.get(key)
        if hit is None:
            hit = self._buckets[key] = tuple(p for p in self.teams.get(team).patterns if matches(card_type, p))
        return hit

    def _fill(self, team: str) -> tuple[dict[str, int], dict[str, int]]:
        """Team's bucket use (pattern -> GPUs within quota, pending included) and borrowed GPUs
        per card type."""
        if self._fill_cache is None:
            self._fill_cache = {}
        hit = self._fill_cache.get(team)
        if hit is not None:
            return hit
        tq = self.teams.get(team)
        used = {p: 0 for p in tq.quota}
        borrowed: dict[str, int] = {}
        # the card types others lend least are filled first: what is left over (borrowed) falls
        # where other teams' quota can cover it
        types = sorted({c for (t, c) in (*self.usage, *self.pending) if t == team},
                       key=lambda c: (self._others_quota(team, c), c))
        for c in types:
            n = self.usage.get((team, c), 0) + self.pending.get((team, c), 0)
            for p in self.buckets(team, c):
                take = min(n, tq.quota[p] - used[p])
                used[p] += take
                n -= take
            if n:
                borrowed[c] = n
        hit = self._fill_cache[team] = (used, borrowed)
        return hit

    def _others_quota(self, team: str, card_type: str) -> int:
        """The other teams' quota for ``card_type`` (a function of the teams file: kept)."""
        hit = self._others.get((team, card_type))
        if hit is None:
            hit = self._others[(team, card_type)] = sum(n for name, tq in self.teams.teams.items() if name != team
                                                        for p, n in tq.quota.items() if matches(card_type, p))
        return hit

    def room(self, team: str, card_type: str) -> int:
        """Unused quota of ``team`` for ``card_type`` (pending quota counts as used)."""
        tq = self.teams.get(team)
        used, _ = self._fill(team)
        return sum(tq.quota[p] - used[p] for p in self.buckets(team, card_type))

    def borrowed(self, team: str) -> int:
        return sum(self._fill(team)[1].values())

    def borrowed_by_card(self, team: str) -> dict[str, int]:
        """GPUs ``team`` holds above its quota, per card type (pending quota counts as held)."""
        return dict(self._fill(team)[1])

    def fair_share(self, team: str) -> float:
        tq = self.teams.get(team)
        return share_value(self.borrowed(team), self.history.get(team, 0.0), tq.weight,
                           self.teams.usage_half_life_s)

    def _home_borrowed(self, team: str, pattern: str | None) -> int:
        _, borrowed = self._fill(team)
        return sum(n for c, n in borrowed.items() if (self.buckets(team, c)[:1] or (None,))[0] == pattern)

    # --- lending -----------------------------------------------------------------------------
    def _lenders(self) -> dict[tuple[str, str], int]:
        """(team, pattern) -> GPUs it lends now: min(idle quota, lending limit). Computed once per
        version of the accounts (with the demand of every team, see :meth:`_demand`); read-only."""
        return self._now()[0]

    def _now(self) -> tuple[dict, tuple, dict]:
        """The lenders, the lenders sorted (:func:`max_cover`'s argument) and every team's
        borrowed GPUs per card type, for the accounts as they are (kept per version)."""
        if self._at[0] != self.version:
            lenders = self._lenders_now()
            self._at = (self.version, (lenders, tuple(sorted(lenders.items())), self._demand_now()))
        return self._at[1]

    def _lenders_now(self) -> dict[tuple[str, str], int]:
        out = {}
        for name, tq in self.teams.teams.items():
            used, _ = self._fill(name)
            for p, q in tq.quota.items():
                idle = q - used[p]
                limit = tq.lending_limit.get(p)
                n = idle if limit is None else min(idle, limit)
                if n > 0:
                    out[(name, p)] = n
        return out

    def _demand(self, extra: tuple[str, str, int] | None = None) -> dict[str, int]:
        """Borrowed GPUs per card type, every team (plus ``extra``: a job being considered)."""
        out = dict(self._now()[2])
        if extra is not None:
            out[extra[1]] = out.get(extra[1], 0) + extra[2]
        return out

    def _demand_now(self) -> dict[str, int]:
        out: dict[str, int] = {}
        teams = {t for (t, _) in (*self.usage, *self.pending)}
        for team in teams:
            for c, n in self._fill(team)[1].items():
                out[c] = out.get(c, 0) + n
        return out

    def cover(self, demand: Mapping[str, int]) -> tuple[int, dict[tuple[str, str], int]]:
        """How many of the borrowed GPUs lenders can cover, and how many each lender covers."""
        need = tuple(sorted((c, n) for c, n in demand.items() if n > 0))
        if not need:
            return 0, {}
        value, lent = max_cover(need, self._now()[1], self.uncovered)
        return value, dict(lent)

    # --- a job -------------------------------------------------------------------------------
    def check(self, team: str, card_type: str, gpus: int) -> QuotaCheck:
        """Whether ``team`` may take ``gpus`` GPUs of ``card_type`` now, and how many it borrows.
        A function of the accounts: answered once per (team, card type, GPUs) until they change
        (an explaining pass asks it for hundreds of waiting borrowers with a few shapes)."""
        if self._answers[0] != self.version:
            self._answers = (self.version, {})
        key = (team, card_type, gpus)
        hit = self._answers[1].get(key)
        if hit is None:
            hit = self._answers[1][key] = self._check(team, card_type, gpus)
        return hit

    def _check(self, team: str, card_type: str, gpus: int) -> QuotaCheck:
        room = max(0, self.room(team, card_type))
        borrow = max(0, gpus - room)
        if not borrow:
            return QuotaCheck(card_type, gpus, 0, True)
        refused = self._failed.get((team, card_type))
        if refused is not None and refused.gpus <= gpus:  # a larger borrow is refused too
            return QuotaCheck(card_type, gpus, borrow, False, self._why(team, card_type, gpus))
        out = self._check_borrow(team, card_type, gpus, borrow)
        if not out.allowed:
            self._failed[(team, card_type)] = out
        return out

    def _check_borrow(self, team: str, card_type: str, gpus: int, borrow: int) -> QuotaCheck:
        tq = self.teams.get(team)
        home = (self.buckets(team, card_type)[:1] or (None,))[0]
        limit = tq.borrowing_limit.get(home) if home is not None else None
        if limit is not None and self._home_borrowed(team, home) + borrow > limit:
            return QuotaCheck(card_type, gpus, borrow, False, self._why(team, card_type, gpus))
        demand = self._demand((team, card_type, borrow))
        covered, _ = self.cover(demand)
        if covered < sum(demand.values()):
            return QuotaCheck(card_type, gpus, borrow, False, self._why(team, card_type, gpus))
        return QuotaCheck(card_type, gpus, borrow, True)

    def _why(self, team: str, card_type: str, gpus: int) -> str:
        return self.explain(team, card_type, gpus) if self.reasons else ""

    def take(self, team: str, card_type: str, gpus: int) -> None:
        """A job of ``team`` started on ``gpus`` GPUs of ``card_type``."""
        key = (team, card_type)
        self.usage[key] = self.usage.get(key, 0) + gpus
        self._changed(team)

    def keep(self, team: str, card_type: str, gpus: int) -> None:
        """A job within quota waits: its quota is kept for it (not lent)."""
        key = (team, card_type)
        self.pending[key] = self.pending.get(key, 0) + gpus
        self._changed(team)

    def _changed(self, team: str) -> None:
        """``team``'s accounts changed: its fill is computed again; every borrow is asked again."""
        if self._fill_cache is not None:
            self._fill_cache.pop(team, None)
        self._failed.clear()
        self.version += 1
        self.team_versions[team] = self.team_versions.get(team, 0) + 1

    def team_version(self, team: str) -> int:
        """Changes whenever ``team``'s own accounts do (what :meth:`room` answers depends on)."""
        return self.team_versions.get(team, 0)

    def explain(self, team: str, card_type: str, gpus: int) -> str:
        """``team intern: 4/4 of its quota in use, may borrow 4; borrowable now 0 (prod lends 0 of
        its idle 8); needs 4``: where quota stands for a job of ``team`` on ``card_type``. All but
        the last part is written once per team and card type until the accounts change."""
        if self._explained[0] != self.version:
            self._explained = (self.version, {})
        text = self._explained[1].get((team, card_type))
        if text is None:
            text = self._explained[1][(team, card_type)] = self._standing_text(team, card_type)
        return f"{text}; needs {gpus}"

    def _standing_text(self, team: str, card_type: str) -> str:
        tq = self.teams.get(team)
        pats = self.buckets(team, card_type)
        used, _ = self._fill(team)
        quota = sum(tq.quota[p] for p in pats)
        home = pats[0] if pats else None
        in_use = sum(used[p] for p in pats)
        now_borrowed = self._home_borrowed(team, home)
        limit = tq.borrowing_limit.get(home) if home is not None else None
        may = "may borrow without limit" if limit is None else \
            f"may borrow {max(0, limit - self._home_borrowed(team, home))}"
        demand = self._demand()
        covered, lent = self.cover(demand)
        lenders = self._lenders()
        supply = sum(n for (t, p), n in lenders.items() if t != team and matches(card_type, p))
        free_for_it = max(0, supply + self.uncovered - covered)
        parts = []
        for name, other in sorted(self.teams.teams.items()):
            if name == team:
                continue
            o_used, _ = self._fill(name)
            for p in other.patterns:
                if not matches(card_type, p):
                    continue
                idle = max(0, other.quota[p] - o_used[p])
                kept = sum(n for (t, c), n in self.pending.items() if t == name and matches(c, p))
                if not idle and not kept:  # all in use: nothing it could lend
                    continue
                lend = lenders.get((name, p), 0) - lent.get((name, p), 0)
                text = f"{name} lends {max(0, lend)} of its idle {idle}"
                limit = other.lending_limit.get(p)
                more = [f"{lent[(name, p)]} already lent"] if lent.get((name, p)) else []
                more += [f"{kept} kept for its waiting jobs"] if kept else []
                more += [f"lending limit {limit}"] if limit is not None else []
                parts.append(text + (f" ({', '.join(more)})" if more else ""))
        if self.uncovered:
            parts.append(f"{self.uncovered} GPUs outside every quota")
        where = f" ({'; '.join(parts)})" if parts else ""
        borrowed_text = f", {now_borrowed} borrowed" if now_borrowed else ""
        return (f"team {team}: {in_use}/{quota} of its quota in use{borrowed_text}, {may}; "
                f"borrowable now {free_for_it}{where}")

    # --- the standing ------------------------------------------------------------------------
    def standing(self, waiting: Sequence[tuple[str, str, int]] = ()) -> list[BucketStanding]:
        """Per team and pattern: quota, in use, borrowed, lent, waiting GPUs (``waiting``: (team,
        card type, GPUs) of the jobs that wait, counted against their home bucket)."""
        demand = self._demand()
        _, lent = self.cover(demand)
        names = sorted(set(self.teams.teams) | {t for (t, _) in self.usage} | {t for (t, _, _) in waiting})
        rows: list[BucketStanding] = []
        for name in names:
            tq = self.teams.get(name)
            real = {k: v for k, v in self.usage.items() if k[0] == name}
            saved, self.pending, self._fill_cache = self.pending, {}, None
            orig_usage = self.usage
            self.usage = real
            used, borrowed = self._fill(name)
            self.usage, self.pending, self._fill_cache = orig_usage, saved, None
            by_pattern = {p: BucketStanding(name, p, tq.quota[p], used[p], 0, lent.get((name, p), 0), 0,
                                            tq.borrowing_limit.get(p), tq.lending_limit.get(p))
                          for p in tq.patterns}
            other = BucketStanding(name, "", 0)
            for c, n in borrowed.items():
                home = self.buckets(name, c)[:1]
                row = by_pattern[home[0]] if home else other
                row.borrowed += n
                row.in_use += n
            for team, c, n in waiting:
                if team == name:
                    home = self.buckets(name, c)[:1]
                    (by_pattern[home[0]] if home else other).waiting += n
            rows.extend(by_pattern.values())
            if other.in_use or other.waiting or not by_pattern:
                rows.append(other)
        return rows


@dataclass(frozen=True)
class TeamUse:
    """A team's GPUs in use now and how many of them are borrowed (above its quota), per card type."""

    in_use: int
    borrowed: int
    borrowed_by_card: Mapping[str, int]


def team_use(teams: Teams, usage: Mapping[tuple[str, str], int]) -> dict[str, TeamUse]:
    """Each team's use and borrowing, computed from what its jobs hold now (``usage``: (team, card
    type) -> GPUs held), the way Kueue does it: a team borrows what it holds above its quota now,
    whichever of its jobs started first. The one meaning of "borrowed": the standing, the fair-share
    history, the reclaim candidates and the page all read it (docs/teams.md). A team back within its
    quota borrows nothing, whatever it borrowed when its jobs started."""
    book = QuotaBook(teams, {}, usage)
    out = {}
    for team in sorted({t for (t, _) in usage} | set(teams.teams)):
        by_card = book.borrowed_by_card(team)
        out[team] = TeamUse(sum(n for (t, _), n in usage.items() if t == team), sum(by_card.values()), by_card)
    return out


def card_counts(card_types: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in card_types:
        out[c] = out.get(c, 0) + 1
    return out


__all__ = ["DEFAULT_TEAM", "DEFAULT_USAGE_HALF_LIFE_S", "TeamsError", "TeamQuota", "Teams", "QuotaBook",
           "QuotaCheck", "BucketStanding", "TeamUse", "team_use", "teams_from_mapping", "decay", "share_value", "specificity",
           "matches", "card_counts", "parse_duration", "teams_from_text", "valid_team_name"]
