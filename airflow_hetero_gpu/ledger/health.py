"""Evictions (SPEC §8, S11) and the health watch's records: the evictions' repository.

An evicted GPU leaves every pool until readmitted: after ``readmit_after_healthy_checks``
consecutive healthy checks, or at once with ``uncordon``. Every eviction, readmission and
uncordon is also an event of the history (:mod:`airflow_hetero_gpu.ledger.history`).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from sqlalchemy import and_, delete, insert, select, update
from sqlalchemy.engine import Connection

from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.core.watch import Observation, Step, WatchPolicy
from airflow_hetero_gpu.ledger import watch
from airflow_hetero_gpu.ledger.checks import check_key, check_reasons
from airflow_hetero_gpu.ledger.errors import LedgerError
from airflow_hetero_gpu.ledger.records import Eviction
from airflow_hetero_gpu.ledger.schema import evictions as ev_t

if TYPE_CHECKING:
    from airflow_hetero_gpu.ledger.base import LedgerDatabase
    from airflow_hetero_gpu.ledger.unit_of_work import UnitOfWork


class Evictions:
    """Evictions, readmissions and the watch's memory."""

    def __init__(self, db: LedgerDatabase):
        self.db = db

    # --- evictions (S11) ------------------------------------------------------------------------
    def evict(self, key: tuple[str, int], uuid: str | None = None, reasons: Iterable[str] | str = ()) -> Eviction:
        """Record ``key`` as abnormal: it leaves every pool until readmitted.

        Evicting an evicted GPU adds the new reasons and restarts its healthy-check count. Health
        is a GPU's: a MIG instance's key evicts its GPU, and so every instance of it.
        """
        key = check_key(key).gpu
        with self.db.write(f"evict GPU {key}", warm=True) as uow:
            out = self.record(uow, key, uuid, check_reasons(reasons))
            uow.admit_before_commit()  # a claim on it moves
        return out

    def record(self, uow: UnitOfWork, key: GpuKey, uuid: str | None, reasons: tuple[str, ...]) -> Eviction:
        """Evict ``key`` (or add ``reasons`` to its eviction and restart its healthy-check count)
        in the caller's write; an eviction is also an event of the history."""
        conn, now = uow.conn, uow.now
        where = and_(ev_t.c.host == key.host, ev_t.c.gpu_index == key.index)
        row = conn.execute(select(ev_t).where(where)).first()
        if row is None:
            conn.execute(insert(ev_t).values(host=key.host, gpu_index=key.index, uuid=uuid, reasons=list(reasons),
                                             evicted_at=now, checked_at=now, healthy_checks=0))
            uow.history.record_event(uow, "evicted", key, uuid, reasons)
        else:
            merged = list(dict.fromkeys([*row.reasons, *reasons]))
            conn.execute(update(ev_t).where(where).values(reasons=merged, checked_at=now, healthy_checks=0,
                                                          uuid=uuid or row.uuid))
        return _eviction(conn.execute(select(ev_t).where(where)).one())

    def record_check(
        self,
        key: tuple[str, int],
        healthy: bool,
        readmit_after: int = 3,
        *,
        reasons: Iterable[str] | str = (),
        uuid: str | None = None,
    ) -> Eviction | None:
        """Feed one health check of ``key``; returns its eviction afterwards, or None when it is in.

        An unhealthy check evicts the GPU (with ``reasons``) or resets its count of consecutive
        healthy checks; a healthy check of an evicted GPU counts one, and the ``readmit_after``-th
        in a row readmits it (``ClusterConfig.thresholds.readmit_after_healthy_checks``). A healthy
        check of a GPU that is not evicted changes nothing.
        """
        key = check_key(key).gpu
        if isinstance(readmit_after, bool) or not isinstance(readmit_after, int) or readmit_after < 1:
            raise LedgerError(f"readmit_after: expected a positive integer, got {readmit_after!r}")
        where = and_(ev_t.c.host == key.host, ev_t.c.gpu_index == key.index)
        with self.db.write(f"record a check of GPU {key}") as uow:
            conn, now = uow.conn, uow.now
            row = conn.execute(select(ev_t).where(where)).first()
            if not healthy:
                out = self.record(uow, key, uuid, check_reasons(reasons))
                uow.admit_before_commit()
                return out
            if row is None:
                return None
            count = row.healthy_checks + 1
            if count >= readmit_after:
                conn.execute(delete(ev_t).where(where))
                uow.history.record_event(uow, "readmitted", key, row.uuid, row.reasons)
                uow.admit_before_commit()  # the readmitted GPU goes to the queue
                return None
            conn.execute(update(ev_t).where(where).values(healthy_checks=count, checked_at=now))
            return _eviction(conn.execute(select(ev_t).where(where)).one())

    def uncordon(self, host: str, index: int | None = None) -> list[GpuKey]:
        """Readmit one evicted GPU, or every evicted GPU of ``host`` (index None) at once.

        The health watch's soft-fault counts of those GPUs start again. Returns the GPUs
        readmitted (empty when none was evicted).
        """
        if not isinstance(host, str) or not host:
            raise LedgerError(f"uncordon: expected a host name, got {host!r}")
        where = ev_t.c.host == host
        if index is not None:
            where = and_(where, ev_t.c.gpu_index == check_key((host, index)).index)
        with self.db.write(f"uncordon {host}" + ("" if index is None else f":{index}")) as uow:
            conn = uow.conn
            rows = list(conn.execute(select(ev_t.c.host, ev_t.c.gpu_index, ev_t.c.uuid, ev_t.c.reasons).where(where)))
            keys = [GpuKey(r.host, r.gpu_index) for r in rows]
            if keys:
                conn.execute(delete(ev_t).where(where))
            for r in rows:
                uow.history.record_event(uow, "uncordoned", GpuKey(r.host, r.gpu_index), r.uuid, r.reasons)
            watch.forget_streaks(conn, host, index)
            if keys:
                uow.admit_before_commit()
        return sorted(keys)

    # --- the health watch (docs/health.md) --------------------------------------------------------
    def watch_streaks(self) -> dict[GpuKey, dict[str, int]]:
        """GPU -> consecutive bad checks per soft fault (temperature, hw-slowdown, unreachable)."""
        with self.db.read("read soft-fault streaks") as uow:
            return watch.read_streaks(uow.conn)

    def apply_watch_check(self, observations: Sequence[Observation], policy: WatchPolicy) -> list[Step]:
        """Record one health check of every observed GPU in one locked transaction.

        Per GPU, :func:`airflow_hetero_gpu.core.watch.step` decides from its observation, its
        eviction and its soft-fault streaks: evict (hard faults at once, soft ones after their
        count of bad checks in a row), count a healthy check, readmit, or nothing. Returns the
        steps, in the order of ``observations``.
        """
        with self.db.write(f"record a health check of {len(observations)} GPU(s)") as uow:
            steps = self.apply_check(uow, observations, policy)
            uow.admit_before_commit()
        return steps

    def apply_check(self, uow: UnitOfWork, observations: Sequence[Observation], policy: WatchPolicy) -> list[Step]:
        """:func:`airflow_hetero_gpu.ledger.watch.apply_check` in the caller's write, its
        evictions through :meth:`record`."""
        def evict(_conn: Connection, _now: datetime, key: GpuKey, uuid: str | None,
                  reasons: tuple[str, ...]) -> Eviction:
            return self.record(uow, key, uuid, reasons)

        return watch.apply_check(uow.conn, uow.now, observations, policy, evict)

    def evicted_map(self) -> dict[GpuKey, tuple[str, ...]]:
        """GPU -> reasons for every evicted GPU."""
        with self.db.read("read evictions") as uow:
            return self.evicted(uow)

    def evictions(self) -> list[Eviction]:
        """Every evicted GPU, by (host, index)."""
        with self.db.read("list evictions") as uow:
            return [_eviction(r) for r in uow.conn.execute(select(ev_t).order_by(ev_t.c.host, ev_t.c.gpu_index))]

    def evicted(self, uow: UnitOfWork) -> dict[GpuKey, tuple[str, ...]]:
        """GPU -> reasons for every evicted GPU, in the caller's transaction."""
        rows = uow.conn.execute(select(ev_t.c.host, ev_t.c.gpu_index, ev_t.c.reasons))
        return {GpuKey(r.host, r.gpu_index): tuple(r.reasons) for r in rows}


def _eviction(row: Any) -> Eviction:
    return Eviction(row.host, row.gpu_index, row.uuid, tuple(row.reasons), row.evicted_at, row.checked_at,
                    row.healthy_checks)
