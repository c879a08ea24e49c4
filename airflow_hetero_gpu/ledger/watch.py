"""The health watch's side of the ledger: one check applied in one locked transaction.

:func:`airflow_hetero_gpu.core.watch.step` decides per GPU; this module reads what the decision
needs (the GPU's eviction and its watch memory, table ``gpu_watch``) and writes what it says,
for every GPU of the check, under the ledger's write lock — so two watchers checking the same
cluster at once count each check in turn instead of overwriting each other. Use it through
:meth:`Ledger.record_check <airflow_hetero_gpu.ledger.store.Ledger.record_check>`.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Callable, Sequence

from sqlalchemy import and_, delete, insert, select, update
from sqlalchemy.engine import Connection

from airflow_hetero_gpu.core import watch as core_watch
from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.ledger import history
from airflow_hetero_gpu.ledger.schema import evictions as ev_t
from airflow_hetero_gpu.ledger.schema import gpu_watch as watch_t

if TYPE_CHECKING:
    from airflow_hetero_gpu.ledger.records import Eviction

EvictFn = Callable[[Connection, datetime, GpuKey, "str | None", "tuple[str, ...]"], "Eviction"]


def read_streaks(conn: Connection) -> dict[GpuKey, dict[str, int]]:
    """GPU -> consecutive bad checks per soft/unreachable reason (only GPUs with a streak)."""
    rows = conn.execute(select(watch_t.c.host, watch_t.c.gpu_index, watch_t.c.streaks))
    return {GpuKey(r.host, r.gpu_index): dict(r.streaks) for r in rows if r.streaks}


def apply_check(conn: Connection, now: datetime, observations: Sequence[core_watch.Observation],
                policy: core_watch.WatchPolicy, evict: EvictFn) -> list[core_watch.Step]:
    """Decide and record one check of every observed GPU (the caller holds the write lock)."""
    keys = [GpuKey(*o.key) for o in observations]
    if len(set(keys)) != len(keys):
        dup = next(k for i, k in enumerate(keys) if k in keys[:i])
        raise ValueError(f"GPU {dup} observed twice in one check")
    evicted = {GpuKey(r.host, r.gpu_index): r for r in conn.execute(select(ev_t))}
    memory = {GpuKey(r.host, r.gpu_index): r for r in conn.execute(select(watch_t))}
    steps = []
    for obs in observations:
        key = GpuKey(*obs.key)
        ev = evicted.get(key)
        mem = memory.get(key)
        st = core_watch.step(obs, dict(mem.streaks) if mem is not None else {},
                             None if ev is None else int(ev.healthy_checks), policy)
        if st.action in (core_watch.EVICT, core_watch.STILL_EVICTED):
            evict(conn, now, key, obs.uuid or None, st.evict_reasons)
        elif st.action in (core_watch.HOLD, core_watch.HEALTHY_CHECK):
            conn.execute(update(ev_t).where(_evicted(key)).values(healthy_checks=st.healthy_checks, checked_at=now))
        elif st.action == core_watch.READMIT:
            conn.execute(delete(ev_t).where(_evicted(key)))
            history.record_event(conn, now, "readmitted", key, obs.uuid or (ev.uuid if ev is not None else None),
                                 ev.reasons if ev is not None else ())
        _remember(conn, now, key, mem, st)
        steps.append(st)
    return steps


def _evicted(key: GpuKey):
    """The WHERE of one GPU's eviction row (built only for the few GPUs a check writes: building
    it for each of 8,000 GPUs cost a 1,000-host check 1 s)."""
    return and_(ev_t.c.host == key.host, ev_t.c.gpu_index == key.index)


def _remember(conn: Connection, now: datetime, key: GpuKey, mem, st: core_watch.Step) -> None:
    streaks = dict(st.streaks)
    if mem is None:
        if streaks:
            conn.execute(insert(watch_t).values(host=key.host, gpu_index=key.index, streaks=streaks,
                                                xid_marker=None, checked_at=now))
        return
    if dict(mem.streaks or {}) == streaks:
        return
    where = and_(watch_t.c.host == key.host, watch_t.c.gpu_index == key.index)
    conn.execute(update(watch_t).where(where).values(streaks=streaks, checked_at=now))


def forget_streaks(conn: Connection, host: str, index: int | None) -> None:
    """An operator readmitted the GPU(s): soft-fault counts start again (Xid markers stay, so an
    Xid already acted on does not evict the GPU again)."""
    where = watch_t.c.host == host
    if index is not None:
        where = and_(where, watch_t.c.gpu_index == index)
    conn.execute(update(watch_t).where(where).values(streaks={}))
