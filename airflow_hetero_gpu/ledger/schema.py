"""The ledger's tables, as the code queries them.

The schema is versioned: ``schema_version`` holds one row per applied step. A database is only
ever built by running the steps in order from its current version, so a fresh database and an
upgraded one end up with the same tables, and an upgrade never drops a reservation.

The steps that build these tables, one per schema version, are in
:mod:`airflow_hetero_gpu.ledger.migrations`.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON, Boolean, Column, DateTime, Float, ForeignKey, Index, Integer, MetaData, PrimaryKeyConstraint, String, Table,
    Text, UniqueConstraint,
)
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
def v4_tables(m: MetaData) -> tuple[Table, ...]:
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
 watch_runs) = v4_tables(metadata)
# version 7: the parsed query.csv beside the texts (a cache of them; NULL: parse the text)
inventory_hosts.append_column(Column("facts", JSON, nullable=True))


# version 9
def v9_tables(m: MetaData) -> tuple[Table, ...]:
    """The drains' table. Version 9 creates exactly this."""
    return (
        Table(
            "host_drains", m,
            Column("host", String(NAME), primary_key=True),
            Column("reason", Text, nullable=False),
            Column("deadline", UtcDateTime, nullable=True),  # running jobs ended after it (None: never)
            Column("drained_at", UtcDateTime, nullable=False),
            Column("drained_by", String(NAME), nullable=False),
            Column("ended", JSON, nullable=True),  # the jobs ended at the deadline, once
        ),
    )


(host_drains,) = v9_tables(metadata)


# version 6
def v6_tables(m: MetaData) -> tuple[Table, ...]:
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


(queue_entries,) = v6_tables(metadata)
# version 8: teams
queue_entries.append_column(Column("team", String(NAME), nullable=True))
reservations.append_column(Column("team", String(NAME), nullable=True))
reservations.append_column(Column("borrowed", Integer, nullable=True))

# version 10: preemption (NULL priority: 0; NULL preemptible: no; NULL enqueued_at: created_at)
V10_COLUMNS = (("reservations", "priority", Integer), ("reservations", "preemptible", Boolean),
                ("reservations", "enqueued_at", UtcDateTime), ("reservations", "checkpoint_at", UtcDateTime),
                ("reservations", "preempting", JSON), ("queue_entries", "preemptible", Boolean))
for _table, _name, _type in V10_COLUMNS:
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


def v8_tables(m: MetaData) -> tuple[Table, ...]:
    """The teams' tables. Version 8 creates exactly these."""
    return (
        Table("teams", m, Column("name", String(NAME), primary_key=True),
              Column("spec", JSON, nullable=False),  # TeamQuota.to_json(): quota, limits, weight
              Column("applied_at", UtcDateTime, nullable=False)),
        Table("team_settings", m, Column("key", String(100), primary_key=True), Column("value", JSON, nullable=False)),
        Table("team_usage", m, Column("team", String(NAME), primary_key=True),
              Column("in_use", Integer, nullable=False), Column("borrowed", Integer, nullable=False),
              Column("decayed_borrowed_gpu_s", Float, nullable=False), Column("updated_at", UtcDateTime, nullable=False)),
        Table("team_samples", m, Column("id", Integer, primary_key=True, autoincrement=True),
              Column("at", UtcDateTime, nullable=False, index=True), Column("team", String(NAME), nullable=False),
              Column("in_use", Integer, nullable=False), Column("borrowed", Integer, nullable=False)),
    )


teams, team_settings, team_usage, team_samples = v8_tables(metadata)
