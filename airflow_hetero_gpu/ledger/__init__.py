"""The ledger: GPU reservations with leases, evictions and replacements in their own SQL database.

SQLite file by default (``$AIRFLOW_HOME/hetero_gpu_ledger.db``), PostgreSQL in production;
never Airflow's metadata database. See ``docs/ledger.md``.
"""

from airflow_hetero_gpu.ledger.errors import (LedgerError, LedgerUrlError, MissingLedger, NoLiveReservation,
                                              ReservationConflict)
from airflow_hetero_gpu.ledger.queue import NoQueueEntry, QueueRecord
from airflow_hetero_gpu.ledger.records import Eviction, Reservation, ReservedGpu, TaskIdentity
from airflow_hetero_gpu.ledger.store import DEFAULT_LEASE_SECONDS, Ledger
from airflow_hetero_gpu.ledger.url import default_url, parse_url

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "Eviction",
    "Ledger",
    "LedgerError",
    "LedgerUrlError",
    "MissingLedger",
    "NoLiveReservation",
    "NoQueueEntry",
    "QueueRecord",
    "Reservation",
    "ReservationConflict",
    "ReservedGpu",
    "TaskIdentity",
    "default_url",
    "parse_url",
]
