"""Drained hosts in the ledger: the drains' repository (``hetero-gpu drain / undrain / hosts remove``).

A drain is a row of ``host_drains``: the host, the reason, an optional deadline, who drained it
and when. Every reader that plans (the operator, the queue's admission pass, ``hetero-gpu
plan / pools``, the page) passes the drained hosts to the planner as an input
(:mod:`airflow_hetero_gpu.core.drain`), so no new placement or claim lands there, on every worker
at once. The jobs running on a drained host run on; past the deadline,
:meth:`Drains.end_past_deadline` preempts them (a task's job checkpoints, stops and resumes elsewhere;
a reservation no task holds is released). Every write's sweep of expired leases calls it, and
so does every stored collection.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection

from airflow_hetero_gpu.durations import MAX_DURATION_S
from airflow_hetero_gpu.ledger.errors import LedgerError
from airflow_hetero_gpu.ledger.preemption import DRAIN_DEADLINE
from airflow_hetero_gpu.ledger.schema import NAME
from airflow_hetero_gpu.ledger.schema import gpu_watch as watch_t
from airflow_hetero_gpu.ledger.schema import host_drains as drains_t
from airflow_hetero_gpu.ledger.schema import inventory_hosts as hosts_t
from airflow_hetero_gpu.ledger.schema import reservation_gpus as gpu_t
from airflow_hetero_gpu.ledger.schema import reservations as res_t

if TYPE_CHECKING:
    from airflow_hetero_gpu.ledger.base import LedgerDatabase
    from airflow_hetero_gpu.ledger.unit_of_work import UnitOfWork

MAX_REASON = 500


@dataclass(frozen=True)
class Drain:
    """One drained host."""

    host: str
    reason: str
    deadline: datetime | None
    drained_at: datetime
    drained_by: str
    ended: tuple[str, ...] = ()  # the jobs ended at the deadline

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "reason": self.reason,
                "deadline": self.deadline.isoformat() if self.deadline else None,
                "drained_at": self.drained_at.isoformat(), "drained_by": self.drained_by, "ended": list(self.ended)}


def _drain(r: Any) -> Drain:
    return Drain(r.host, r.reason, r.deadline, r.drained_at, r.drained_by, tuple(r.ended or ()))


def _check_hosts(hosts: Iterable[str]) -> list[str]:
    names = list(dict.fromkeys(hosts))
    if not names:
        raise LedgerError("hosts: name at least one host")
    for h in names:
        if not isinstance(h, str) or not h.strip() or len(h) > NAME:
            raise LedgerError(f"host: expected a host name, got {h!r}")
    return names


def _known(conn: Connection, names: Sequence[str], what: str) -> None:
    """LedgerError naming the first host the inventory does not hold (and the hosts it does)."""
    known = set(conn.execute(select(hosts_t.c.host)).scalars())
    missing = [h for h in names if h not in known]
    if missing:
        listed = ", ".join(sorted(known)[:8]) + (", ..." if len(known) > 8 else "")
        raise LedgerError(f"cannot {what} host {missing[0]!r}: the fleet's inventory has no such host "
                          f"(it has: {listed or 'none'})")


def holders(conn: Connection, now: datetime, host: str) -> list[str]:
    """The jobs whose live reservations hold a GPU of ``host``."""
    return sorted(set(conn.execute(
        select(gpu_t.c.job_id).join(res_t, res_t.c.job_id == gpu_t.c.job_id)
        .where(gpu_t.c.host == host, res_t.c.expires_at > now)).scalars()))


def drained_map(conn: Connection) -> dict[str, str]:
    """{drained host: reason}: the planner's input."""
    return {r.host: r.reason for r in conn.execute(select(drains_t.c.host, drains_t.c.reason))}


