"""Teams in the ledger: the teams' repository (docs/teams.md): the applied quotas, the fair-share
history, and each team's standing.

* :meth:`TeamQuotas.apply_teams` replaces every team's quota in one transaction (atomic; applying
  the same file again changes nothing) after checking every pattern against the fleet's card
  types, and runs an admission pass (quotas changed what may start).
* Inside every admission pass (:mod:`airflow_hetero_gpu.ledger.admission`) :func:`quota_input`
  reads the quotas, the team of every reservation and the decayed history, and
  :func:`record_usage` brings ``team_usage`` up to now (the borrowed GPUs held since the last
  pass, decayed by the half-life) and adds a ``team_samples`` row per team whose use changed.
* :meth:`TeamQuotas.team_standing` reads, per team and pattern: quota, in use, borrowed, lent,
  waiting, and each team's fair-share value.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import TYPE_CHECKING, Any, Mapping

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection

from airflow_hetero_gpu.core.admission.quota import (
    DEFAULT_TEAM, QuotaBook, TeamQuota, Teams, decay, matches, share_value, team_use,
)
from airflow_hetero_gpu.core.admission.teams import (
    AIRFLOW_TEAM, DEFAULT_USAGE_HALF_LIFE_S, MAX_GPUS, MAX_JOBS_LIMIT, MAX_WEIGHT, MIN_HALF_LIFE_S, MIN_WEIGHT,
    teams_from_mapping,
)
from airflow_hetero_gpu.durations import MAX_DURATION_S
from airflow_hetero_gpu.core.admission.rules.team_quota import QuotaInput
from airflow_hetero_gpu.ledger.schema import queue_entries as q_t
from airflow_hetero_gpu.ledger.schema import reservations as res_t
from airflow_hetero_gpu.ledger.schema import team_samples, team_settings, team_usage
from airflow_hetero_gpu.ledger.schema import teams as teams_t

if TYPE_CHECKING:
    from airflow_hetero_gpu.ledger.base import LedgerDatabase
    from airflow_hetero_gpu.ledger.unit_of_work import UnitOfWork

HALF_LIFE_KEY = "usage_half_life_s"
#: pool id -> card type of the pools reservations were made in: what the teams' holdings are
#: counted by, read without building the inventory's cluster. A pool's id is made of its card type
#: and task types (``Pool.make_id``), so an entry never goes stale; the map grows only with the
#: fleet's pools, and is rewritten whole past :data:`MAX_POOL_CARDS`.
POOL_CARDS_KEY = "pool_cards"
MAX_POOL_CARDS = 10_000
#: The most decayed borrowed GPU-seconds a team can have: every GPU of a fleet at the bound borrowed
#: for ever, at the longest half-life (sum of the decayed series: borrowed × half-life / ln 2).
MAX_DECAYED_GPU_S = MAX_GPUS * MAX_DURATION_S / math.log(2)

log = logging.getLogger(__name__)


def finite_usage(team: str, value: object, what: str = "decayed borrowed GPU-seconds") -> float:
    """A team's fair-share history as the ledger may store it: a finite number in
    [0, MAX_DECAYED_GPU_S]. Anything else (NaN or infinity left by an older release, a bad number
    read back) is clamped, with a warning naming the team and the value: it never reaches the table,
    where NaN is a NOT NULL failure on SQLite and a stored ``nan`` on PostgreSQL."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    if math.isfinite(number) and 0.0 <= number <= MAX_DECAYED_GPU_S:
        return number
    clamped = MAX_DECAYED_GPU_S if number == math.inf or (math.isfinite(number) and number > 0) else 0.0
    log.warning("team %s: %s %r is not a finite number in [0, %.0f]: stored as %.0f", team, what, value,
                MAX_DECAYED_GPU_S, clamped)
    return clamped


def has_teams(conn: Connection) -> bool:
    """Whether teams are configured (one indexed read; :func:`read_teams` parses them)."""
    return conn.execute(select(teams_t.c.name).limit(1)).first() is not None


