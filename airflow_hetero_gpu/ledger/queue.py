"""The queue of jobs waiting for GPUs: the queue's repository (docs/queue.md).

A task that cannot be placed now enqueues its request (:meth:`Queue.enqueue`) and keeps its
entry alive with a lease, as reservations do (:meth:`Queue.renew_queue_entry`); an entry
whose lease passes is swept by the next write. Admission is not a daemon: every write that frees
or changes GPUs runs one pass of the core's admission rule in its own transaction
(:mod:`airflow_hetero_gpu.ledger.admission`), so the entry of a job that may start is
``admitted`` — its reservation already written — by the time its holder looks
(:meth:`Queue.queue_entry`, one row). The holder then takes it
(:meth:`Queue.take_admission`) or leaves (:meth:`Queue.leave_queue`, which also
frees an admission it did not take).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Mapping

from sqlalchemy import delete, func, insert, select, update

from airflow_hetero_gpu.core.admission import AdmissionResult
from airflow_hetero_gpu.core.admission.teams import DEFAULT_TEAM
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.ledger.admission import ADMITTED, WAITING
from airflow_hetero_gpu.ledger.checks import check_job_id, check_lease, check_priority, check_team
from airflow_hetero_gpu.ledger.errors import LedgerError, ReservationConflict
from airflow_hetero_gpu.ledger.preemption import RELEASED, may_be_preempted
from airflow_hetero_gpu.ledger.records import Reservation, TaskIdentity
from airflow_hetero_gpu.ledger.schema import queue_entries as q_t
from airflow_hetero_gpu.ledger.schema import reservations as res_t

if TYPE_CHECKING:
    from airflow_hetero_gpu.ledger.base import LedgerDatabase
    from airflow_hetero_gpu.ledger.unit_of_work import UnitOfWork

DEFAULT_QUEUE_LEASE_SECONDS = 120.0


class NoQueueEntry(LedgerError):
    """The job has no queue entry: it left, or its lease expired and the entry was swept."""

    def __init__(self, job_id: str, action: str):
        self.job_id = job_id
        super().__init__(f"cannot {action} job {job_id!r}: it has no queue entry (it left, or its lease expired)")


@dataclass(frozen=True)
class QueueRecord:
    """One queue entry as the ledger holds it, with what the last admission pass said.

    ``state``: ``waiting`` or ``admitted`` (its reservation exists; the holder has not taken it
    yet). ``standing`` (waiting entries): ``head`` (``claim`` holds the GPUs kept for it),
    ``waiting`` or ``impossible``; ``position`` is its place among the waiting jobs.
    """

    job_id: str
    request: dict
    priority: int
    enqueued_at: datetime
    renewed_at: datetime
    expires_at: datetime
    lease_seconds: float
    identity: TaskIdentity | None
    state: str
    checked_at: datetime | None = None
    position: int | None = None
    standing: str | None = None
    reason: str | None = None
    claim: dict | None = None
    admitted_at: datetime | None = None
    admission: dict | None = None
    team: str | None = None

    @property
    def admitted(self) -> bool:
        return self.state == ADMITTED

    @property
    def claimed_gpus(self) -> list[GpuKey]:
        return [GpuKey(*k) for k in ((self.claim or {}).get("gpus") or ())]

    def waited_s(self, now: datetime) -> float:
        end = self.admitted_at if self.admitted_at is not None else now
        return max(0.0, (end - self.enqueued_at).total_seconds())

    def where(self) -> str:
        """``3rd in the queue for pool P; …``: the line the operator logs while it waits."""
        return self.reason or ("admitted" if self.admitted else "waiting for the next admission pass")

    def to_json(self, now: datetime | None = None) -> dict[str, Any]:
        def iso(t: datetime | None) -> str | None:
            return t.isoformat() if t is not None else None

        out = {"job_id": self.job_id, "state": self.state, "position": self.position, "standing": self.standing,
               "priority": self.priority, "request": dict(self.request), "reason": self.reason,
               "claim": self.claim, "admission": self.admission,
               "identity": self.identity.to_json() if self.identity else None,
               "enqueued_at": iso(self.enqueued_at), "renewed_at": iso(self.renewed_at),
               "expires_at": iso(self.expires_at), "checked_at": iso(self.checked_at),
               "admitted_at": iso(self.admitted_at), "team": self.team}
        if now is not None:
            out["waited_s"] = round(self.waited_s(now), 3)
        return out


class Queue:
    """The queue: enqueue, renew, leave, read; the admission pass in every capacity write."""

    def __init__(self, db: LedgerDatabase):
        self.db = db

    # --- writing -------------------------------------------------------------------------------
    def enqueue(self, job_id: str, request: PlanRequest, *, priority: int = 0,
                lease_seconds: float = DEFAULT_QUEUE_LEASE_SECONDS,
                identity: TaskIdentity | Mapping[str, Any] | None = None, team: str | None = None,
                preemptible: bool = False) -> QueueRecord:
        """Put ``job_id`` in the queue (or refresh its entry) and run an admission pass.

        The answer is the entry after the pass: ``admitted`` when the job may start now (its
        reservation, with a lease of ``lease_seconds``, is written), else ``waiting`` with its
        position and reason. Enqueueing a job id again keeps its place in the queue (a retried
        or resumed task) and takes the new request, priority, identity and lease. A job id that
        already holds a live reservation for the same request is admitted to it at once (a
        different request is a :class:`ReservationConflict`). ``team``: the job's team for the
        quotas (docs/teams.md; None: the default team). ``preemptible``: whether the job, once
        admitted, may be preempted (docs/preemption.md).
        """
        job_id = check_job_id(job_id)
        lease = check_lease(lease_seconds)
        if not isinstance(request, PlanRequest):
            raise LedgerError(f"enqueue job {job_id!r}: request: expected a PlanRequest, got {request!r}")
        priority = check_priority(priority, job_id)
        ident = TaskIdentity.coerce(identity)
        team = check_team(team)
        values: dict[str, Any] = {"request": request.to_json(), "priority": priority, "team": team, "preemptible": bool(preemptible),
                                  "lease_seconds": lease.total_seconds(), **(ident.to_json() if ident else {})}
        with self.db.write(f"enqueue job {job_id!r}", warm=True) as uow:
            conn, now = uow.conn, uow.now
            uow.expire(admit=False)
            held = conn.execute(select(res_t.c.request).where(res_t.c.job_id == job_id)).first()
            if held is not None and held.request is not None and held.request != request.to_json():
                raise ReservationConflict(f"job {job_id!r} already holds a reservation for a different request "
                                          f"({held.request}); release it first")
            row = conn.execute(select(q_t.c.state).where(q_t.c.job_id == job_id)).first()
            values.update(renewed_at=now, expires_at=now + lease)
            if row is None:
                conn.execute(insert(q_t).values(job_id=job_id, enqueued_at=now, state=WAITING, **values))
            else:
                if row.state == ADMITTED and held is None:  # its admission was released from outside
                    values.update(state=WAITING, admitted_at=None, admission=None)
                conn.execute(update(q_t).where(q_t.c.job_id == job_id).values(**values))
            if held is not None:  # its reservation renewed like the entry: the holder takes it next
                conn.execute(update(res_t).where(res_t.c.job_id == job_id)
                             .values(renewed_at=now, expires_at=now + lease, **(ident.to_json() if ident else {})))
            uow.admit()
            return _record(conn.execute(select(q_t).where(q_t.c.job_id == job_id)).one())

    def renew_queue_entry(self, job_id: str, lease_seconds: float | None = None) -> QueueRecord:
        """Extend the entry's lease (and, once admitted, its reservation's) to now + ``lease_seconds``
        (default: the lease it was enqueued with). :class:`NoQueueEntry` when the entry is gone."""
        job_id = check_job_id(job_id)
        with self.db.write(f"renew the queue entry of job {job_id!r}", warm=True) as uow:
            conn, now = uow.conn, uow.now
            uow.expire()
            row = conn.execute(select(q_t).where(q_t.c.job_id == job_id)).first()
            if row is None:
                raise NoQueueEntry(job_id, "renew the queue entry of")
            lease = check_lease(float(row.lease_seconds) if lease_seconds is None else lease_seconds)
            conn.execute(update(q_t).where(q_t.c.job_id == job_id).values(renewed_at=now, expires_at=now + lease))
            if row.state == ADMITTED:
                conn.execute(update(res_t).where(res_t.c.job_id == job_id)
                             .values(renewed_at=now, expires_at=now + lease))
            elif self.may_preempt(uow, row):  # its preemption delay passed: a pass may preempt for it
                uow.admit()
            return _record(conn.execute(select(q_t).where(q_t.c.job_id == job_id)).one())

    def take_admission(self, job_id: str) -> Reservation:
        """The holder of an admitted entry takes its reservation: the entry leaves the queue and
        the reservation's lease starts again. :class:`NoQueueEntry` when the entry is gone (its
        lease expired: the reservation went with it), :class:`LedgerError` while it still waits."""
        job_id = check_job_id(job_id)
        with self.db.write(f"take the admission of job {job_id!r}") as uow:
            conn, now = uow.conn, uow.now
            uow.expire()
            row = conn.execute(select(q_t).where(q_t.c.job_id == job_id)).first()
            if row is None:
                raise NoQueueEntry(job_id, "take the admission of")
            if row.state != ADMITTED:
                raise LedgerError(f"job {job_id!r} is not admitted yet: {row.reason or 'waiting'}")
            found = uow.reservations.load(uow, job_id)
            conn.execute(delete(q_t).where(q_t.c.job_id == job_id))
            if not found:
                raise LedgerError(f"job {job_id!r} was admitted but its reservation is gone (released from outside)")
            lease = check_lease(float(row.lease_seconds))
            conn.execute(update(res_t).where(res_t.c.job_id == job_id).values(renewed_at=now, expires_at=now + lease))
            return uow.reservations.load(uow, job_id)[0]

    def leave_queue(self, job_id: str, *, release_admitted: bool = True) -> bool:
        """Take ``job_id`` out of the queue (its task was killed, cleared, or timed out); returns
        whether it had an entry. An admission it did not take is released too (unless
        ``release_admitted`` is False). Runs an admission pass: a head's claim goes with it."""
        job_id = check_job_id(job_id)
        with self.db.write(f"leave the queue: job {job_id!r}", warm=True) as uow:
            conn = uow.conn
            uow.expire(admit=False)
            row = conn.execute(select(q_t.c.state).where(q_t.c.job_id == job_id)).first()
            if row is None:
                return False
            conn.execute(delete(q_t).where(q_t.c.job_id == job_id))
            if row.state == ADMITTED and release_admitted:  # a victim's record closes with it
                uow.reservations.drop(uow, [job_id], RELEASED)
            uow.admit_before_commit()
        return True

    def run_admission(self) -> AdmissionResult | None:
        """One admission pass now, in its own transaction (every capacity write already runs one;
        a health check runs this after its last part)."""
        with self.db.write("run an admission pass", warm=True) as uow:
            uow.expire(admit=False)
            uow.admit_before_commit()
        return uow.admission

    # --- reading -------------------------------------------------------------------------------
    def queue_entry(self, job_id: str) -> QueueRecord | None:
        """The job's entry (one row), or None when it has none or its lease passed."""
        job_id = check_job_id(job_id)
        with self.db.read("read a queue entry") as uow:
            conn, now = uow.conn, uow.now
            row = conn.execute(select(q_t).where(q_t.c.job_id == job_id, q_t.c.expires_at > now)).first()
        return _record(row) if row is not None else None

    def queue(self) -> list[QueueRecord]:
        """Every live entry: the admitted ones not taken yet, then the waiting ones in queue order
        (as the last pass placed them; entries no pass has seen yet last, by time enqueued)."""
        with self.db.read("read the queue") as uow:
            conn, now = uow.conn, uow.now
            rows = [_record(r) for r in conn.execute(select(q_t).where(q_t.c.expires_at > now))]
        return sorted(rows, key=lambda r: (r.state != ADMITTED, r.position is None, r.position or 0,
                                           r.enqueued_at, r.job_id))

    # --- inside the ledger's transactions ------------------------------------------------------
    def may_preempt(self, uow: UnitOfWork, row: Any) -> bool:
        """A waiting entry's renewal runs a pass once it waited the preemption delay and some
        running job could be its victim (passes otherwise run only when GPUs free up, which a
        full fleet of long jobs does not do): a preemptible job of lower priority (one indexed
        read), or, with teams, a job of another team while some team holds more than its quota
        (a reclaim, whatever the priorities; the pass works out whether the entry is within its
        quota and which jobs borrow)."""
        conn, now = uow.conn, uow.now
        rules = self.db.settings.preemption
        if rules is None or row.state != WAITING or (now - row.enqueued_at).total_seconds() < rules.delay_s:
            return False
        ran = (res_t.c.created_at <= now - timedelta(seconds=rules.min_runtime_s), res_t.c.expires_at > now)
        victim = select(res_t.c.job_id).where(may_be_preempted(res_t.c, int(row.priority)), *ran).limit(1)
        if conn.execute(victim).first() is not None:
            return True
        team = row.team or DEFAULT_TEAM
        other = select(res_t.c.job_id).where(func.coalesce(res_t.c.team, DEFAULT_TEAM) != team, *ran).limit(1)
        return (conn.execute(other).first() is not None
                and uow.teams.borrowing_now(uow, uow.teams.cards(uow)))

    def sweep(self, uow: UnitOfWork) -> list[str]:
        """Delete entries whose lease passed (an admitted one's reservation expires with it)."""
        conn, now = uow.conn, uow.now
        ids = list(conn.execute(select(q_t.c.job_id).where(q_t.c.expires_at <= now)).scalars())
        if ids:
            conn.execute(delete(q_t).where(q_t.c.job_id.in_(ids)))
        return sorted(ids)

    def claimed(self, uow: UnitOfWork, *, but: str | None = None) -> dict[GpuKey, str]:
        """GPU -> "claimed for <head>" for every GPU the last pass claimed for a head."""
        out: dict[GpuKey, str] = {}
        for row in uow.conn.execute(select(q_t.c.job_id, q_t.c.claim).where(q_t.c.state == WAITING)):
            if row.job_id != but and row.claim:
                for k in (row.claim or {}).get("gpus") or ():
                    out[GpuKey(*k)] = f"claimed for {row.job_id}"
        return out


def _record(row: Any) -> QueueRecord:
    fields = (row.dag_id, row.run_id, row.task_id, row.try_number, row.map_index)
    return QueueRecord(
        job_id=row.job_id, request=dict(row.request), priority=int(row.priority), enqueued_at=row.enqueued_at,
        renewed_at=row.renewed_at, expires_at=row.expires_at, lease_seconds=float(row.lease_seconds),
        identity=TaskIdentity(*fields) if any(f is not None for f in fields) else None, state=row.state,
        checked_at=row.checked_at, position=row.position, standing=row.standing, reason=row.reason,
        claim=row.claim, admitted_at=row.admitted_at, admission=row.admission, team=row.team)


__all__ = ["DEFAULT_QUEUE_LEASE_SECONDS", "NoQueueEntry", "Queue", "QueueRecord"]