class Drains:
    """Drain, undrain and remove hosts; what planners and the sweep of expired leases read of them."""

    def __init__(self, db: LedgerDatabase):
        self.db = db

    # --- inside a transaction ------------------------------------------------------------------
    def drained(self, uow: UnitOfWork) -> dict[str, str]:
        """{drained host: reason}: the planner's input."""
        return drained_map(uow.conn)

    def end_job_past_deadline(self, uow: UnitOfWork, job_id: str, host: str, reason: str) -> bool:
        """What happens to a job still running on a drained host at the deadline; True when its
        reservation was released now.

        A job a task holds (its reservation names the task) is preempted (docs/preemption.md): its
        reservation is marked ``preempting`` for the drain, so at its next lease renewal the operator
        signals it, waits its grace for a checkpoint, stops what is left and puts it back in the
        queue, where it resumes on other hosts (the drained one takes no placement). A reservation no
        task answers for (``hetero-gpu plan --reserve``) is released."""
        conn, now = uow.conn, uow.now
        row = conn.execute(select(res_t.c.dag_id, res_t.c.preempting).where(res_t.c.job_id == job_id)).first()
        if row is None:
            return False
        if row.dag_id is None:  # a record of its preemption for a job closes with it
            uow.reservations.drop(uow, [job_id], DRAIN_DEADLINE)
            return True
        if row.preempting:  # already being stopped (for the drain, or for a job)
            return False
        why = f"host {host} drained: {reason}; its deadline passed"
        uow.preemptions.open_record(uow, job_id, {"by": f"drain of {host}", "drain": host, "reason": why,
                                                  "at": now.isoformat(), "priority": None, "team": None})
        return False

    def end_past_deadline(self, uow: UnitOfWork) -> list[str]:
        """Act on the jobs still on drained hosts whose deadline has passed (see
        :meth:`end_job_past_deadline`); returns the ids of those released now."""
        conn, now = uow.conn, uow.now
        due = list(conn.execute(select(drains_t).where(drains_t.c.deadline.is_not(None), drains_t.c.deadline <= now)))
        ended: list[str] = []
        for row in due:
            jobs = holders(conn, now, row.host)
            ended.extend(job for job in jobs if self.end_job_past_deadline(uow, job, row.host, row.reason))
            if jobs and set(jobs) - set(row.ended or ()):
                conn.execute(update(drains_t).where(drains_t.c.host == row.host).values(
                    ended=sorted(set(row.ended or ()) | set(jobs))))
        return sorted(set(ended))

    # --- the operations ------------------------------------------------------------------------

    def drain(self, hosts: Iterable[str], reason: str, *, deadline_s: float | None = None,
              by: str = "hetero-gpu drain") -> list[Drain]:
        """Drain ``hosts`` (all or none): no new placement or claim there; with ``deadline_s``,
        the jobs still running there that many seconds from now are ended. Draining a drained host
        again replaces its reason and deadline."""
        names = _check_hosts(hosts)
        if not isinstance(reason, str) or not reason.strip():
            raise LedgerError("reason: say why the hosts are drained (--reason TEXT), got an empty reason")
        if len(reason) > MAX_REASON:
            raise LedgerError(f"reason: longer than {MAX_REASON} characters")
        if deadline_s is not None and not 0 < deadline_s <= MAX_DURATION_S:  # NaN, inf and 1e300 too
            raise LedgerError(f"deadline: expected a positive number of seconds, at most {MAX_DURATION_S:.0f} "
                              f"(365 days), got {deadline_s!r}")
        reason = " ".join(reason.split())
        with self.db.write("drain hosts") as uow:
            conn, now = uow.conn, uow.now
            _known(conn, names, "drain")
            deadline = now + timedelta(seconds=deadline_s) if deadline_s is not None else None
            conn.execute(delete(drains_t).where(drains_t.c.host.in_(names)))
            conn.execute(insert(drains_t), [{"host": h, "reason": reason, "deadline": deadline, "drained_at": now,
                                             "drained_by": by[:NAME], "ended": None} for h in names])
            rows = conn.execute(select(drains_t).where(drains_t.c.host.in_(names)).order_by(drains_t.c.host))
            out = [_drain(r) for r in rows]
            uow.admit_before_commit()  # claims on the drained hosts move elsewhere
        return out

    def undrain(self, hosts: Iterable[str]) -> list[str]:
        """Put drained ``hosts`` back into placement; returns those that were drained. A host that
        is neither drained nor in the inventory is an error (nothing changes)."""
        names = _check_hosts(hosts)
        with self.db.write("undrain hosts") as uow:
            conn = uow.conn
            drained = set(conn.execute(select(drains_t.c.host).where(drains_t.c.host.in_(names))).scalars())
            _known(conn, [h for h in names if h not in drained], "undrain")
            if drained:
                conn.execute(delete(drains_t).where(drains_t.c.host.in_(sorted(drained))))
                uow.admit_before_commit()  # the GPUs are back for the queue
        return sorted(drained)

    def drains(self) -> list[Drain]:
        with self.db.read("read the drained hosts") as uow:
            return [_drain(r) for r in uow.conn.execute(select(drains_t).order_by(drains_t.c.host))]

    def drained_map(self) -> dict[str, str]:
        """{drained host: reason}, for :func:`airflow_hetero_gpu.core.planner.plan`'s ``drained``."""
        with self.db.read("read the drained hosts") as uow:
            return self.drained(uow)

    def jobs_on(self, host: str) -> list[str]:
        """The jobs whose live reservations hold a GPU of ``host``."""
        with self.db.read("read the jobs of a host") as uow:
            return holders(uow.conn, uow.now, host)

    def remove_host(self, host: str) -> None:
        """Drop ``host`` from the inventory (its drain and the watch's memory of it go too).
        Refused while a job holds one of its GPUs."""
        (name,) = _check_hosts([host])
        with self.db.write("remove a host") as uow:
            conn, now = uow.conn, uow.now
            _known(conn, [name], "remove")
            jobs = holders(conn, now, name)
            if jobs:
                raise LedgerError(f"cannot remove host {name!r}: job {jobs[0]!r} holds its GPUs"
                                  + (f" (and {len(jobs) - 1} more)" if len(jobs) > 1 else "")
                                  + "; drain it and wait for the jobs to end")
            conn.execute(delete(hosts_t).where(hosts_t.c.host == name))
            conn.execute(delete(drains_t).where(drains_t.c.host == name))
            conn.execute(delete(watch_t).where(watch_t.c.host == name))
            uow.admit_before_commit()  # claims on its GPUs are void


__all__ = ["Drain", "Drains", "drained_map", "holders"]
