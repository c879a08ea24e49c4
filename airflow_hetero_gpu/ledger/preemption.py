"""Preemption in the ledger: the preemptions' repository (docs/preemption.md).

The admission pass (:mod:`airflow_hetero_gpu.ledger.admission`) gives the core's preemption rule
the running jobs (:meth:`Preemptions.running_jobs`) and, for each victim it chose, marks the
victim's reservation ``preempting`` and opens a row of ``preemptions``, in its own transaction.
The victim's holder sees the mark at its next lease renewal (``Reservation.preempting``), stops
the job, and calls :meth:`Preemptions.finish_preemption`: in one transaction its GPUs are
freed, the record is closed with the lost work, the job is back in the queue with its original
priority and time enqueued, and an admission pass runs (the preemptor starts). So a victim is
never half-stopped in the ledger: it holds its GPUs, or it waits in the queue.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Sequence

from sqlalchemy import and_, delete, func, insert, select, update
from sqlalchemy.engine import Connection

from airflow_hetero_gpu.core.admission import RunningJob
from airflow_hetero_gpu.ledger.checks import check_job_id, check_lease
from airflow_hetero_gpu.ledger.errors import LedgerError, NoLiveReservation
from airflow_hetero_gpu.ledger.schema import preemptions as pre_t
from airflow_hetero_gpu.ledger.schema import queue_entries as q_t
from airflow_hetero_gpu.ledger.schema import reservation_gpus as gpu_t
from airflow_hetero_gpu.ledger.schema import reservations as res_t

if TYPE_CHECKING:
    from airflow_hetero_gpu.ledger.base import LedgerDatabase
    from airflow_hetero_gpu.ledger.unit_of_work import UnitOfWork

OUTCOMES = ("exited", "killed")
#: How a record closes when its victim's reservation goes another way than a finished preemption.
RELEASED, LEASE_EXPIRED, DRAIN_DEADLINE = "released", "lease expired", "drain deadline"
#: A record left open by a removal that did not close it (an earlier release): closed when its
#: victim's reservation goes, or when the same job id is preempted again.
ABANDONED = "abandoned"


def _own_record(conn: Connection, job_id: str, mark: dict[str, Any]) -> Any:
    """The record a mark opened: by its id, or (a mark without one, made by an earlier release)
    the newest open record of the job."""
    if mark.get("record") is not None:
        return pre_t.c.id == int(mark["record"])
    newest = conn.execute(select(func.max(pre_t.c.id)).where(pre_t.c.victim == job_id,
                                                             pre_t.c.ended_at.is_(None))).scalar()
    return pre_t.c.id == (newest if newest is not None else -1)


def may_be_preempted(cols, below: int):
    """The SQL prefilter of :func:`~airflow_hetero_gpu.core.admission.preemption.eligible` by
    priority: a reservation that a waiting job of priority ``below`` or lower may preempt is
    preemptible and of a lower priority (tests/test_preemption_rule.py checks it against the
    predicate on generated rows). Reclaims are not prefiltered here: they depend on what each team
    holds now."""
    return and_(cols.preemptible.is_(True), func.coalesce(cols.priority, 0) < int(below))


class Preemptions:
    """Preemption's rows: the marks on victims, their ending, the record."""

    def __init__(self, db: LedgerDatabase):
        self.db = db

    # --- inside a write ------------------------------------------------------------------------
    def open_record(self, uow: UnitOfWork, victim: str, mark: dict[str, Any]) -> int:
        """Mark ``victim``'s reservation ``preempting`` (``mark``, with the id of its record) and
        open its record; returns the record's id. A record of the same job id still open is stale
        (the job runs unmarked): it closes as ``abandoned`` and is never taken for this one."""
        conn, now = uow.conn, uow.now
        self.close_records(uow, [victim], ABANDONED)
        gpus = [[h, i] for h, i in conn.execute(select(gpu_t.c.host, gpu_t.c.gpu_index)
                                                .where(gpu_t.c.job_id == victim).order_by(gpu_t.c.slot))]
        record = int(conn.execute(insert(pre_t).values(victim=victim, preemptor=mark["by"], reason=mark["reason"],
                                                       gpus=gpus, decided_at=now)).inserted_primary_key[0])
        conn.execute(update(res_t).where(res_t.c.job_id == victim).values(preempting={**mark, "record": record}))
        return record

    def close_records(self, uow: UnitOfWork, job_ids: Sequence[str], outcome: str) -> None:
        """Close the open records of ``job_ids`` as ``outcome`` (their reservations went)."""
        if job_ids:
            uow.conn.execute(update(pre_t).where(pre_t.c.victim.in_(list(job_ids)), pre_t.c.ended_at.is_(None))
                             .values(ended_at=uow.now, outcome=outcome))

    def running_jobs(self, uow: UnitOfWork, below: int, *, reclaim: bool = False) -> list[RunningJob]:
        """The running jobs for the pass's preemption rule; none (one indexed read) when no
        preemptible job runs at a priority below ``below``, the highest waiting priority, unless
        ``reclaim`` (some team holds above its quota now: its jobs are a reclaim's candidates;
        the pass works out which)."""
        conn, now = uow.conn, uow.now
        if not reclaim:
            some = select(res_t.c.job_id).where(may_be_preempted(res_t.c, below), res_t.c.expires_at > now).limit(1)
            if conn.execute(some).first() is None:
                return []
        out = []
        for res in uow.reservations.load(uow):
            row = res.preemption or {}
            start = res.created_at.timestamp()
            ckpt = row.get("checkpoint_at")
            enqueued = row.get("enqueued_at")
            out.append(RunningJob(res.job_id, tuple(res.keys), int(row.get("priority") or 0), start,
                                  ckpt.timestamp() if ckpt else None, res.team, bool(row.get("preemptible")),
                                  False, (row.get("preempting") or {}).get("by"),  # the pass computes borrowing
                                  enqueued.timestamp() if enqueued else None))
        return out

    def mark(self, uow: UnitOfWork, result: Any) -> None:
        """Mark every victim of the pass's preemptions and open its record."""
        for pre in getattr(result, "preemptions", ()):
            for victim in pre.victims:
                mark = {"by": pre.preemptor, "reason": pre.reasons[victim], "at": uow.now.isoformat(),
                        "priority": pre.priority, "team": pre.team}
                self.open_record(uow, victim, mark)

    # --- the victim's holder -------------------------------------------------------------------
    def note_checkpoint(self, job_id: str, at: datetime | None = None) -> None:
        """The job wrote a checkpoint (at ``at``, default now): the work before it is not lost."""
        job_id = check_job_id(job_id)
        with self.db.write(f"note a checkpoint of job {job_id!r}") as uow:
            conn, now = uow.conn, uow.now
            conn.execute(update(res_t).where(res_t.c.job_id == job_id).values(checkpoint_at=at or now))

    def finish_preemption(self, job_id: str, *, outcome: str, exited_after_s: float,
                          checkpoint: str | None = None, lease_seconds: float | None = None) -> dict:
        """The victim stopped: free its GPUs, close its record (lost work: the time since its last
        checkpoint, or its start, × its GPUs), put it back in the queue with its original priority,
        time enqueued and team, and run an admission pass, all in one transaction. Returns the record."""
        job_id = check_job_id(job_id)
        if outcome not in OUTCOMES:
            raise LedgerError(f"finish_preemption: outcome: expected one of {', '.join(OUTCOMES)}, got {outcome!r}")
        with self.db.write(f"finish the preemption of job {job_id!r}", warm=True) as uow:
            conn, now = uow.conn, uow.now
            uow.expire(admit=False)
            row = conn.execute(select(res_t).where(res_t.c.job_id == job_id)).first()
            if row is None or not row.preempting:
                raise NoLiveReservation(job_id, "finish the preemption of")
            since = max(row.created_at, row.checkpoint_at) if row.checkpoint_at else row.created_at
            lost = max(0.0, (now - since).total_seconds()) * int(row.gpu_count)
            lease = check_lease(lease_seconds if lease_seconds is not None else
                                max(3.0, (row.expires_at - row.renewed_at).total_seconds()))
            mark = dict(row.preempting)
            conn.execute(update(pre_t).where(_own_record(conn, job_id, mark)).values(
                ended_at=now, outcome=outcome, exited_after_s=round(float(exited_after_s), 3),
                lost_gpu_s=round(lost, 3), checkpoint=checkpoint))
            uow.reservations.drop(uow, [job_id], ABANDONED)  # any other open record of the job is stale
            ident = {f: getattr(row, f) for f in ("dag_id", "run_id", "task_id", "map_index", "try_number")}
            conn.execute(delete(q_t).where(q_t.c.job_id == job_id))
            conn.execute(insert(q_t).values(
                job_id=job_id, request=row.request, priority=int(row.priority or 0),
                enqueued_at=row.enqueued_at or row.created_at, renewed_at=now, expires_at=now + lease,
                lease_seconds=lease.total_seconds(), state="waiting", preemptible=bool(row.preemptible), team=row.team,
                **ident))
            uow.admit_before_commit()
            mark.pop("record", None)
            return {**mark, "victim": job_id, "lost_gpu_s": round(lost, 3), "outcome": outcome,
                    "exited_after_s": round(float(exited_after_s), 3), "checkpoint": checkpoint,
                    "gpus": int(row.gpu_count)}

    # --- reading -------------------------------------------------------------------------------
    def preemptions(self, since: timedelta = timedelta(days=1)) -> list[dict]:
        """Preemptions in progress and those decided within ``since``, newest first."""
        with self.db.read("read the preemptions") as uow:
            conn, now = uow.conn, uow.now
            rows = conn.execute(select(pre_t).where((pre_t.c.ended_at.is_(None)) | (pre_t.c.decided_at >= now - since))
                                .order_by(pre_t.c.decided_at.desc(), pre_t.c.id.desc()))

            def iso(t):
                return t.isoformat() if t is not None else None

            return [{"victim": r.victim, "preemptor": r.preemptor, "reason": r.reason, "gpus": r.gpus,
                     "decided_at": iso(r.decided_at), "ended_at": iso(r.ended_at),
                     "state": "in progress" if r.ended_at is None else r.outcome,
                     "exited_after_s": r.exited_after_s, "lost_gpu_s": r.lost_gpu_s, "checkpoint": r.checkpoint}
                    for r in rows]
