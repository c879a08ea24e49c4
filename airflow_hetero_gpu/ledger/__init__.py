"""The ledger: GPU reservations with leases, evictions and replacements in their own SQL database.

SQLite file by default (``$AIRFLOW_HOME/hetero_gpu_ledger.db``), PostgreSQL in production;
never Airflow's metadata database. See ``docs/ledger.md``.

The names below are imported when first used (PEP 562), so a module of the package (the
inventory's records, the URL parser) or a command line that never opens a ledger does not pay
for the whole ledger and the admission pass it imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_hetero_gpu.lazy import exports

if TYPE_CHECKING:
    from airflow_hetero_gpu.ledger.errors import (LedgerError, LedgerUpgraded, LedgerUrlError, MissingLedger,
                                                  NoLiveReservation, ReservationConflict)
    from airflow_hetero_gpu.ledger.queue import NoQueueEntry, QueueRecord
    from airflow_hetero_gpu.ledger.records import Eviction, Reservation, ReservedGpu, TaskIdentity
    from airflow_hetero_gpu.ledger.store import DEFAULT_LEASE_SECONDS, Ledger
    from airflow_hetero_gpu.ledger.url import default_url, parse_url

_WHERE = {
    "LedgerError": "errors", "LedgerUpgraded": "errors", "LedgerUrlError": "errors", "MissingLedger": "errors", "NoLiveReservation": "errors",
    "ReservationConflict": "errors",
    "NoQueueEntry": "queue", "QueueRecord": "queue",
    "Eviction": "records", "Reservation": "records", "ReservedGpu": "records", "TaskIdentity": "records",
    "DEFAULT_LEASE_SECONDS": "store", "Ledger": "store",
    "default_url": "url", "parse_url": "url",
}

__all__ = sorted(_WHERE)
__getattr__, __dir__ = exports(__name__, _WHERE)
