"""History kept from the stored collections: per-host samples and GPU events, pruned by age.

A *sample* is one host's GPUs at one collection (utilization, temperature, memory, health, and
whether the ledger had them reserved or evicted then). Storing one per host per check of a
1,000-host fleet every minute would be 1.4 million rows a day, so a host gets a new sample when
its previous one is older than ``history_interval`` seconds (default 300) or when something a
user watches changed (health, reservation, eviction, collection failure). An *event* is an
eviction, readmission, uncordon or replacement, written by the same transaction that did it.
Both are deleted after ``history_retention`` seconds (default 7 days) by the next store.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Collection, Iterable, Mapping, Sequence

from sqlalchemy import and_, delete, func, insert, select
from sqlalchemy.engine import Connection

from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.ledger.schema import collections as coll_t
from airflow_hetero_gpu.ledger.schema import gpu_events as events_t
from airflow_hetero_gpu.ledger.schema import host_samples as samples_t
from airflow_hetero_gpu.ledger.schema import team_samples as team_samples_t

if TYPE_CHECKING:
    from airflow_hetero_gpu.ledger.base import LedgerDatabase
    from airflow_hetero_gpu.ledger.unit_of_work import UnitOfWork

EVENT_KINDS = ("evicted", "readmitted", "uncordoned", "replaced")


@dataclass(frozen=True)
class HostSample:
    """One host's GPUs at one stored collection."""

    host: str
    collected_at: datetime
    ok: bool
    gpus: tuple[Mapping[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "collected_at": self.collected_at.isoformat(), "ok": self.ok,
                "gpus": [dict(g) for g in self.gpus]}


@dataclass(frozen=True)
class GpuEvent:
    """An eviction, readmission, uncordon or replacement of one GPU."""

    at: datetime
    host: str
    index: int
    uuid: str | None
    kind: str
    reasons: tuple[str, ...] = ()
    job_id: str | None = None
    detail: Mapping[str, Any] | None = None

    @property
    def key(self) -> GpuKey:
        return GpuKey(self.host, self.index)

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at.isoformat(), "host": self.host, "index": self.index, "uuid": self.uuid,
                "kind": self.kind, "reasons": list(self.reasons), "job_id": self.job_id,
                "detail": dict(self.detail) if self.detail else None}


def record_event(conn: Connection, now: datetime, kind: str, key: GpuKey, uuid: str | None = None,
                 reasons: Iterable[str] = (), job_id: str | None = None,
                 detail: Mapping[str, Any] | None = None) -> None:
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown GPU event kind {kind!r}")
    conn.execute(insert(events_t).values(at=now, host=key.host, gpu_index=key.index, uuid=uuid, kind=kind,
                                         reasons=list(reasons), job_id=job_id,
                                         detail=dict(detail) if detail else None))


def _signature(gpus: Sequence[Mapping[str, Any]], ok: bool) -> tuple:
    return (ok, tuple((g.get("index"), g.get("healthy"), g.get("reserved"), g.get("evicted")) for g in gpus))


def last_samples(conn: Connection, hosts: Collection[str]) -> dict[str, HostSample]:
    """The newest sample of each host (one query)."""
    if not hosts:
        return {}
    newest = (select(samples_t.c.host, func.max(samples_t.c.collected_at).label("at"))
              .where(samples_t.c.host.in_(sorted(hosts))).group_by(samples_t.c.host).subquery())
    stmt = select(samples_t).join(newest, and_(samples_t.c.host == newest.c.host,
                                               samples_t.c.collected_at == newest.c.at))
    return {r.host: HostSample(r.host, r.collected_at, bool(r.ok), tuple(r.gpus)) for r in conn.execute(stmt)}


def store_samples(conn: Connection, now: datetime, samples: Mapping[str, tuple[bool, list[dict[str, Any]]]],
                  interval: float) -> int:
    """Write the samples that are due (see the module docstring); returns how many."""
    hosts = list(samples)
    rows = []
    for i in range(0, len(hosts), 500):
        chunk = hosts[i:i + 500]
        last = last_samples(conn, chunk)
        for host in chunk:
            ok, gpus = samples[host]
            prev = last.get(host)
            due = (prev is None or (now - prev.collected_at).total_seconds() >= interval
                   or _signature(prev.gpus, prev.ok) != _signature(gpus, ok))
            if due:
                rows.append({"host": host, "collected_at": now, "ok": ok, "gpus": gpus})
    if rows:
        conn.execute(insert(samples_t), rows)
    return len(rows)


