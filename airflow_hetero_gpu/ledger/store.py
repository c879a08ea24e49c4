"""The ledger: GPU reservations with leases, evictions, replacements and the fleet's inventory.

``Ledger`` is a facade over one repository per concern, each holding the SQL of its concern
(:class:`~airflow_hetero_gpu.ledger.unit_of_work.Rooms`):

* :mod:`~airflow_hetero_gpu.ledger.reservations` — reserve (plan and claim), renew, release,
  expire, replace (S12), the hosts each job ran on;
* :mod:`~airflow_hetero_gpu.ledger.queue` — the queue of waiting jobs;
* :mod:`~airflow_hetero_gpu.ledger.preemption` — the marks on victims, their ending, the record;
* :mod:`~airflow_hetero_gpu.ledger.teams` — the teams' quotas, their fair-share history and
  standing (docs/teams.md);
* :mod:`~airflow_hetero_gpu.ledger.fleet` — the inventory (one collector, many readers), health
  sensors' records between pokes;
* :mod:`~airflow_hetero_gpu.ledger.health` — evictions (S11), readmissions, the watch's memory;
* :mod:`~airflow_hetero_gpu.ledger.drains` — drained hosts (no new placement there), removed hosts;
* :mod:`~airflow_hetero_gpu.ledger.history` — history samples and GPU events.

Each write is one unit of work (:mod:`~airflow_hetero_gpu.ledger.unit_of_work`): one locked
transaction of the database (:mod:`~airflow_hetero_gpu.ledger.base`), with the repositories, and
the admission pass (:mod:`~airflow_hetero_gpu.ledger.admission`) that every write freeing or
changing GPUs runs before it commits.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Callable, Iterator

from sqlalchemy.engine import Connection

from airflow_hetero_gpu.ledger.base import AdmissionSettings, Clock, CommitHook, LedgerDatabase
from airflow_hetero_gpu.ledger.drains import Drains
from airflow_hetero_gpu.ledger.fleet import Inventory
from airflow_hetero_gpu.ledger.health import Evictions
from airflow_hetero_gpu.ledger.history import History
from airflow_hetero_gpu.ledger.preemption import Preemptions
from airflow_hetero_gpu.ledger.queue import Queue
from airflow_hetero_gpu.ledger.reservations import DEFAULT_LEASE_SECONDS, Reservations
from airflow_hetero_gpu.ledger.teams import TeamQuotas
from airflow_hetero_gpu.ledger.unit_of_work import Rooms


def _in(room: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """The facade's ``method`` of the repository ``room`` (its name, signature and docstring)."""
    name = method.__name__

    @functools.wraps(method)
    def call(self: Ledger, *args: Any, **kwargs: Any) -> Any:
        return getattr(getattr(self.rooms, room), name)(*args, **kwargs)

    return call


