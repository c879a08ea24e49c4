"""The ordered migration steps that build the ledger's tables (:mod:`.schema`), one per version.

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
  8. Teams (docs/teams.md): ``teams`` (one row per team: its quota, borrowing and lending limits
     and weight, as the applied teams file set them), ``team_settings`` (``usage_half_life_s``),
     ``team_usage`` (per team: GPUs in use and borrowed at the last pass, borrowed GPU-seconds
     decayed by the half-life: the fair-share history), ``team_samples`` (GPUs in use and
     borrowed per team over time, for the cluster page's chart), and a ``team`` column on
     ``queue_entries`` and ``reservations`` (with ``borrowed``: GPUs above the team's quota).
  9. ``host_drains``: hosts taken out of placement for maintenance (one row per drained host:
     the reason, an optional deadline for its running jobs, when and by whom).
  10. Preemption (docs/preemption.md): ``priority``, ``preemptible``, ``enqueued_at``,
      ``checkpoint_at``, ``preempting`` on reservations, ``preemptible`` on queue entries;
      ``preemptions`` (one row a victim).
  11. The writers' guard (:mod:`.guard`): triggers on every table refuse the writes of a process
      of an older release (one that opened the ledger before it was upgraded); preemption
      records an earlier release left open with no victim being stopped are closed
      (``abandoned``, ended when decided). The guard is installed again, for the version
      reached, by every upgrade from this one on, after the steps (which run unguarded).

To add a version: append a step to :data:`STEPS` (never edit a released one) and update the
table definitions below to the result.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from sqlalchemy import (
    JSON, Column, Float, ForeignKey, Integer, MetaData, PrimaryKeyConstraint, String, Table, UniqueConstraint, func,
    inspect, insert, select, update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import ExecutableDDLElement

from airflow_hetero_gpu.ledger import guard
from airflow_hetero_gpu.ledger.schema import (
    V10_COLUMNS, NAME, WHOLE_GPU, UtcDateTime, v4_tables, v6_tables, v8_tables, v9_tables, preemptions,
    reservations, schema_version,
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
    v4_tables(m)
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
    v6_tables(m)
    m.create_all(conn)


def _v7(conn: Connection) -> None:
    conn.execute(AddColumn("inventory_hosts", Column("facts", JSON, nullable=True)))


def _v8(conn: Connection) -> None:
    conn.execute(AddColumn("queue_entries", Column("team", String(NAME), nullable=True)))
    conn.execute(AddColumn("reservations", Column("team", String(NAME), nullable=True)))
    conn.execute(AddColumn("reservations", Column("borrowed", Integer, nullable=True)))
    m = MetaData()
    v8_tables(m)
    m.create_all(conn)


def _v9(conn: Connection) -> None:
    m = MetaData()
    v9_tables(m)
    m.create_all(conn)


def _v10(conn: Connection) -> None:
    for table, name, type_ in V10_COLUMNS:
        conn.execute(AddColumn(table, Column(name, type_, nullable=True)))
    preemptions.to_metadata(MetaData()).create(conn)


def _v11(conn: Connection) -> None:
    """Close the records left open by an earlier release whose victim is not being stopped (its
    reservation went without closing them): ended when decided, as ``abandoned``. The guard
    itself is installed by :func:`upgrade` after the steps."""
    marked = select(reservations.c.job_id).where(reservations.c.preempting.is_not(None))
    conn.execute(update(preemptions).where(preemptions.c.ended_at.is_(None), preemptions.c.victim.not_in(marked))
                 .values(ended_at=preemptions.c.decided_at, outcome="abandoned"))


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
    Step(8, "teams: quotas, fair-share usage history, team of queue entries and reservations", _v8),
    Step(9, "drained hosts: reason, deadline, who and when", _v9),
    Step(10, "preemption: priority, preemptible, checkpoint and preempting on reservations; the preemption record",
         _v10),
    Step(11, "writers' guard: a process of an older release may not write; stale preemption records closed", _v11),
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
    wait here instead of racing on ``CREATE TABLE``. From version 11 on the writers' guard
    (:mod:`.guard`) is put back for the version reached, after the steps.
    """
    version = current_version(conn)
    if version == 0:
        schema_version.create(conn, checkfirst=True)
    if not any(version < step.version <= target for step in STEPS):
        return []
    if version >= guard.GUARD_SINCE:
        guard.drop(conn)  # the steps run unguarded; the guard comes back for the version reached
    applied = []
    for step in STEPS:
        if version < step.version <= target:
            step.apply(conn)
            conn.execute(insert(schema_version).values(version=step.version, description=step.description,
                                                       applied_at=now))
            applied.append(step.version)
    if applied[-1] >= guard.GUARD_SINCE:
        guard.install(conn, applied[-1])
    return applied
