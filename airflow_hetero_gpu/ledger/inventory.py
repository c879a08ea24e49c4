"""The fleet's inventory in the ledger: one collector, many readers.

Every stored collection upserts one ``inventory_hosts`` row per host with the raw outputs it
read (the texts a capture directory holds: ``query.csv``, ``topo.txt``, ``xid.log``, ...), when
and by whom. A host whose collection failed keeps the files of its last good collection (its
GPUs then show as ``unreachable``), as a capture directory does. The fleet's ``cluster.yaml``
and ``topology.conf`` live in ``inventory_files``. Readers parse the stored texts with the same
parser as a capture directory (:func:`airflow_hetero_gpu.capture.directory.parse_host`), so
``hetero-gpu captures export`` gives a directory that plans exactly like the ledger.

Kernel-log Xid lines are events: the cursor of each host (the last line acted on, stored in its
row) says which lines are new; a new line evicts its GPU once (``Ledger`` records it), and an
inventory read from the ledger does not count Xid lines at all (the evictions carry them).

Beside the texts each row keeps its ``query.csv`` parsed (``facts``, written from the text in the
same statement: :mod:`airflow_hetero_gpu.capture.facts`): the collector parses each text once as
it stores it (it needs the GPUs' bus ids for the Xid lines anyway), and a reader of 1,000 hosts
rebuilds the parsed rows instead of parsing 1,000 texts. A row without facts, or with facts of
another layout, is parsed from its text as before.

The functions here run inside the ledger's transactions (see :mod:`airflow_hetero_gpu.ledger.store`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from datetime import datetime
from typing import Any, Collection, Iterable, Mapping, Sequence

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.engine import Connection

from airflow_hetero_gpu.capture.directory import CaptureSet, HostCapture, parse_host
from airflow_hetero_gpu.capture.facts import query_facts, query_from_facts
from airflow_hetero_gpu.capture.query import QueryResult, parse_query_csv
from airflow_hetero_gpu.capture.slurm import parse_topology_conf
from airflow_hetero_gpu.capture.xid import parse_xid_log
from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.core.watch import XidMarker, split_new_lines
from airflow_hetero_gpu.errors import CaptureError
from airflow_hetero_gpu.ledger.schema import collections as coll_t
from airflow_hetero_gpu.ledger.schema import gpu_watch as watch_t
from airflow_hetero_gpu.ledger.schema import inventory_files as files_t
from airflow_hetero_gpu.ledger.schema import inventory_hosts as hosts_t

#: The fleet-wide files kept beside the hosts' outputs.
FLEET_FILES = ("cluster.yaml", "topology.conf")
#: Hosts per statement (SQLite's limit on bound parameters is generous, but keep statements small).
CHUNK = 500


@dataclass(frozen=True)
class HostRecord:
    """What one host's collection gave: its raw outputs (``ok``) or why it failed."""

    host: str
    ok: bool
    files: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None
    warnings: tuple[str, ...] = ()
    query_source: str | None = None


@dataclass(frozen=True)
class StoredHost:
    """One host as the ledger knows it."""

    host: str
    collected_at: datetime  # the last attempt
    good_at: datetime | None  # when ``files`` were read (None: never collected successfully)
    collector: str
    ok: bool
    error: str | None
    files: Mapping[str, str]
    warnings: tuple[str, ...] = ()
    query_source: str | None = None
    xid_cursor: XidMarker | None = None
    # files["query.csv"] parsed by the collector that stored it, or the row's stored facts
    # (rebuilt on first use: a writer reads many rows it never plans on)
    parsed: QueryResult | None = field(default=None, compare=False, repr=False)
    facts: Any = field(default=None, compare=False, repr=False)

    @cached_property
    def query(self) -> QueryResult | None:
        """``files["query.csv"]`` parsed; None when no facts hold it (the reader parses the text)."""
        return self.parsed if self.parsed is not None else query_from_facts(self.facts)

    def age(self, now: datetime) -> float | None:
        """Seconds since the host's outputs were read (None: never)."""
        return None if self.good_at is None else max(0.0, (now - self.good_at).total_seconds())

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "collected_at": self.collected_at.isoformat(),
                "good_at": self.good_at.isoformat() if self.good_at else None, "collector": self.collector,
                "ok": self.ok, "error": self.error, "files": sorted(self.files), "warnings": list(self.warnings),
                "query_source": self.query_source}


