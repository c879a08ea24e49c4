"""The admission pass inside the ledger's write transactions (docs/queue.md).

Every write that frees or changes GPUs — a release, a lease expiry, an eviction, a readmission,
a replacement, a new collection — and every enqueue and departure from the queue calls
:func:`run_pass` before it commits (a health check stored in parts: once, after its last part,
``Ledger.run_admission``): one call of the pure
:func:`airflow_hetero_gpu.core.admission.admit` with

* the cluster from the ledger's stored inventory (every host, as last seen; the stored
  ``cluster.yaml``), parsed once per inventory version and kept between passes; a write that
  parsed it before taking the lock places on that even when a health check's part landed since
  (:class:`ClusterCache`, :meth:`UnitOfWork.cluster <airflow_hetero_gpu.ledger.unit_of_work.UnitOfWork.cluster>`),
* the live reservations and the evictions,
* the waiting entries with the claims the previous pass gave them.

Each admitted entry gets its reservation in the same transaction (the rows ``Ledger.reserve``
writes, with the entry's lease) and the state ``admitted``; every waiting entry gets its
position, standing, reason and claim. A pass that cannot run (no inventory, an unreadable stored
file) writes that reason on the waiting entries and never fails the write that called it.

The pass works on the write's unit of work (:class:`~airflow_hetero_gpu.ledger.unit_of_work.UnitOfWork`)
and reads and writes through its repositories' public methods.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.engine import Connection

from airflow_hetero_gpu.core.admission import Admission, AdmissionResult, QueueEntry
from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.ledger import inventory
from airflow_hetero_gpu.ledger.records import TaskIdentity
from airflow_hetero_gpu.ledger.schema import queue_entries as q_t
from airflow_hetero_gpu.ledger.schema import reservations as r_t

if TYPE_CHECKING:
    from airflow_hetero_gpu.ledger.unit_of_work import UnitOfWork

log = logging.getLogger(__name__)

WAITING, ADMITTED = "waiting", "admitted"
NO_INVENTORY = ("not considered yet: the ledger holds no inventory (fill it with `hetero-gpu collect "
                "--ledger URL`)")


@dataclass(frozen=True)
class Warmed:
    """A cluster of the stored inventory as one build left it: the digest of the fleet files and
    the hosts it was built over (what a write that warmed it checks under the lock)."""

    cluster: Cluster
    digest: str
    hosts: frozenset[str]


@dataclass
class CacheStats:
    """What a :class:`ClusterCache` did, counted (the tests and benchmarks read it)."""

    builds: int = 0  #: builds of the cluster (the first, and each rebuild for a changed inventory)
    hosts_parsed: int = 0  #: hosts re-read and parsed by those builds
    warmed_uses: int = 0  #: writes that used the cluster they warmed although the inventory moved since


class ClusterCache:
    """The planner's cluster of the stored inventory, rebuilt only for what a collection changed.

    One per ledger URL in a process. It keeps each host's parsed outputs with the time of the
    collection they came from, and its GPUs (:class:`~airflow_hetero_gpu.core.inventory.HostMemo`):
    a health check stores its hosts in parts as they answer, and the next build re-reads and
    re-parses only the hosts collected since the last build (the cluster's arrays are then built
    again over the kept GPUs). A change of the fleet files (``cluster.yaml``, ``topology.conf``)
    rebuilds everything.

    The writes that run passes (release, enqueue, renew, leave, evict, replace, the check's own
    pass) :meth:`warm` it in a read transaction before they take the ledger lock, and keep what
    they warmed (:class:`Warmed`). Under the lock :meth:`get` compares the inventory's version;
    when it moved meanwhile (a health check's part landed), a write that warmed uses the cluster it
    warmed and parses nothing under the lock, nor waits for another thread's build in progress,
    unless the fleet files changed or a host it knows was removed (then it rebuilds, as a write
    that did not warm always does). The ledger's reservations,
    evictions and drains are read under the lock either way (docs/ledger.md, "Which cluster a
    write's pass uses").
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one build at a time (it updates what is kept in place)
        self._count = threading.Lock()  # the counters of a write that uses its warmed cluster
        self._files_digest: str | None = None
        self._config: Any = None
        self._switches: Any = None
        self._stamps: dict[str, datetime] = {}
        self._captures: dict[str, Any] = {}  # host -> its HostCapture (None: a row without outputs)
        self._memo: Any = None
        #: (files digest, inventory version, the cluster built for them): replaced whole by a
        #: build, read without the lock (one attribute), so a write never waits on a build that
        #: would give it nothing newer than it may use
        self._latest: tuple[str, Any, Warmed] | None = None
        self.stats = CacheStats()

    def warm(self, conn: Connection, now: datetime) -> Warmed | None:
        """Build the cluster now, outside the ledger lock, when the write's pass will need it
        (someone waits, or teams are configured and a live reservation is in a pool whose card
        type the ledger has not recorded: their usage counts GPUs by card) and it is stale; what
        was built (None: not needed, or no inventory), for :meth:`get` under the lock."""
        from airflow_hetero_gpu.ledger.teams import cards_known, has_teams

        if conn.execute(select(q_t.c.job_id).where(q_t.c.state == WAITING).limit(1)).first() is None \
                and (not has_teams(conn) or cards_known(conn, now)):
            return None
        return self._current(conn, now, None)

    def get(self, conn: Connection, now: datetime, warmed: Warmed | None = None) -> Cluster | None:
        """The cluster of the stored inventory (None: no inventory). ``warmed``: what this write
        warmed before the lock, used when the inventory moved since (see the class docstring)."""
        built = self._current(conn, now, warmed)
        return built.cluster if built is not None else None

    def _current(self, conn: Connection, now: datetime, warmed: Warmed | None) -> Warmed | None:
        files = inventory.read_fleet_files(conn)
        digest = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()
        version = inventory.version(conn)  # (hosts, newest collection): changes with every collection
        latest = self._built_for(digest, version)
        if latest is not None:
            return latest
        if warmed is not None and warmed.digest == digest and warmed.hosts <= inventory.host_names(conn):
            # a part landed since the warm: its new evictions are read under the lock by the pass,
            # its hosts' other news go to the check's own pass; a host added waits for the next pass.
            # Another thread's build in progress (a check's warm) is not waited for.
            with self._count:
                self.stats.warmed_uses += 1
            return warmed
        with self._lock:  # one build at a time: the kept captures and GPUs are updated in place
            latest = self._built_for(digest, version)
            if latest is not None:
                return latest  # another thread built it meanwhile
            stamps = inventory.host_stamps(conn)
            if not stamps:
                return None
            built = self._build(conn, now, files, digest, stamps)
            self._latest = (digest, version, built)
            return built

    def _built_for(self, digest: str, version: Any) -> Warmed | None:
        """The last build, if it was made for these fleet files and this inventory version."""
        latest = self._latest
        return latest[2] if latest is not None and latest[0] == digest and latest[1] == version else None

    def _build(self, conn: Connection, now: datetime, files: dict[str, str], digest: str,
               stamps: dict[str, datetime]) -> Warmed:
        from airflow_hetero_gpu.capture.directory import CaptureSet
        from airflow_hetero_gpu.core.config import ClusterConfig, config_from_text
        from airflow_hetero_gpu.core.inventory import XIDS_FROM_LEDGER, HostMemo, cluster_from_captures
        from airflow_hetero_gpu.ledger.inventory import StoredInventory

        if digest != self._files_digest:  # another cluster.yaml or topology.conf: nothing kept holds
            text = files.get("cluster.yaml")
            config = config_from_text(text, "ledger inventory file cluster.yaml") if text else ClusterConfig()
            switches = StoredInventory({}, files, now).captures().switches
            self._config, self._switches, self._memo = config, switches, HostMemo()
            self._files_digest, self._stamps, self._captures, self._latest = digest, {}, {}, None
        changed = [h for h, at in stamps.items() if self._stamps.get(h) != at]
        parsed = StoredInventory(inventory.read_hosts(conn, changed), files, now).captures().hosts if changed else {}
        captures = {h: parsed.get(h) if h in parsed or h in changed else self._captures.get(h)
                    for h in sorted(stamps)}
        hosts = {h: cap for h, cap in captures.items() if cap is not None}
        cluster = cluster_from_captures(CaptureSet(root=None, hosts=hosts, switches=self._switches, config_path=None),
                                        self._config, xid_rule=XIDS_FROM_LEDGER, memo=self._memo)
        self._stamps, self._captures = stamps, captures
        self.stats.builds += 1
        self.stats.hosts_parsed += len(changed)
        return Warmed(cluster, digest, frozenset(stamps))


_CACHES: dict[str, ClusterCache] = {}
_CACHES_LOCK = threading.Lock()


def cluster_cache(url: str) -> ClusterCache:
    """The process's cache of the stored inventory's cluster for the ledger at ``url``."""
    with _CACHES_LOCK:
        return _CACHES.setdefault(url, ClusterCache())


def waiting_rows(conn: Connection) -> list[Any]:
    return list(conn.execute(select(q_t).where(q_t.c.state == WAITING)))


def entry_of(row: Any) -> QueueEntry:
    claim = tuple(GpuKey(*k) for k in ((row.claim or {}).get("gpus") or ()))
    return QueueEntry(row.job_id, PlanRequest(**dict(row.request)), int(row.priority),
                      row.enqueued_at.timestamp(), claim, row.team or None)


def run_pass(uow: UnitOfWork) -> AdmissionResult | None:
    """One admission pass over the waiting entries, in the unit of work's write (see the module
    docstring). None when nobody waits or the pass could not run (the reason is then on every
    waiting entry)."""
    conn, now = uow.conn, uow.now
    rows = waiting_rows(conn)
    if not rows:
        _record_usage(uow)
        return None
    uow.reservations.expire_due(uow)  # nothing expired may block a GPU or a job id
    reserved = uow.reservations.held(uow)
    held = set(reserved.values())
    for row in [r for r in rows if r.job_id in held]:  # it reserved on its own meanwhile: that counts
        conn.execute(update(q_t).where(q_t.c.job_id == row.job_id).values(
            state=ADMITTED, admitted_at=now, checked_at=now, position=None, standing=None, claim=None,
            reason="admitted: the job holds a reservation of its own", admission=None))
    rows = [r for r in rows if r.job_id not in held]
    if not rows:
        _record_usage(uow)
        return None
    began = time.perf_counter()
    result = _admit(uow, rows, reserved)
    if result is not None:
        log.info("ledger: admission pass at %s: %d waiting, %d admitted, %.1f ms", now.isoformat(), len(rows),
                  len(result.admitted), 1000.0 * (time.perf_counter() - began))
    return result


def _record_usage(uow: UnitOfWork) -> None:
    """The teams' usage when nobody waits (only with teams)."""
    if uow.teams.configured(uow):
        uow.teams.record_usage(uow)  # the recorded pools' cards: no cluster built while they cover the holdings


def _admit(uow: UnitOfWork, rows: list[Any], reserved: Any) -> AdmissionResult | None:
    """The pass proper over the waiting ``rows``: the rule, then its admissions and standings written."""
    from airflow_hetero_gpu.ledger.teams import pool_cards

    conn, now = uow.conn, uow.now
    try:
        cluster = uow.cluster()
        if cluster is None:
            _note_all(conn, now, rows, NO_INVENTORY)
            return None
        adm = Admission(cluster, evicted=uow.evictions.evicted(uow), aging_interval_s=uow.db.settings.queue_aging_interval_s,
                        drained=uow.drains.drained(uow))
        rules = uow.db.settings.preemption
        quotas = uow.teams.quota_input(uow)
        cards = pool_cards(cluster)
        running = () if rules is None else uow.preemptions.running_jobs(
            uow, max(int(r.priority) for r in rows), reclaim=quotas is not None and uow.teams.borrowing_now(uow, cards))
        result = adm.run([entry_of(r) for r in rows], now=now.timestamp(), reserved=reserved,
                         quotas=quotas, running=running, preemption=rules)
    except HeteroGpuError as err:  # a stored file that no longer parses: the queue waits, the write goes on
        _note_all(conn, now, rows, f"admission could not run: {err}")
        return None
    except Exception as err:  # noqa: BLE001 - a fault in the pass must not fail a release or a health check
        log.exception("ledger: the admission pass failed; the queue waits for the next write")
        _note_all(conn, now, rows, f"admission could not run: {type(err).__name__}: {err}")
        return None
    by_id = {r.job_id: r for r in rows}
    for a in result.admitted:
        row = by_id[a.job_id]
        if a.decision is None:  # the planner always gives one; another placer would not
            continue
        lease = timedelta(seconds=float(row.lease_seconds))
        ident = _identity(row)
        uow.reservations.insert(uow, a.job_id, a.decision, PlanRequest(**dict(row.request)), lease, ident,
                                {"priority": int(row.priority), "preemptible": bool(row.preemptible),
                                 "enqueued_at": row.enqueued_at})
        if a.team is not None or row.team:
            conn.execute(update(r_t).where(r_t.c.job_id == a.job_id).values(
                team=a.team or row.team, borrowed=a.borrowed))
        conn.execute(update(q_t).where(q_t.c.job_id == a.job_id).values(
            state=ADMITTED, admitted_at=now, admission=a.to_json(), checked_at=now, position=None,
            standing=None, reason=f"admitted: {a.pool} on {_gpus(a)}", claim=None,
            renewed_at=now, expires_at=now + lease))
    uow.preemptions.mark(uow, result)
    if result.waiting:  # one statement for every waiting entry (executemany)
        conn.execute(_STANDING, [{"b_job": w.job_id, "b_now": now, "b_position": w.position, "b_standing": w.state,
                                  "b_reason": w.reason, "b_claim": w.claim.to_json() if w.claim else None}
                                 for w in result.waiting])
    if quotas is not None:  # the writes after this one count the teams' holdings without a cluster
        uow.teams.remember_cards(uow, cards)
    uow.teams.record_usage(uow, cards)
    return result


_STANDING = update(q_t).where(q_t.c.job_id == bindparam("b_job")).values(
    checked_at=bindparam("b_now"), position=bindparam("b_position"), standing=bindparam("b_standing"),
    reason=bindparam("b_reason"), claim=bindparam("b_claim", type_=q_t.c.claim.type))


def _gpus(a: Any) -> str:
    from airflow_hetero_gpu.core.admission import describe_gpus

    return describe_gpus(a.gpus)


def _identity(row: Any) -> TaskIdentity | None:
    fields = (row.dag_id, row.run_id, row.task_id, row.try_number, row.map_index)
    return TaskIdentity(*fields) if any(f is not None for f in fields) else None


def _note_all(conn: Connection, now: datetime, rows: list[Any], reason: str) -> None:
    conn.execute(update(q_t).where(q_t.c.job_id.in_([r.job_id for r in rows]))
                 .values(checked_at=now, reason=reason, standing="waiting", claim=None))