def read_teams(conn: Connection) -> Teams | None:
    """The applied teams, or None when none is configured."""
    rows = list(conn.execute(select(teams_t.c.name, teams_t.c.spec)))
    if not rows:
        return None
    half = conn.execute(select(team_settings.c.value).where(team_settings.c.key == HALF_LIFE_KEY)).scalar()
    out = {}
    for name, spec in rows:
        weight = _number(spec.get("weight", 1.0), 1.0)
        out[name] = TeamQuota(name, dict(spec.get("quota") or {}), dict(spec.get("borrowing_limit") or {}),
                              dict(spec.get("lending_limit") or {}),
                              weight if MIN_WEIGHT <= weight <= MAX_WEIGHT else 1.0,
                              _max_jobs(spec.get("max_jobs")), _airflow_teams(spec.get("airflow_teams")))
    half_s = _number(half, DEFAULT_USAGE_HALF_LIFE_S)  # checked by apply_teams; an older release did not
    return Teams(out, half_s if MIN_HALF_LIFE_S <= half_s <= MAX_DURATION_S else DEFAULT_USAGE_HALF_LIFE_S)


def _max_jobs(value: object) -> int | None:
    """A stored max_jobs, checked again (an older release or a hand edit may have left another value)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_JOBS_LIMIT:
        return None
    return value


def _airflow_teams(value: object) -> tuple[str, ...]:
    """A stored airflow_teams mapping (checked by apply_teams; a hand edit may have left anything)."""
    if not isinstance(value, list):
        return ()
    return tuple(v for v in value if isinstance(v, str) and AIRFLOW_TEAM.fullmatch(v))


def _number(value: object, default: float) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default
    return number if math.isfinite(number) else default


def _held(conn: Connection, now: datetime) -> list[Any]:
    """Live reservations: job, team, pool, GPUs."""
    return list(conn.execute(select(res_t.c.job_id, res_t.c.team, res_t.c.pool, res_t.c.gpu_count)
                             .where(res_t.c.expires_at > now)))


def known_pool_cards(conn: Connection) -> dict[str, str]:
    """The pools whose card type the ledger has recorded (pool id -> card type)."""
    value = conn.execute(select(team_settings.c.value).where(team_settings.c.key == POOL_CARDS_KEY)).scalar()
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def held_pools(conn: Connection, now: datetime) -> set[str]:
    """The pools of the live reservations."""
    return set(conn.execute(select(res_t.c.pool).where(res_t.c.expires_at > now).distinct()).scalars())


def cards_known(conn: Connection, now: datetime) -> bool:
    """Whether the card type of every live reservation's pool is recorded (the teams' holdings
    then need no cluster)."""
    return held_pools(conn, now) <= known_pool_cards(conn).keys()


def remember_pool_cards(conn: Connection, cards: Mapping[str, str],
                        known: Mapping[str, str] | None = None) -> dict[str, str]:
    """Record ``cards`` (pool id -> card type, from a cluster at hand) beside those recorded
    (``known``, read when not given); what is recorded now. Written only when something is new."""
    known = known_pool_cards(conn) if known is None else dict(known)
    if all(known.get(k) == v for k, v in cards.items()):
        return dict(known)
    merged = {**known, **cards} if len(known) + len(cards) <= MAX_POOL_CARDS else dict(cards)
    conn.execute(delete(team_settings).where(team_settings.c.key == POOL_CARDS_KEY))
    conn.execute(insert(team_settings).values(key=POOL_CARDS_KEY, value=merged))
    return merged


def holdings(conn: Connection, now: datetime, pool_cards: Mapping[str, str] | None = None) -> dict[tuple[str, str], int]:
    """(team, card type) -> GPUs its live reservations hold now (a reservation is in one pool;
    ``pool_cards``: pool id -> card type, from the stored inventory; without it the pool id)."""
    out: dict[tuple[str, str], int] = {}
    for r in _held(conn, now):
        key = (r.team or DEFAULT_TEAM, (pool_cards or {}).get(r.pool, r.pool or ""))
        out[key] = out.get(key, 0) + int(r.gpu_count)
    return out


def borrowing_now(conn: Connection, now: datetime, pool_cards: Mapping[str, str] | None = None) -> bool:
    """Whether some team holds more than its quota now (then some running job is reclaimable)."""
    teams = read_teams(conn)
    return teams is not None and any(u.borrowed for u in team_use(teams, holdings(conn, now, pool_cards)).values())


def _history(conn: Connection, now: datetime, teams: Teams) -> dict[str, float]:
    out = {}
    for row in conn.execute(select(team_usage)):
        elapsed = (now - row.updated_at).total_seconds()
        h = teams.usage_half_life_s
        gain = max(0, int(row.borrowed or 0)) * h / math.log(2) * (1 - 0.5 ** (max(0.0, elapsed) / h))
        stored = finite_usage(row.team, row.decayed_borrowed_gpu_s)
        out[row.team] = finite_usage(row.team, decay(stored, elapsed, h) + gain)
    return out


def quota_input(conn: Connection, now: datetime) -> QuotaInput | None:
    """What the admission pass needs about teams, or None when no team is configured."""
    teams = read_teams(conn)
    if teams is None:
        return None
    team_of = {r.job_id: r.team or DEFAULT_TEAM for r in _held(conn, now)}
    return QuotaInput(teams, team_of, _history(conn, now, teams))


def record_usage(conn: Connection, now: datetime, pool_cards: Mapping[str, str] | None = None) -> None:
    """Bring ``team_usage`` up to now and sample each team whose GPUs in use changed. What a team
    borrows is computed from its holdings now (:func:`~airflow_hetero_gpu.core.admission.quota.team_use`),
    so a team back within its quota accrues no history from here on."""
    teams = read_teams(conn)
    if teams is None:
        return
    history = _history(conn, now, teams)
    use = team_use(teams, holdings(conn, now, pool_cards))
    in_use = {t: u.in_use for t, u in use.items()}
    borrowed = {t: u.borrowed for t, u in use.items()}
    old = {r.team: r for r in conn.execute(select(team_usage))}
    for team in sorted(set(in_use) | set(old) | set(teams.teams)):
        values = dict(in_use=in_use.get(team, 0), borrowed=borrowed.get(team, 0),
                      decayed_borrowed_gpu_s=finite_usage(team, history.get(team, 0.0)), updated_at=now)
        prev = old.get(team)
        if prev is None:
            conn.execute(insert(team_usage).values(team=team, **values))
        else:
            conn.execute(update(team_usage).where(team_usage.c.team == team).values(**values))
        if prev is None or (prev.in_use, prev.borrowed) != (values["in_use"], values["borrowed"]):
            conn.execute(insert(team_samples).values(at=now, team=team, in_use=values["in_use"],
                                                     borrowed=values["borrowed"]))


class TeamQuotas:
    """Apply and read the teams' quotas; what the admission pass reads of them."""

    def __init__(self, db: LedgerDatabase):
        self.db = db

    # --- inside a write ------------------------------------------------------------------------
    def quota_input(self, uow: UnitOfWork) -> QuotaInput | None:
        """:func:`quota_input` in the unit of work."""
        return quota_input(uow.conn, uow.now)

    def borrowing_now(self, uow: UnitOfWork, cards: Mapping[str, str] | None = None) -> bool:
        """:func:`borrowing_now` in the unit of work."""
        return borrowing_now(uow.conn, uow.now, cards)

    def configured(self, uow: UnitOfWork) -> bool:
        """:func:`has_teams` in the unit of work."""
        return has_teams(uow.conn)

    def record_usage(self, uow: UnitOfWork, cards: Mapping[str, str] | None = None) -> None:
        """:func:`record_usage` in the unit of work (``cards``: :meth:`cards`'s, when not given)."""
        record_usage(uow.conn, uow.now, self.cards(uow) if cards is None else cards)

    def cards(self, uow: UnitOfWork) -> dict[str, str]:
        """Pool id -> card type for the teams' holdings (empty without teams): the recorded pools
        when they cover every live reservation's (no cluster is built), else the cluster of the
        stored inventory's pools, recorded."""
        conn = uow.conn
        if not has_teams(conn):
            return {}
        known = known_pool_cards(conn)
        if held_pools(conn, uow.now) <= known.keys():
            return known
        return remember_pool_cards(conn, pool_cards(uow.cluster()), known)

    def remember_cards(self, uow: UnitOfWork, cards: Mapping[str, str]) -> None:
        """Record the card types of a cluster's pools at hand (:func:`remember_pool_cards`); the
        callers have read the teams already (only with teams is the record read)."""
        remember_pool_cards(uow.conn, cards)

    def apply_teams(self, teams: Teams, source: str = "teams") -> bool:
        """Replace every team's quota by ``teams`` in one transaction; True when something changed.
        A pattern that matches no card type of the stored inventory, or a number out of the
        bounds of docs/teams.md (``teams`` built in code, not read from a file), is a TeamsError
        (nothing is applied). Runs an admission pass."""
        teams = teams_from_mapping(teams.to_json(), source)  # the file's bounds, whoever built it
        with self.db.write("apply the teams", warm=True) as uow:
            conn, now = uow.conn, uow.now
            cluster = uow.cluster()
            if cluster is not None:
                teams.check_fleet([p.card_type for p in cluster.pools], source)
            old = read_teams(conn)
            if old is not None and old.to_json() == teams.to_json():
                return False
            conn.execute(delete(teams_t))
            if teams.teams:
                conn.execute(insert(teams_t), [{"name": n, "spec": t.to_json(), "applied_at": now}
                                               for n, t in sorted(teams.teams.items())])
            conn.execute(delete(team_settings).where(team_settings.c.key == HALF_LIFE_KEY))
            conn.execute(insert(team_settings).values(key=HALF_LIFE_KEY, value=teams.usage_half_life_s))
            uow.expire(admit=False)
            uow.admit_before_commit()
        return True

    def teams(self) -> Teams | None:
        with self.db.read("read the teams") as uow:
            return read_teams(uow.conn)

    def team_standing(self) -> dict[str, Any]:
        """``{"now", "usage_half_life_s", "rows": [per team and pattern], "teams": {team: {...}}}``
        (empty rows when no team is configured)."""
        with self.db.read("read the teams") as uow:
            conn, now = uow.conn, uow.now
            teams = read_teams(conn)
            if teams is None:
                return {"now": now.isoformat(), "usage_half_life_s": None, "rows": [], "teams": {}}
            cluster = self.db.clusters.get(conn, now)
            cards = [p.card_type for p in cluster.pools] if cluster is not None else []
            fleet: dict[str, int] = {}
            if cluster is not None:
                for pool in cluster.pools:
                    fleet[pool.card_type] = fleet.get(pool.card_type, 0) + len(pool.positions)
            usage = holdings(conn, now, pool_cards(cluster))
            jobs: dict[str, int] = {}
            for r in _held(conn, now):
                jobs[r.team or DEFAULT_TEAM] = jobs.get(r.team or DEFAULT_TEAM, 0) + 1
            history = _history(conn, now, teams)
            waiting = []
            for row in conn.execute(select(q_t.c.team, q_t.c.request).where(q_t.c.state == "waiting",
                                                                            q_t.c.expires_at > now)):
                want = (row.request or {}).get("gpu_type")
                wants = [want] if isinstance(want, str) else list(want or [])
                card = next((c for c in cards if not wants or any(matches(c, w) for w in wants)), "")
                waiting.append((row.team or DEFAULT_TEAM, card, int((row.request or {}).get("gpus", 0))))
        book = QuotaBook(teams, fleet, usage, history)
        rows = book.standing(waiting)
        names = sorted({r.team for r in rows})
        per_team = {n: {"fair_share": round(share_value(book.borrowed(n), history.get(n, 0.0), teams.get(n).weight,
                                                        teams.usage_half_life_s), 4),
                        "weight": teams.get(n).weight, "decayed_borrowed_gpu_s": round(history.get(n, 0.0), 1),
                        "jobs": jobs.get(n, 0), "max_jobs": teams.get(n).max_jobs,
                        "airflow_teams": list(teams.get(n).mapped)}
                    for n in names}
        return {"now": now.isoformat(), "usage_half_life_s": teams.usage_half_life_s,
                "rows": [r.to_json() for r in rows], "teams": per_team}

    def team_samples(self, since: datetime | None = None) -> list[dict[str, Any]]:
        """The share-over-time history: ``[{at, team, in_use, borrowed}]``, oldest first."""
        with self.db.read("read the team samples") as uow:
            conn = uow.conn
            stmt = select(team_samples).order_by(team_samples.c.at, team_samples.c.id)
            if since is not None:
                stmt = stmt.where(team_samples.c.at >= since)
            return [{"at": r.at.isoformat(), "team": r.team, "in_use": r.in_use, "borrowed": r.borrowed}
                    for r in conn.execute(stmt)]


def pool_cards(cluster) -> dict[str, str]:
    """Pool id -> card type of the stored inventory's cluster (empty without one)."""
    return {pool.id: pool.card_type for pool in cluster.pools} if cluster is not None else {}