@dataclass
class StoredInventory:
    """The ledger's inventory of some hosts (every host when none were named)."""

    hosts: dict[str, StoredHost]
    fleet_files: dict[str, str]
    read_at: datetime

    def captures(self, *, count_xids: bool = False, max_age: float | None = None,
                 fresh: Collection[str] = ()) -> CaptureSet:
        """The stored outputs parsed as a capture set (the planner's input).

        Xid lines are left out unless ``count_xids`` (the ledger's evictions carry them). With
        ``max_age``, a host whose outputs are older is marked stale (unless named in ``fresh``:
        collected just now for this very reader): its GPUs are not placed on, with the reason
        ``inventory N s old (max M s)``.
        """
        hosts: dict[str, HostCapture] = {}
        for name in sorted(self.hosts):
            row = self.hosts[name]
            files = dict(row.files)
            if not row.files and row.ok:
                continue
            cap = parse_host(name, files, f"ledger inventory of host {name}", error=None if row.ok else row.error or "",
                             query=row.query)
            if not count_xids:
                cap.xid = []
            cap.collected_at = row.good_at
            age = row.age(self.read_at)
            if max_age is not None and age is not None and age > max_age and name not in fresh:
                cap.stale = f"inventory {age:.0f} s old (max {max_age:g} s)"
            hosts[name] = cap
        switches = None
        if "topology.conf" in self.fleet_files:
            switches = parse_topology_conf(self.fleet_files["topology.conf"], "ledger inventory file topology.conf")
        return CaptureSet(root=None, hosts=hosts, switches=switches, config_path=None)  # type: ignore[arg-type]

    @property
    def config_text(self) -> str | None:
        return self.fleet_files.get("cluster.yaml")

    def ages(self) -> dict[str, float | None]:
        return {name: row.age(self.read_at) for name, row in self.hosts.items()}

    def summary(self) -> dict[str, Any]:
        """Where the inventory came from and how old it is (for logs and XCom)."""
        ages = [a for a in self.ages().values() if a is not None]
        return {"source": "ledger", "hosts": len(self.hosts),
                "oldest_s": round(max(ages), 1) if ages else None,
                "newest_s": round(min(ages), 1) if ages else None}


# --- reading -------------------------------------------------------------------------------------
def _row(r: Any) -> StoredHost:
    return StoredHost(r.host, r.collected_at, r.good_at, r.collector, bool(r.ok), r.error, dict(r.files or {}),
                      tuple(r.warnings or ()), r.query_source, XidMarker.from_json(r.xid_cursor), facts=r.facts)


def _parsed_query(host: str, files: Mapping[str, str]) -> QueryResult | None:
    """The collector's one parse of a host's ``query.csv`` (None: absent or unreadable, which
    the readers report from the text)."""
    text = files.get("query.csv")
    if text is None:
        return None
    try:
        return parse_query_csv(text, f"ledger inventory of host {host}/query.csv")
    except CaptureError:
        return None


def read_hosts(conn: Connection, hosts: Collection[str] | None = None) -> dict[str, StoredHost]:
    """The stored rows of ``hosts`` (all when None)."""
    out: dict[str, StoredHost] = {}
    if hosts is None:
        for r in conn.execute(select(hosts_t)):
            out[r.host] = _row(r)
        return out
    names = sorted(set(hosts))
    for i in range(0, len(names), CHUNK):
        for r in conn.execute(select(hosts_t).where(hosts_t.c.host.in_(names[i:i + CHUNK]))):
            out[r.host] = _row(r)
    return out


#: What storing a collection reads of a host it collected successfully: not its old texts.
_STORE_COLUMNS = (hosts_t.c.host, hosts_t.c.collected_at, hosts_t.c.good_at, hosts_t.c.collector, hosts_t.c.ok,
                  hosts_t.c.error, hosts_t.c.query_source, hosts_t.c.xid_cursor)


def read_for_store(conn: Connection, records: Sequence[HostRecord]) -> dict[str, StoredHost]:
    """The stored rows :func:`store_hosts` needs: whole for a host whose collection failed now
    (it keeps its last good texts), without the texts for one that succeeded (they are
    replaced; decoding 1,000 hosts' old texts cost a check half a second)."""
    failed = sorted({r.host for r in records if not r.ok})
    out = read_hosts(conn, failed) if failed else {}
    names = sorted({r.host for r in records if r.ok})
    for i in range(0, len(names), CHUNK):
        for r in conn.execute(select(*_STORE_COLUMNS).where(hosts_t.c.host.in_(names[i:i + CHUNK]))):
            out[r.host] = StoredHost(r.host, r.collected_at, r.good_at, r.collector, bool(r.ok), r.error, {}, (),
                                     r.query_source, XidMarker.from_json(r.xid_cursor))
    return out


