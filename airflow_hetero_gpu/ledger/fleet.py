"""The fleet's inventory in the ledger: the inventory's repository, storing collections and reading them back.

Two ways in, each one locked transaction:

* :meth:`Inventory.store_collection` — what ``hetero-gpu collect --ledger`` and a training task
  that refreshed its stale hosts do: upsert the hosts' raw outputs, act on new kernel-log Xid
  lines (a new line evicts its GPU once), record the collection, keep history;
* :meth:`Inventory.record_health_check` — what a health check does (sensor, trigger,
  ``hetero-gpu check``): the same, plus the watch's judgement of every GPU (evict, count healthy
  checks, readmit) from the same stored outputs.

Readers call :meth:`Inventory.inventory`, which parses the stored texts as a capture set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence

from sqlalchemy import delete, insert, select

from airflow_hetero_gpu.capture.directory import CaptureSet
from airflow_hetero_gpu.core.config import ClusterConfig, config_from_text
from airflow_hetero_gpu.core.health import xid as xid_rule
from airflow_hetero_gpu.core.health import GpuFacts
from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.core.watch import Evaluation, Step, WatchPolicy, evaluate
from airflow_hetero_gpu.errors import CaptureError
from airflow_hetero_gpu.ledger import inventory
from airflow_hetero_gpu.ledger.errors import LedgerError
from airflow_hetero_gpu.ledger.inventory import HostRecord, StoredHost, StoredInventory
from airflow_hetero_gpu.ledger.schema import watch_runs as runs_t
from airflow_hetero_gpu.settings import DEFAULT_HISTORY_INTERVAL_S, DEFAULT_HISTORY_RETENTION_S

if TYPE_CHECKING:
    from airflow_hetero_gpu.ledger.base import LedgerDatabase
    from airflow_hetero_gpu.ledger.unit_of_work import UnitOfWork

#: ``judge(captures, new_xids, fleet_files) -> (Evaluation, WatchPolicy)``: the health check's
#: pure judgement of the stored outputs (``fleet_files``: the stored cluster.yaml and topology.conf).
Judge = Callable[[CaptureSet, Mapping[GpuKey, tuple[int, ...]], Mapping[str, str]], tuple[Evaluation, WatchPolicy]]


@dataclass
class Stored:
    """What storing a collection did."""

    collection_id: int
    hosts: dict[str, StoredHost]
    evaluation: Evaluation | None = None
    steps: list[Step] = field(default_factory=list)  # the health check's steps (record_health_check)
    policy: WatchPolicy | None = None  # the health check's policy (record_health_check)
    xid_evictions: list[tuple[GpuKey, tuple[str, ...]]] = field(default_factory=list)  # store_collection
    new_xids: dict[GpuKey, tuple[int, ...]] = field(default_factory=dict)
    fleet_files: dict[str, str] = field(default_factory=dict)  # the stored cluster.yaml and topology.conf
    stored_at: datetime | None = None  # the transaction's time


class Inventory:
    """The inventory, and what health sensors keep between pokes."""

    def __init__(self, db: LedgerDatabase):
        self.db = db

    # --- writing -------------------------------------------------------------------------------
    def store_collection(self, records: Sequence[HostRecord], *, collector: str,
                         fleet_files: Mapping[str, str] | None = None, started_at: datetime | None = None,
                         config: ClusterConfig | None = None,
                         history_interval: float = DEFAULT_HISTORY_INTERVAL_S,
                         history_retention: float = DEFAULT_HISTORY_RETENTION_S) -> Stored:
        """Store one collection (see the module docstring). A new Xid line evicts its GPU once
        (reasons ``xid-<n>``, application Xids excepted)."""
        records = _checked(records)
        with self.db.write(f"store a collection of {len(records)} host(s)") as uow:
            stored = self._store(uow, records, collector, fleet_files, started_at)
            caps, files = self._captures(uow, stored)
            ev = evaluate(caps, config or _stored_config(files), stored.new_xids)
            for key, xids in stored.new_xids.items():
                reasons = tuple(xid_rule(GpuFacts(xids=xids), None) or ())  # type: ignore[arg-type]
                if reasons:
                    uow.evictions.record(uow, key, _uuid(ev, key), reasons)
                    stored.xid_evictions.append((key, reasons))
            stored.evaluation = ev
            self._keep_history(uow, ev, records, history_interval, history_retention)
            uow.admit_before_commit()  # a changed inventory (hosts back, loads gone) goes to the queue
        return stored

    def record_health_check(self, records: Sequence[HostRecord], *, collector: str, judge: Judge,
                            fleet_files: Mapping[str, str] | None = None,
                            started_at: datetime | None = None,
                            history_interval: float = DEFAULT_HISTORY_INTERVAL_S,
                            history_retention: float = DEFAULT_HISTORY_RETENTION_S,
                            collection_id: int | None = None, admit: bool = True) -> Stored:
        """Store one collection and record the health check of every GPU it saw.

        ``judge`` turns the stored outputs of the collected hosts (a failed host with its last
        good files), the new Xid numbers per GPU and the stored fleet files into the watch's
        observations and policy; the steps (evict, count, readmit) are applied in the same
        transaction. ``collection_id``: these hosts are a further part of that collection (a
        check stores its hosts in parts as they answer; :func:`judge_parts` judges the whole).
        ``admit``: run the queue's admission pass in the same transaction (a check stored in parts
        runs one :meth:`run_admission` after its last part instead: one pass a check, its cluster
        built before the lock, rather than a pass and a rebuild of the part's hosts under the lock
        in every part).
        """
        records = _checked(records)
        with self.db.write(f"record a health check of {len(records)} host(s)") as uow:
            stored = self._store(uow, records, collector, fleet_files, started_at, collection_id)
            caps, files = self._captures(uow, stored)
            ev, policy = judge(caps, stored.new_xids, files)
            stored.evaluation, stored.policy = ev, policy
            stored.steps = uow.evictions.apply_check(uow, ev.observations, policy)
            self._keep_history(uow, ev, records, history_interval,
                               history_retention if collection_id is None else None)
            if admit:
                uow.admit_before_commit()  # evictions and readmissions change what the queue can have
        return stored

    def _store(self, uow: UnitOfWork, records: Sequence[HostRecord], collector: str,
               fleet_files: Mapping[str, str] | None, started_at: datetime | None,
               collection_id: int | None = None) -> Stored:
        conn, now = uow.conn, uow.now
        if not isinstance(collector, str) or not collector.strip():
            raise LedgerError(f"collector: expected a name saying who collected, got {collector!r}")
        existing = inventory.read_for_store(conn, records)
        rows = inventory.store_hosts(conn, now, records, collector[:500], existing)
        news = inventory.new_xids(conn, rows, records)
        try:
            inventory.store_fleet_files(conn, now, dict(fleet_files or {}), collector[:500])
        except ValueError as err:
            raise LedgerError(str(err)) from None
        cid = inventory.record_collection(conn, started_at or now, now, collector[:500], records, collection_id)
        uow.drains.end_past_deadline(uow)  # jobs on drained hosts past the deadline (the admission pass follows)
        return Stored(cid, rows, new_xids=news.by_gpu, stored_at=now)

    def _captures(self, uow: UnitOfWork, stored: Stored) -> tuple[CaptureSet, dict[str, str]]:
        """The collected hosts' stored outputs (a failed host: its last good ones) as a capture set."""
        stored.fleet_files = files = inventory.read_fleet_files(uow.conn)
        return _stored_captures(stored.hosts, files, uow.now), files

    def _keep_history(self, uow: UnitOfWork, ev: Evaluation, records: Sequence[HostRecord],
                      interval: float, retention: float | None) -> None:
        reserved = uow.reservations.held(uow)
        evicted = uow.evictions.evicted(uow)
        by_host: dict[str, list[dict[str, Any]]] = {r.host: [] for r in records}
        for g in ev.cluster.gpus:
            if g.host in by_host:
                by_host[g.host].append({
                    "index": g.index, "uuid": g.uuid, "name": g.name, "utilization": g.utilization,
                    "temperature_c": g.temperature_c, "memory_used_mib": g.memory_used_mib,
                    "memory_total_mib": g.memory_total_mib, "healthy": g.healthy, "reasons": list(g.reasons),
                    "reserved": reserved.get(g.key), "evicted": g.key in evicted,
                    **({} if g.instance is None else {"instance": g.instance}),  # a MIG instance
                })
        ok = {r.host: r.ok for r in records}
        # retention None: a further part of a collection, pruned with its first
        uow.history.keep_samples(uow, {h: (ok[h], gpus) for h, gpus in by_host.items()}, interval, retention)

    # --- reading -------------------------------------------------------------------------------
    def inventory(self, hosts: Collection[str] | None = None) -> StoredInventory:
        """The stored inventory of ``hosts`` (every host when None), with the fleet's files."""
        with self.db.read("read the inventory") as uow:
            return StoredInventory(inventory.read_hosts(uow.conn, hosts), inventory.read_fleet_files(uow.conn), uow.now)

    def inventory_version(self) -> tuple[int, datetime | None]:
        """(hosts, newest collection time) of the inventory: changes whenever a collection is stored
        (readers cache the parsed inventory on it)."""
        with self.db.read("read the inventory") as uow:
            return inventory.version(uow.conn)

    def has_inventory(self) -> bool:
        with self.db.read("read the inventory") as uow:
            return inventory.has_inventory(uow.conn)

    # --- what a rescheduled health sensor keeps between pokes -----------------------------------
    def watch_run_state(self, run_key: str) -> dict[str, Any] | None:
        with self.db.read("read a health sensor's record") as uow:
            row = uow.conn.execute(select(runs_t.c.state).where(runs_t.c.run_key == run_key)).first()
        return dict(row.state) if row is not None else None

    def save_watch_run_state(self, run_key: str, state: Mapping[str, Any] | None) -> None:
        """Keep (or, with None, forget) a sensor run's record."""
        with self.db.write("keep a health sensor's record") as uow:
            conn, now = uow.conn, uow.now
            conn.execute(delete(runs_t).where(runs_t.c.run_key == run_key))
            if state is not None:
                conn.execute(insert(runs_t).values(run_key=run_key, state=dict(state), updated_at=now))


