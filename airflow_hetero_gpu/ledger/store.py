"""The ledger: GPU reservations with leases, evictions, replacements and the fleet's inventory.

Each write is one locked transaction (:mod:`airflow_hetero_gpu.ledger.db`). The class is put
together from one part per concern:

* :mod:`~airflow_hetero_gpu.ledger.base` — opening (writers create and upgrade, readers only
  open an existing current ledger), the schema, transactions, the clock;
* :mod:`~airflow_hetero_gpu.ledger.reservations` — reserve (plan and claim), renew, release,
  expire, replace (S12), the hosts each job ran on;
* :mod:`~airflow_hetero_gpu.ledger.health` — evictions (S11), readmissions, the watch's memory;
* :mod:`~airflow_hetero_gpu.ledger.fleet` — the inventory (one collector, many readers), its
  history, health sensors' records between pokes;
* :mod:`~airflow_hetero_gpu.ledger.drains` — drained hosts (no new placement there), removed hosts;
* :mod:`~airflow_hetero_gpu.ledger.queue` — the queue of waiting jobs, and the admission pass
  (:mod:`~airflow_hetero_gpu.ledger.admission`) that every write freeing or changing GPUs runs
  before it commits;
* :mod:`~airflow_hetero_gpu.ledger.teams` — the teams' quotas, their fair-share history and
  standing (docs/teams.md).
"""

from __future__ import annotations

from airflow_hetero_gpu.ledger.base import LedgerBase
from airflow_hetero_gpu.ledger.drains import DrainsMixin
from airflow_hetero_gpu.ledger.fleet import FleetMixin
from airflow_hetero_gpu.ledger.health import HealthMixin
from airflow_hetero_gpu.ledger.preemption import PreemptionMixin
from airflow_hetero_gpu.ledger.queue import QueueMixin
from airflow_hetero_gpu.ledger.reservations import DEFAULT_LEASE_SECONDS, ReservationsMixin
from airflow_hetero_gpu.ledger.teams import TeamsMixin


class Ledger(PreemptionMixin, QueueMixin, TeamsMixin, FleetMixin, HealthMixin, DrainsMixin, ReservationsMixin, LedgerBase):
    """GPU reservations, leases, evictions and the fleet's inventory in their own SQL database
    (SPEC §8, §9).

    Writers open it with :meth:`from_url` (``None`` for the default SQLite file; the schema is
    created or upgraded on open), readers with :meth:`open_existing` (nothing is created or
    changed); :meth:`close` when done, or use it as a context manager.
    """


__all__ = ["DEFAULT_LEASE_SECONDS", "Ledger"]