def read_fleet_files(conn: Connection) -> dict[str, str]:
    return {r.name: r.text for r in conn.execute(select(files_t.c.name, files_t.c.text))}


def host_stamps(conn: Connection) -> dict[str, datetime]:
    """Every stored host with the time of its last collection (changes with every collection of it)."""
    return {r.host: r.collected_at for r in conn.execute(select(hosts_t.c.host, hosts_t.c.collected_at))}


def host_names(conn: Connection) -> set[str]:
    """Every stored host's name."""
    return set(conn.execute(select(hosts_t.c.host)).scalars())


def version(conn: Connection) -> tuple[int, datetime | None]:
    row = conn.execute(select(func.count(), func.max(hosts_t.c.collected_at))).one()
    return int(row[0]), row[1]


def has_inventory(conn: Connection) -> bool:
    return conn.execute(select(hosts_t.c.host).limit(1)).first() is not None


# --- writing -------------------------------------------------------------------------------------
def check_records(records: Sequence[HostRecord]) -> list[HostRecord]:
    names = [r.host for r in records]
    if len(set(names)) != len(names):
        dup = next(n for i, n in enumerate(names) if n in names[:i])
        raise ValueError(f"host {dup!r} appears twice in one collection")
    for r in records:
        if r.ok and "query.csv" not in r.files:
            raise ValueError(f"host {r.host!r}: a successful collection without query.csv")
    return list(records)


def store_hosts(conn: Connection, now: datetime, records: Sequence[HostRecord], collector: str,
                existing: Mapping[str, StoredHost]) -> dict[str, StoredHost]:
    """Upsert the hosts' rows; a failed host keeps its last good files. Returns the new rows.

    ``existing``: the hosts' stored rows as :func:`read_for_store` reads them."""
    inserts, updates = [], []
    out: dict[str, StoredHost] = {}
    for r in records:
        old = existing.get(r.host)
        if r.ok:
            files, good_at, error = dict(r.files), now, None
            query = _parsed_query(r.host, files)
        else:
            files = dict(old.files) if old else {}
            good_at = old.good_at if old else None
            error = r.error or "collection failed"
            query = old.query if old else None
            if query is None and old is not None:  # a row stored before the facts: parse it once now
                query = _parsed_query(r.host, files)
        row = StoredHost(r.host, now, good_at, collector, r.ok, error, files, tuple(r.warnings),
                         r.query_source if r.ok else (old.query_source if old else None),
                         old.xid_cursor if old else None, query)
        out[r.host] = row
        values = {"collected_at": now, "good_at": good_at, "collector": collector, "ok": r.ok, "error": error,
                  "files": files, "warnings": list(r.warnings), "query_source": row.query_source,
                  "facts": None if query is None else query_facts(query)}
        if old is None:
            inserts.append({"host": r.host, "xid_cursor": None, **values})
        else:
            updates.append({"b_host": r.host, **values})
    if inserts:
        conn.execute(insert(hosts_t), inserts)
    if updates:
        stmt = update(hosts_t).where(hosts_t.c.host == bindparam("b_host")).values(
            {k: bindparam(k) for k in ("collected_at", "good_at", "collector", "ok", "error", "files", "warnings",
                                       "query_source", "facts")})
        conn.execute(stmt, updates)
    return out


def store_fleet_files(conn: Connection, now: datetime, files: Mapping[str, str], collector: str) -> None:
    unknown = set(files) - set(FLEET_FILES)
    if unknown:
        raise ValueError(f"fleet files: unknown {sorted(unknown)[0]!r} (expected {', '.join(FLEET_FILES)})")
    if not files:
        return
    old = read_fleet_files(conn)
    for name, text in files.items():
        if name not in old:
            conn.execute(insert(files_t).values(name=name, text=text, updated_at=now, collector=collector))
        elif old[name] != text:
            conn.execute(update(files_t).where(files_t.c.name == name).values(text=text, updated_at=now,
                                                                               collector=collector))


