"""The ledger's unit of work: one transaction with the repositories, and the admission pass inside the write.

:func:`open_write` (what :meth:`LedgerDatabase.write <airflow_hetero_gpu.ledger.base.LedgerDatabase.write>`
runs) opens a write under the ledger lock (:mod:`airflow_hetero_gpu.ledger.db`: SQLite's ``BEGIN IMMEDIATE``,
PostgreSQL's advisory lock with the writer's schema version for the guard of
:mod:`airflow_hetero_gpu.ledger.guard`; a database error becomes one line) and hands the body a
:class:`UnitOfWork`: the connection, the transaction's time, and one repository per concern
(:class:`Rooms`). Each repository holds the SQL of its concern; it reaches another concern only
through that repository's public methods on the same unit of work.

A write that frees or changes GPUs runs the admission pass (:mod:`airflow_hetero_gpu.ledger.admission`)
before it commits: :meth:`UnitOfWork.admit` runs it at once (the write reads what it admitted),
:meth:`UnitOfWork.admit_before_commit` once the write's body is done, in the same transaction.
Its cluster comes from :meth:`UnitOfWork.cluster`: the one the write warmed before the lock, if
it did (:attr:`UnitOfWork.warmed`), even when a collection changed the inventory meanwhile.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Iterator

from sqlalchemy.engine import Connection

from airflow_hetero_gpu.ledger.db import read_transaction, write_transaction

if TYPE_CHECKING:
    from airflow_hetero_gpu.core.admission import AdmissionResult
    from airflow_hetero_gpu.core.cluster import Cluster
    from airflow_hetero_gpu.ledger.admission import Warmed
    from airflow_hetero_gpu.ledger.base import LedgerDatabase
    from airflow_hetero_gpu.ledger.drains import Drains
    from airflow_hetero_gpu.ledger.fleet import Inventory
    from airflow_hetero_gpu.ledger.health import Evictions
    from airflow_hetero_gpu.ledger.history import History
    from airflow_hetero_gpu.ledger.preemption import Preemptions
    from airflow_hetero_gpu.ledger.queue import Queue
    from airflow_hetero_gpu.ledger.reservations import Reservations
    from airflow_hetero_gpu.ledger.teams import TeamQuotas


@dataclass(frozen=True)
class Rooms:
    """The ledger's repositories, one per concern."""

    reservations: Reservations
    queue: Queue
    preemptions: Preemptions
    teams: TeamQuotas
    inventory: Inventory
    evictions: Evictions
    drains: Drains
    history: History


class UnitOfWork:
    """One transaction of the ledger: ``conn``, its time ``now``, the repositories (``reservations``,
    ``queue``, ``preemptions``, ``teams``, ``inventory``, ``evictions``, ``drains``, ``history``)
    and the database ``db`` it runs on."""

    def __init__(self, db: LedgerDatabase, conn: Connection, now: datetime):
        self.db, self.conn, self.now = db, conn, now
        rooms = db.rooms
        if rooms is None:
            raise RuntimeError("the ledger's repositories are not set (compose them with Ledger)")
        self.rooms = rooms
        self.reservations, self.queue, self.preemptions = rooms.reservations, rooms.queue, rooms.preemptions
        self.teams, self.inventory, self.evictions = rooms.teams, rooms.inventory, rooms.evictions
        self.drains, self.history = rooms.drains, rooms.history
        self.admit_at_end = False
        #: what the pass run by :meth:`admit_before_commit` did (None: nobody waited, or it could not run)
        self.admission: AdmissionResult | None = None
        #: the cluster this write built before taking the lock (``LedgerDatabase.write(warm=True)``)
        self.warmed: Warmed | None = None

    def cluster(self) -> Cluster | None:
        """The cluster of the stored inventory for this write's pass (None: no inventory). A write
        that warmed it before the lock uses what it warmed when a collection changed the
        inventory meanwhile: nothing is parsed under the lock
        (:class:`~airflow_hetero_gpu.ledger.admission.ClusterCache`)."""
        return self.db.clusters.get(self.conn, self.now, self.warmed)

    def admit(self) -> AdmissionResult | None:
        """One admission pass now, in this transaction."""
        from airflow_hetero_gpu.ledger.admission import run_pass

        return run_pass(self)

    def admit_before_commit(self) -> None:
        """Run one admission pass once the write's body is done, before it commits (its result:
        :attr:`admission`)."""
        self.admit_at_end = True

    def finish(self) -> None:
        """The end of the write's body (the write then commits)."""
        if self.admit_at_end:
            self.admit_at_end = False
            self.admission = self.admit()

    def expire(self, *, admit: bool = True) -> list[str]:
        """Sweep expired reservations (and drained hosts' jobs past their deadline) and queue
        entries; when anything went, run an admission pass (``admit``), since GPUs or claims were
        freed. Returns the job ids of the reservations that went."""
        ids = self.reservations.expire_due(self)
        gone = self.queue.sweep(self)
        if admit and (ids or gone):
            self.admit()
        return ids

    def hook(self, action: str, job_id: str) -> None:
        """The database's ``before_commit`` hook (tests die here mid-way)."""
        self.db.hook(action, job_id)


@contextmanager
def open_write(db: LedgerDatabase, action: str) -> Iterator[UnitOfWork]:
    """A write of ``db``: the ledger lock from the first statement to the commit (SQLite's
    ``BEGIN IMMEDIATE``; PostgreSQL's advisory lock, with the schema version this process writes
    declared to the writers' guard), its database errors as one line naming ``action``; the
    admission pass it asked for (:meth:`UnitOfWork.admit_before_commit`) runs after its body,
    before the commit."""
    with db.errors(action), write_transaction(db.engine) as conn:
        uow = UnitOfWork(db, conn, db.now_in(conn))
        yield uow
        uow.finish()


@contextmanager
def open_read(db: LedgerDatabase, action: str) -> Iterator[UnitOfWork]:
    """A read of ``db`` over one consistent snapshot, taking no lock (read-only on PostgreSQL)."""
    with db.errors(action), read_transaction(db.engine) as conn:
        yield UnitOfWork(db, conn, db.now_in(conn))


__all__ = ["Rooms", "UnitOfWork", "open_read", "open_write"]