def judge_parts(parts: Sequence[Stored], judge: Judge) -> tuple[Evaluation, WatchPolicy]:
    """The judgement of a collection stored in ``parts`` (:meth:`Inventory.record_health_check`
    with ``collection_id``) as one: every part's hosts, with the Xid lines each part found new and
    the newest part's fleet files. Pure: the steps were applied part by part; this is the cluster
    the check reports on (pools, gates, replacements). One part is its own judgement."""
    if not parts:
        raise ValueError("judge_parts: no part")
    last = parts[-1]
    if len(parts) == 1 and last.evaluation is not None and last.policy is not None:
        return last.evaluation, last.policy
    hosts: dict[str, StoredHost] = {}
    new_xids: dict[GpuKey, tuple[int, ...]] = {}
    for part in parts:
        hosts.update(part.hosts)
        new_xids.update(part.new_xids)
    return judge(_stored_captures(hosts, last.fleet_files, last.stored_at), new_xids, last.fleet_files)


def _stored_captures(hosts: Mapping[str, StoredHost], files: Mapping[str, str], now: datetime | None) -> CaptureSet:
    try:
        return StoredInventory(dict(hosts), dict(files), now).captures(count_xids=False)
    except CaptureError as err:
        raise LedgerError(str(err)) from None


def _checked(records: Sequence[HostRecord]) -> list[HostRecord]:
    try:
        return inventory.check_records(records)
    except ValueError as err:
        raise LedgerError(str(err)) from None


def _stored_config(files: Mapping[str, str]) -> ClusterConfig:
    """The stored cluster.yaml's settings (the defaults when there is none)."""
    text = files.get("cluster.yaml")
    return config_from_text(text, "ledger inventory file cluster.yaml") if text else ClusterConfig()


def _uuid(ev: Evaluation, key: GpuKey) -> str | None:
    pos = ev.cluster.position.get(key)
    return ev.cluster.gpus[pos].uuid if pos is not None else None


__all__ = ["Inventory", "HostRecord", "Judge", "Stored", "StoredHost", "StoredInventory"]