def record_collection(conn: Connection, started: datetime, now: datetime, collector: str,
                      records: Sequence[HostRecord], into: int | None = None) -> int:
    """Record a collection of ``records``; with ``into``, add them to that collection (one stored
    in parts, as a health check stores its hosts as they answer). Returns the collection's id."""
    ok = sum(1 for r in records if r.ok)
    if into is not None:
        done = conn.execute(update(coll_t).where(coll_t.c.id == into).values(
            finished_at=now, hosts=coll_t.c.hosts + len(records), ok=coll_t.c.ok + ok,
            failed=coll_t.c.failed + len(records) - ok))
        if done.rowcount == 1:
            return into
        # pruned meanwhile (a retention shorter than the check): recorded anew below
    result = conn.execute(insert(coll_t).values(started_at=started, finished_at=now, collector=collector,
                                                hosts=len(records), ok=ok, failed=len(records) - ok))
    return int(result.inserted_primary_key[0])


# --- Xid lines: events, acted on once -------------------------------------------------------------
@dataclass(frozen=True)
class XidNews:
    """The Xid lines of one collection that no earlier one acted on, per GPU."""

    by_gpu: dict[GpuKey, tuple[int, ...]]
    uuids: dict[GpuKey, str]


def new_xids(conn: Connection, rows: Mapping[str, StoredHost], records: Sequence[HostRecord]) -> XidNews:
    """For every host collected now: its Xid lines after the host's cursor, mapped to its GPUs by
    bus id, and the cursor moved to its last line (written to the row).

    A host with no cursor yet (a ledger from before the inventory) falls back to the per-GPU
    markers of the health watch (``gpu_watch.xid_marker``), so an upgrade acts on nothing twice.
    """
    by_gpu: dict[GpuKey, tuple[int, ...]] = {}
    uuids: dict[GpuKey, str] = {}
    moves = []
    legacy: dict[GpuKey, XidMarker] | None = None
    for rec in records:
        if not rec.ok or "xid.log" not in rec.files:
            continue
        row = rows[rec.host]
        try:
            events = parse_xid_log(rec.files["xid.log"], f"{rec.host}/xid.log")
        except CaptureError:
            continue  # the readers report unreadable files; no event can be taken from them
        if row.query is None:
            continue  # an unreadable query.csv: no GPU to give an event to
        bus_to_gpu = {r.pci_bus_id: r for r in row.query.rows if r.pci_bus_id}
        texts = [e.text for e in events]
        if row.xid_cursor is None and events:
            if legacy is None:
                legacy = _legacy_markers(conn)
            fresh = _new_by_gpu_markers(rec.host, events, bus_to_gpu, legacy)
        else:
            start, _ = split_new_lines(texts, row.xid_cursor)
            fresh = events[start:]
        for e in fresh:
            qrow = bus_to_gpu.get(e.pci_bus_id)
            if qrow is None:
                continue  # an Xid of a GPU this host no longer lists
            key = GpuKey(rec.host, qrow.index)
            by_gpu[key] = by_gpu.get(key, ()) + (e.xid,)
            uuids[key] = qrow.uuid or ""
        cursor = XidMarker(texts[-1], texts.count(texts[-1])) if texts else row.xid_cursor
        if cursor != row.xid_cursor:
            moves.append({"b_host": rec.host, "xid_cursor": cursor.to_json() if cursor else None})
    if moves:
        conn.execute(update(hosts_t).where(hosts_t.c.host == bindparam("b_host")).values(
            xid_cursor=bindparam("xid_cursor")), moves)
    return XidNews(by_gpu, uuids)


def _legacy_markers(conn: Connection) -> dict[GpuKey, XidMarker]:
    out = {}
    for r in conn.execute(select(watch_t.c.host, watch_t.c.gpu_index, watch_t.c.xid_marker)):
        marker = XidMarker.from_json(r.xid_marker)
        if marker is not None:
            out[GpuKey(r.host, r.gpu_index)] = marker
    return out


def _new_by_gpu_markers(host: str, events: Iterable[Any], bus_to_gpu: Mapping[str, Any],
                        markers: Mapping[GpuKey, XidMarker]) -> list[Any]:
    by_gpu: dict[GpuKey, list[Any]] = {}
    for e in events:
        qrow = bus_to_gpu.get(e.pci_bus_id)
        if qrow is not None:
            by_gpu.setdefault(GpuKey(host, qrow.index), []).append(e)
    fresh = []
    for key, evs in by_gpu.items():
        start, _ = split_new_lines([e.text for e in evs], markers.get(key))
        fresh.extend(evs[start:])
    return sorted(fresh, key=lambda e: e.line)