def prune(conn: Connection, now: datetime, retention: float) -> None:
    """Delete samples (of hosts and of teams), events and collection records older than
    ``retention`` seconds."""
    cutoff = now - timedelta(seconds=retention)
    conn.execute(delete(team_samples_t).where(team_samples_t.c.at < cutoff))
    conn.execute(delete(samples_t).where(samples_t.c.collected_at < cutoff))
    conn.execute(delete(events_t).where(events_t.c.at < cutoff))
    conn.execute(delete(coll_t).where(coll_t.c.finished_at < cutoff))


def read_samples(conn: Connection, since: datetime, until: datetime | None = None,
                 hosts: Collection[str] | None = None) -> list[HostSample]:
    stmt = select(samples_t).where(samples_t.c.collected_at >= since)
    if until is not None:
        stmt = stmt.where(samples_t.c.collected_at <= until)
    if hosts is not None:
        stmt = stmt.where(samples_t.c.host.in_(sorted(hosts)))
    stmt = stmt.order_by(samples_t.c.collected_at, samples_t.c.host)
    return [HostSample(r.host, r.collected_at, bool(r.ok), tuple(r.gpus)) for r in conn.execute(stmt)]


def read_events(conn: Connection, since: datetime, until: datetime | None = None,
                host: str | None = None) -> list[GpuEvent]:
    stmt = select(events_t).where(events_t.c.at >= since)
    if until is not None:
        stmt = stmt.where(events_t.c.at <= until)
    if host is not None:
        stmt = stmt.where(events_t.c.host == host)
    stmt = stmt.order_by(events_t.c.at, events_t.c.id)
    return [GpuEvent(r.at, r.host, r.gpu_index, r.uuid, r.kind, tuple(r.reasons or ()), r.job_id, r.detail)
            for r in conn.execute(stmt)]


def read_collections(conn: Connection, since: datetime) -> list[dict[str, Any]]:
    stmt = select(coll_t).where(coll_t.c.finished_at >= since).order_by(coll_t.c.finished_at)
    return [{"id": r.id, "started_at": r.started_at.isoformat(), "finished_at": r.finished_at.isoformat(),
             "collector": r.collector, "hosts": r.hosts, "ok": r.ok, "failed": r.failed} for r in conn.execute(stmt)]


class History:
    """The history's repository: samples and events written in the caller's write, and read back."""

    def __init__(self, db: LedgerDatabase):
        self.db = db

    # --- inside a write ------------------------------------------------------------------------
    def record_event(self, uow: UnitOfWork, kind: str, key: GpuKey, uuid: str | None = None,
                     reasons: Iterable[str] = (), job_id: str | None = None,
                     detail: Mapping[str, Any] | None = None) -> None:
        """An eviction, readmission, uncordon or replacement of ``key``, now (:func:`record_event`)."""
        record_event(uow.conn, uow.now, kind, key, uuid, reasons, job_id, detail)

    def keep_samples(self, uow: UnitOfWork, samples: Mapping[str, tuple[bool, list[dict[str, Any]]]],
                     interval: float, retention: float | None) -> int:
        """Write the samples that are due (:func:`store_samples`), then prune what is older than
        ``retention`` seconds (None: keep). Returns how many samples were written."""
        written = store_samples(uow.conn, uow.now, samples, interval)
        if retention is not None:
            prune(uow.conn, uow.now, retention)
        return written

    # --- reading -------------------------------------------------------------------------------
    def host_samples(self, since: datetime, until: datetime | None = None,
                     hosts: Collection[str] | None = None) -> list[HostSample]:
        """History samples of ``hosts`` (all when None) collected in [since, until]."""
        with self.db.read("read history samples") as uow:
            return read_samples(uow.conn, since, until, hosts)

    def gpu_events(self, since: datetime, until: datetime | None = None, host: str | None = None) -> list[GpuEvent]:
        """Evictions, readmissions, uncordons and replacements in [since, until]."""
        with self.db.read("read GPU events") as uow:
            return read_events(uow.conn, since, until, host)

    def collections(self, since: datetime) -> list[dict[str, Any]]:
        """The collections stored since ``since`` (who, when, how many hosts answered)."""
        with self.db.read("read collections") as uow:
            return read_collections(uow.conn, since)