class Ledger(AdmissionSettings):
    """GPU reservations, leases, evictions and the fleet's inventory in their own SQL database
    (SPEC §8, §9).

    Writers open it with :meth:`from_url` (``None`` for the default SQLite file; the schema is
    created or upgraded on open), readers with :meth:`open_existing` (nothing is created or
    changed); :meth:`close` when done, or use it as a context manager.

    ``create``: make the database (SQLite file) and its tables when missing; ``migrate``: apply
    missing schema steps. ``clock`` replaces the lease clock (tests); ``before_commit(action,
    job_id)`` runs inside the reserve and replace transactions just before they commit (tests use
    it to die mid-way). ``db`` is the database and ``rooms`` its repositories, one per concern;
    ``queue_aging_interval_s`` and ``preemption`` are the admission pass's settings.
    """

    def __init__(self, url: str | None = None, *, create: bool = True, migrate: bool = True,
                 clock: Clock | None = None, before_commit: CommitHook | None = None):
        self.db = LedgerDatabase(url, create=create, migrate=migrate, clock=clock, before_commit=before_commit,
                                 settings=self)
        self.url = self.db.url
        db = self.db
        self.rooms = db.rooms = Rooms(reservations=Reservations(db), queue=Queue(db), preemptions=Preemptions(db),
                                      teams=TeamQuotas(db), inventory=Inventory(db), evictions=Evictions(db),
                                      drains=Drains(db), history=History(db))
        try:
            db.ensure_schema()
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_url(cls, url: str | None = None, **kwargs: Any):
        """Open the ledger at ``url`` (SQLite path or URL, PostgreSQL URL; None: the default file),
        creating or upgrading it as needed (writers)."""
        return cls(url, **kwargs)

    @classmethod
    def open_existing(cls, url: str | None = None, **kwargs: Any):
        """Open an existing ledger with the current schema, creating and changing nothing (readers).

        A missing database, one that holds no ledger, or one with an older or newer schema is a
        one-line :class:`LedgerError` saying what to do.
        """
        return cls(url, create=False, migrate=False, **kwargs)

    @property
    def display_url(self) -> str:
        return self.db.display_url

    @property
    def dialect(self) -> str:
        return self.db.dialect

    def close(self) -> None:
        """Close every pooled connection."""
        db = getattr(self, "db", None)
        if db is not None:
            db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({self.display_url!r})"

    def now(self) -> datetime:
        """The ledger's clock (the PostgreSQL server's, or this machine's for SQLite)."""
        return self.db.now()

    def schema_version(self) -> int:
        return self.db.schema_version()

    # --- one transaction, for tests and tools that read or write rows themselves -----------------
    @contextmanager
    def _write(self, action: str) -> Iterator[tuple[Connection, datetime]]:
        with self.db.write(action) as uow:
            yield uow.conn, uow.now

    @contextmanager
    def _read(self, action: str) -> Iterator[tuple[Connection, datetime]]:
        with self.db.read(action) as uow:
            yield uow.conn, uow.now

    # --- reservations ---------------------------------------------------------------------------
    reserve = _in("reservations", Reservations.reserve)
    renew = _in("reservations", Reservations.renew)
    release = _in("reservations", Reservations.release)
    expire = _in("reservations", Reservations.expire)
    get = _in("reservations", Reservations.get)
    live_reservations = _in("reservations", Reservations.live_reservations)
    reserved_map = _in("reservations", Reservations.reserved_map)
    plan = _in("reservations", Reservations.plan)
    replace = _in("reservations", Reservations.replace)
    add_job_hosts = _in("reservations", Reservations.add_job_hosts)
    job_hosts = _in("reservations", Reservations.job_hosts)
    forget_job_hosts = _in("reservations", Reservations.forget_job_hosts)

    # --- the queue ------------------------------------------------------------------------------
    enqueue = _in("queue", Queue.enqueue)
    renew_queue_entry = _in("queue", Queue.renew_queue_entry)
    take_admission = _in("queue", Queue.take_admission)
    leave_queue = _in("queue", Queue.leave_queue)
    run_admission = _in("queue", Queue.run_admission)
    queue_entry = _in("queue", Queue.queue_entry)
    queue = _in("queue", Queue.queue)

    # --- preemption -----------------------------------------------------------------------------
    note_checkpoint = _in("preemptions", Preemptions.note_checkpoint)
    finish_preemption = _in("preemptions", Preemptions.finish_preemption)
    preemptions = _in("preemptions", Preemptions.preemptions)

    # --- teams ----------------------------------------------------------------------------------
    apply_teams = _in("teams", TeamQuotas.apply_teams)
    teams = _in("teams", TeamQuotas.teams)
    team_standing = _in("teams", TeamQuotas.team_standing)
    team_samples = _in("teams", TeamQuotas.team_samples)

    # --- the inventory --------------------------------------------------------------------------
    store_collection = _in("inventory", Inventory.store_collection)
    record_health_check = _in("inventory", Inventory.record_health_check)
    inventory = _in("inventory", Inventory.inventory)
    inventory_version = _in("inventory", Inventory.inventory_version)
    has_inventory = _in("inventory", Inventory.has_inventory)
    watch_run_state = _in("inventory", Inventory.watch_run_state)
    save_watch_run_state = _in("inventory", Inventory.save_watch_run_state)

    # --- evictions and the health watch ---------------------------------------------------------
    evict = _in("evictions", Evictions.evict)
    record_check = _in("evictions", Evictions.record_check)
    uncordon = _in("evictions", Evictions.uncordon)
    watch_streaks = _in("evictions", Evictions.watch_streaks)
    apply_watch_check = _in("evictions", Evictions.apply_watch_check)
    evicted_map = _in("evictions", Evictions.evicted_map)
    evictions = _in("evictions", Evictions.evictions)

    # --- drains ---------------------------------------------------------------------------------
    drain = _in("drains", Drains.drain)
    undrain = _in("drains", Drains.undrain)
    drains = _in("drains", Drains.drains)
    drained_map = _in("drains", Drains.drained_map)
    jobs_on = _in("drains", Drains.jobs_on)
    remove_host = _in("drains", Drains.remove_host)

    # --- history --------------------------------------------------------------------------------
    host_samples = _in("history", History.host_samples)
    gpu_events = _in("history", History.gpu_events)
    collections = _in("history", History.collections)


__all__ = ["DEFAULT_LEASE_SECONDS", "Ledger"]
