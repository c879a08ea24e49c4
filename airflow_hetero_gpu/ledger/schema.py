"""The ledger's tables, as the code queries them, and the ordered migration steps that build them.

The schema is versioned: ``schema_version`` holds one row per applied step. A database is only
ever built by running the steps in order from its current version, so a fresh database and an
upgraded one end up with the same tables, and an upgrade never drops a reservation.

Version history
  1. ``reservations`` (job id, pool, GPU count, score terms, times), ``reservation_gpus`` (one
     row per reserved GPU; its primary key (host, gpu_index) makes a GPU impossible to hold
     twice), ``evictions`` (abnormal GPUs and their reasons).
  2. Airflow task identity (dag_id, run_id, task_id, map_index, try_number), the request and the mean
     distance on reservations; the consecutive-healthy-checks counter and last check time on
     evictions.
  3. ``gpu_watch``: what the health watch remembers per GPU between checks (consecutive bad
     checks per soft fault, the last kernel-log Xid line acted on).
  4. The fleet's inventory: ``inventory_hosts`` (per host, the raw outputs of its last good
     collection, when and by whom it was collected, its last error, the kernel-log cursor),
     ``inventory_files`` (``cluster.yaml``, ``topology.conf``), ``collections`` (one row per
     stored collection), history (``host_samples``, ``gpu_events``), ``job_hosts`` (the hosts
     every try of a job ran on) and ``watch_runs`` (a rescheduled health sensor's record
     between pokes).
  5. MIG instances as units of their own: ``reservation_gpus.mig_instance`` (the MIG device
     index on the GPU, :data:`WHOLE_GPU` for a whole GPU) joins the primary key, so two jobs can
     hold two instances of one GPU at once while no unit is ever held twice.
  6. The queue: ``queue_entries`` (one row per waiting or just-admitted job: its request,
     priority, time enqueued, lease, Airflow task identity, state, and what the last admission
     pass said about it: position, standing, reason, claim, admission).
  7. ``inventory_hosts.facts``: the host's ``query.csv`` as the collector parsed it when it stored
     the text (:mod:`airflow_hetero_gpu.capture.facts`), so readers of a large fleet rebuild it
     instead of parsing every text again; NULL (rows stored before) means "parse the text".
  8-9. (held for changes built beside step 10)
  10. Preemption (docs/preemption.md): ``priority``, ``preemptible``, ``enqueued_at``, ``checkpoint_at``,
      ``preempting`` on reservations, ``preemptible`` on queue entries; ``preemptions`` (one row a victim).

To add a version: append a step to :data:`STEPS` (never edit a released one) and update the
table definitions below to the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    inspect,
    insert,
    select,
)
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import ExecutableDDLElement
from sqlalchemy.types import TypeDecorator

NAME = 250  # Airflow's dag_id / run_id / task_id limit


class UtcDateTime(TypeDecorator):
    """A timezone-aware UTC timestamp on every database (SQLite stores it naive, in UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the ledger stores aware UTC times only")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


#: ``reservation_gpus.mig_instance`` of a whole GPU (a MIG instance has its MIG device index).
WHOLE_GPU = -1

# --- the current tables (version 6) -------------------------------------------------------------
metadata = MetaData()

schema_version = Table(
    "schema_version", metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("description", String(200), nullable=False),
    Column("applied_at", UtcDateTime, nullable=False),
)

reservations = Table(
    "reservations", metadata,
    Column("job_id", String(NAME), primary_key=True),
    Column("pool", String(500), nullable=False),
    Column("gpu_count", Integer, nullable=False),
    Column("score", JSON, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("renewed_at", UtcDateTime, nullable=False),
    Column("expires_at", UtcDateTime, nullable=False, index=True),
    # version 2
    Column("request", JSON, nullable=True),
    Column("mean_distance", Float, nullable=True),
    Column("dag_id", String(NAME), nullable=True),
    Column("run_id", String(NAME), nullable=True),
    Column("task_id", String(NAME), nullable=True),
    Column("map_index", Integer, nullable=True),
    Column("try_number", Integer, nullable=True),
)

reservation_gpus = Table(
    "reservation_gpus", metadata,
    Column("host", String(NAME), nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("job_id", String(NAME), ForeignKey("reservations.job_id", ondelete="CASCADE"), nullable=False,
           index=True),
    Column("slot", Integer, nullable=False),  # the GPU's place in the job's GPU list (rank order)
    Column("uuid", String(NAME), nullable=True),  # a MIG instance's MIG-... UUID
    # version 5
    Column("mig_instance", Integer, nullable=False, server_default=str(WHOLE_GPU)),
    PrimaryKeyConstraint("host", "gpu_index", "mig_instance", name="pk_reservation_gpus"),  # one holder per unit
    UniqueConstraint("job_id", "slot", name="uq_reservation_gpus_slot"),
)

evictions = Table(
    "evictions", metadata,
    Column("host", String(NAME), nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("uuid", String(NAME), nullable=True),
    Column("reasons", JSON, nullable=False),
    Column("evicted_at", UtcDateTime, nullable=False),
    # version 2
    Column("checked_at", UtcDateTime, nullable=True),
    Column("healthy_checks", Integer, nullable=False, server_default="0"),
    PrimaryKeyConstraint("host", "gpu_index", name="pk_evictions"),
)

# version 3
gpu_watch = Table(
    "gpu_watch", metadata,
    Column("host", String(NAME), nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("streaks", JSON, nullable=False),  # {"temperature": 2}: consecutive bad checks per reason
    Column("xid_marker", JSON, nullable=True),  # {"text": "<last Xid line acted on>", "occurrence": 1}
    Column("checked_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("host", "gpu_index", name="pk_gpu_watch"),
)


# version 4
def _v4_tables(m: MetaData) -> tuple[Table, ...]:
    """The fleet inventory's tables. Version 4 creates exactly these: a later step that changes one
    of them must first freeze this definition inside ``_v4``, as ``_v1`` is frozen."""
    return (
        Table(
            "inventory_hosts", m,
            Column("host", String(NAME), primary_key=True),
            Column("collected_at", UtcDateTime, nullable=False),  # the last attempt
            Column("good_at", UtcDateTime, nullable=True),  # the last success (files are from then)
            Column("collector", String(500), nullable=False),
            Column("ok", Boolean, nullable=False),
            Column("error", Text, nullable=True),  # why the last attempt failed
            Column("files", JSON, nullable=False),  # {"query.csv": text, "topo.txt": text, ...}
            Column("warnings", JSON, nullable=False),
            Column("query_source", String(40), nullable=True),
            Column("xid_cursor", JSON, nullable=True),  # the last kernel-log Xid line acted on
        ),
        Table(
            "inventory_files", m,
            Column("name", String(100), primary_key=True),  # cluster.yaml, topology.conf
            Column("text", Text, nullable=False),
            Column("updated_at", UtcDateTime, nullable=False),
            Column("collector", String(500), nullable=False),
        ),
        Table(
            "collections", m,
            Column("id", Integer, primary_key=True, autoincrement=True),
            Column("started_at", UtcDateTime, nullable=False),
            Column("finished_at", UtcDateTime, nullable=False, index=True),
            Column("collector", String(500), nullable=False),
            Column("hosts", Integer, nullable=False),
            Column("ok", Integer, nullable=False),
            Column("failed", Integer, nullable=False),
        ),
        Table(
            "host_samples", m,
            Column("id", Integer, primary_key=True, autoincrement=True),
            Column("host", String(NAME), nullable=False),
            Column("collected_at", UtcDateTime, nullable=False),
            Column("ok", Boolean, nullable=False),
            Column("gpus", JSON, nullable=False),  # [{index, uuid, name, utilization, ...}]
            Index("ix_host_samples_host_time", "host", "collected_at"),
            Index("ix_host_samples_time", "collected_at"),
        ),
        Table(
            "gpu_events", m,
            Column("id", Integer, primary_key=True, autoincrement=True),
            Column("at", UtcDateTime, nullable=False),
            Column("host", String(NAME), nullable=False),
            Column("gpu_index", Integer, nullable=False),
            Column("uuid", String(NAME), nullable=True),
            Column("kind", String(40), nullable=False),  # evicted, readmitted, uncordoned, replaced
            Column("reasons", JSON, nullable=False),
            Column("job_id", String(NAME), nullable=True),
            Column("detail", JSON, nullable=True),
            Index("ix_gpu_events_host_time", "host", "at"),
            Index("ix_gpu_events_time", "at"),
        ),
        Table(
            "job_hosts", m,
            Column("job_id", String(NAME), nullable=False),
            Column("host", String(NAME), nullable=False),
            Column("first_at", UtcDateTime, nullable=False),
            Column("last_at", UtcDateTime, nullable=False),
            PrimaryKeyConstraint("job_id", "host", name="pk_job_hosts"),
        ),
        Table(
            "watch_runs", m,
            Column("run_key", String(1100), primary_key=True),  # dag/task/run/map of a sensor
            Column("state", JSON, nullable=False),
            Column("updated_at", UtcDateTime, nullable=False),
        ),
    )


(inventory_hosts, inventory_files, collections, host_samples, gpu_events, job_hosts,
 watch_runs) = _v4_tables(metadata)
# version 7: the parsed query.csv beside the texts (a cache of them; NULL: parse the text)
inventory_hosts.append_column(Column("facts", JSON, nullable=True))


# version 6
def _v6_tables(m: MetaData) -> tuple[Table, ...]:
    """The queue's table. Version 6 creates exactly this (freeze it inside ``_v6`` before a later
    step changes it)."""
    return (
        Table(
            "queue_entries", m,
            Column("job_id", String(NAME), primary_key=True),
            Column("request", JSON, nullable=False),  # PlanRequest.to_json()
            Column("priority", Integer, nullable=False),
            Column("enqueued_at", UtcDateTime, nullable=False),
            Column("renewed_at", UtcDateTime, nullable=False),
            Column("expires_at", UtcDateTime, nullable=False, index=True),
            Column("lease_seconds", Float, nullable=False),  # the admitted reservation's lease
            Column("dag_id", String(NAME), nullable=True),
            Column("run_id", String(NAME), nullable=True),
            Column("task_id", String(NAME), nullable=True),
            Column("map_index", Integer, nullable=True),
            Column("try_number", Integer, nullable=True),
            Column("state", String(20), nullable=False),  # waiting, admitted
            # what the last admission pass said
            Column("checked_at", UtcDateTime, nullable=True),
            Column("position", Integer, nullable=True),
            Column("standing", String(20), nullable=True),  # head, waiting, impossible
            Column("reason", Text, nullable=True),
            Column("claim", JSON, nullable=True),  # Claim.to_json() of a head
            Column("admitted_at", UtcDateTime, nullable=True),
            Column("admission", JSON, nullable=True),  # Admitted.to_json(): pool, GPUs, plan()'s decision
        ),
    )


(queue_entries,) = _v6_tables(metadata)

# version 10: preemption (NULL priority: 0; NULL preemptible: no; NULL enqueued_at: created_at)
_V10_COLUMNS = (("reservations", "priority", Integer), ("reservations", "preemptible", Boolean),
                ("reservations", "enqueued_at", UtcDateTime), ("reservations", "checkpoint_at", UtcDateTime),
                ("reservations", "preempting", JSON), ("queue_entries", "preemptible", Boolean))
for _table, _name, _type in _V10_COLUMNS:
    metadata.tables[_table].append_column(Column(_name, _type, nullable=True))
preemptions = Table(  # as version 10 creates it (freeze it inside _v10 before a later step changes it)
    "preemptions", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("victim", String(NAME), nullable=False, index=True),
    Column("preemptor", String(NAME), nullable=False),
    Column("reason", Text, nullable=False),
    Column("gpus", JSON, nullable=False),  # the victim's GPUs
    Column("decided_at", UtcDateTime, nullable=False, index=True),
    Column("ended_at", UtcDateTime, nullable=True),  # NULL: in progress
    Column("outcome", String(20), nullable=True),  # exited (within the grace), killed
    Column("exited_after_s", Float, nullable=True),
    Column("lost_gpu_s", Float, nullable=True),
    Column("checkpoint", Text, nullable=True),  # what the victim kept ("epoch 12")
)


# --- migration steps ---------------------------------------------------------------------------
class AddColumn(ExecutableDDLElement):
    """``ALTER TABLE <table> ADD COLUMN <column spec>``, compiled by the dialect (quoted names)."""

    inherit_cache = False

    def __init__(self, table: str, column: Column):
        self.column = column
        Table(table, MetaData(), column)  # attach: the dialect's column spec needs a table


@compiles(AddColumn)
def _compile_add_column(element: AddColumn, compiler, **kw) -> str:
    table = compiler.preparer.format_table(element.column.table)
    return f"ALTER TABLE {table} ADD COLUMN {compiler.get_column_specification(element.column)}"


def _v1(conn: Connection) -> None:
    """The first layout, frozen here as it was (the code never queries these objects)."""
    m = MetaData()
    Table(
        "reservations", m,
        Column("job_id", String(NAME), primary_key=True),
        Column("pool", String(500), nullable=False),
        Column("gpu_count", Integer, nullable=False),
        Column("score", JSON, nullable=False),
        Column("created_at", UtcDateTime, nullable=False),
        Column("renewed_at", UtcDateTime, nullable=False),
        Column("expires_at", UtcDateTime, nullable=False, index=True),
    )
    Table(
        "reservation_gpus", m,
        Column("host", String(NAME), nullable=False),
        Column("gpu_index", Integer, nullable=False),
        Column("job_id", String(NAME), ForeignKey("reservations.job_id", ondelete="CASCADE"), nullable=False,
               index=True),
        Column("slot", Integer, nullable=False),
        Column("uuid", String(NAME), nullable=True),
        PrimaryKeyConstraint("host", "gpu_index", name="pk_reservation_gpus"),
        UniqueConstraint("job_id", "slot", name="uq_reservation_gpus_slot"),
    )
    Table(
        "evictions", m,
        Column("host", String(NAME), nullable=False),
        Column("gpu_index", Integer, nullable=False),
        Column("uuid", String(NAME), nullable=True),
        Column("reasons", JSON, nullable=False),
        Column("evicted_at", UtcDateTime, nullable=False),
        PrimaryKeyConstraint("host", "gpu_index", name="pk_evictions"),
    )
    m.create_all(conn)


def _v2(conn: Connection) -> None:
    for column in (
        Column("request", JSON, nullable=True),
        Column("mean_distance", Float, nullable=True),
        Column("dag_id", String(NAME), nullable=True),
        Column("run_id", String(NAME), nullable=True),
        Column("task_id", String(NAME), nullable=True),
        Column("map_index", Integer, nullable=True),
        Column("try_number", Integer, nullable=True),
    ):
        conn.execute(AddColumn("reservations", column))
    conn.execute(AddColumn("evictions", Column("checked_at", UtcDateTime, nullable=True)))
    conn.execute(AddColumn("evictions", Column("healthy_checks", Integer, nullable=False, server_default="0")))


def _v3(conn: Connection) -> None:
    m = MetaData()
    Table(
        "gpu_watch", m,
        Column("host", String(NAME), nullable=False),
        Column("gpu_index", Integer, nullable=False),
        Column("streaks", JSON, nullable=False),
        Column("xid_marker", JSON, nullable=True),
        Column("checked_at", UtcDateTime, nullable=False),
        PrimaryKeyConstraint("host", "gpu_index", name="pk_gpu_watch"),
    )
    m.create_all(conn)


def _v4(conn: Connection) -> None:
    m = MetaData()
    _v4_tables(m)
    m.create_all(conn)


def _v5(conn: Connection) -> None:
    """``mig_instance`` joins ``reservation_gpus``' primary key; existing rows are whole GPUs."""
    if conn.dialect.name == "sqlite":  # no ALTER of a primary key: rebuild the table, rows and all
        conn.exec_driver_sql("ALTER TABLE reservation_gpus RENAME TO reservation_gpus_v4")
        conn.exec_driver_sql("DROP INDEX IF EXISTS ix_reservation_gpus_job_id")
        m = MetaData()
        Table("reservations", m, Column("job_id", String(NAME), primary_key=True))  # for the FK only
        rebuilt = Table(
            "reservation_gpus", m,
            Column("host", String(NAME), nullable=False),
            Column("gpu_index", Integer, nullable=False),
            Column("job_id", String(NAME), ForeignKey("reservations.job_id", ondelete="CASCADE"), nullable=False,
                   index=True),
            Column("slot", Integer, nullable=False),
            Column("uuid", String(NAME), nullable=True),
            Column("mig_instance", Integer, nullable=False, server_default=str(WHOLE_GPU)),
            PrimaryKeyConstraint("host", "gpu_index", "mig_instance", name="pk_reservation_gpus"),
            UniqueConstraint("job_id", "slot", name="uq_reservation_gpus_slot"),
        )
        rebuilt.create(conn)
        assert WHOLE_GPU == -1  # the constant SQL below spells it
        conn.exec_driver_sql(
            "INSERT INTO reservation_gpus (host, gpu_index, job_id, slot, uuid, mig_instance) "
            "SELECT host, gpu_index, job_id, slot, uuid, -1 FROM reservation_gpus_v4")
        conn.exec_driver_sql("DROP TABLE reservation_gpus_v4")
        return
    conn.execute(AddColumn("reservation_gpus", Column("mig_instance", Integer, nullable=False,
                                                      server_default=str(WHOLE_GPU))))
    conn.exec_driver_sql("ALTER TABLE reservation_gpus DROP CONSTRAINT pk_reservation_gpus")
    conn.exec_driver_sql("ALTER TABLE reservation_gpus ADD CONSTRAINT pk_reservation_gpus "
                         "PRIMARY KEY (host, gpu_index, mig_instance)")


def _v6(conn: Connection) -> None:
    m = MetaData()
    _v6_tables(m)
    m.create_all(conn)


def _v7(conn: Connection) -> None:
    conn.execute(AddColumn("inventory_hosts", Column("facts", JSON, nullable=True)))


def _v10(conn: Connection) -> None:
    for table, name, type_ in _V10_COLUMNS:
        conn.execute(AddColumn(table, Column(name, type_, nullable=True)))
    preemptions.to_metadata(MetaData()).create(conn)


@dataclass(frozen=True)
class Step:
    version: int
    description: str
    apply: Callable[[Connection], None]


STEPS: tuple[Step, ...] = (
    Step(1, "reservations, reservation GPUs, evictions", _v1),
    Step(2, "task identity, request and distance on reservations; readmission counter on evictions", _v2),
    Step(3, "health watch memory per GPU: soft-fault streaks, last Xid line acted on", _v3),
    Step(4, "the fleet inventory: hosts' raw outputs, cluster files, collections, history, job hosts, "
            "sensor records", _v4),
    Step(5, "MIG instances: reservation GPUs keyed by (host, index, MIG instance)", _v5),
    Step(6, "the queue: waiting jobs with priority, lease, task identity, claim and admission", _v6),
    Step(7, "the inventory's parsed query.csv beside its text, for readers of large fleets", _v7),
    Step(8, "team quotas", lambda conn: None),  # held for a change built beside step 10
    Step(9, "drained hosts and GPU processes", lambda conn: None),  # likewise
    Step(10, "preemption: priority, preemptible, checkpoint and preempting on reservations; the preemption record",
         _v10),
)
LATEST = STEPS[-1].version


def current_version(conn: Connection) -> int:
    """The database's schema version; 0 for an empty database."""
    if not inspect(conn).has_table("schema_version"):
        return 0
    return conn.execute(select(func.coalesce(func.max(schema_version.c.version), 0))).scalar_one()


def upgrade(conn: Connection, now: datetime, target: int = LATEST) -> list[int]:
    """Apply the missing steps up to ``target`` inside the caller's (locked) transaction.

    Returns the versions applied. The caller holds the ledger lock, so concurrent first users
    wait here instead of racing on ``CREATE TABLE``.
    """
    version = current_version(conn)
    if version == 0:
        schema_version.create(conn, checkfirst=True)
    applied = []
    for step in STEPS:
        if version < step.version <= target:
            step.apply(conn)
            conn.execute(insert(schema_version).values(version=step.version, description=step.description,
                                                       applied_at=now))
            applied.append(step.version)
    return applied
