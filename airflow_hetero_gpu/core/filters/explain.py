"""Human explanations of why a pool's GPUs are not healthy or not available."""

from __future__ import annotations

from collections import Counter

import numpy as np

from airflow_hetero_gpu.core.drain import drain_reason
from airflow_hetero_gpu.core.foreign import OUTSIDE, outside_reason
from airflow_hetero_gpu.core.view import PoolView

MAX_EXAMPLES = 3


def _examples(view: PoolView, positions) -> list:
    gpus = view.state.cluster.gpus
    return [gpus[int(p)] for p in positions[:MAX_EXAMPLES]]


def unit_name(g) -> str:
    """``dgx-a1 GPU3``, or ``dgx-a1 GPU3 MIG 1`` for a MIG instance."""
    return f"{g.host} GPU{g.index}" + ("" if g.instance is None else f" MIG {g.instance}")


def _more(total: int, shown: int) -> str:
    return f", +{total - shown} more" if total > shown else ""


def describe_unhealthy(view: PoolView) -> str:
    """``"dgx-a1 GPU3 ecc, dgx-a1 GPU5 xid-79"``: the pool's unhealthy GPUs with reasons."""
    bad = view.positions_where("healthy", False)
    ev = view.state.evicted
    parts = []
    for g in _examples(view, bad):
        reasons = list(g.reasons) or [f"evicted ({', '.join(ev.get(g.key, ())) or 'abnormal'})"]
        parts.append(f"{unit_name(g)} {'+'.join(reasons)}")
    return ", ".join(parts) + _more(len(bad), len(parts))


def describe_unavailable(view: PoolView) -> str:
    """Why the pool's GPUs are not available, counted by cause (first cause that applies)."""
    st = view.state
    pos = view.positions
    healthy = st.healthy[pos]
    reserved = st.reserved[pos] & healthy
    held = st.reserved[pos] | ~st.cluster.schedulable[pos]
    unschedulable = ~st.cluster.schedulable[pos] & healthy & ~st.reserved[pos]
    drained = (st.on_drained[pos] if st.on_drained is not None else np.zeros(len(pos), dtype=bool)) \
        & healthy & ~held
    outside = st.outside[pos] & healthy & ~held & ~drained
    busy = st.busy[pos] & healthy & ~held & ~outside & ~drained
    low_mem = ~st.memory_ok[pos] & healthy & ~held & ~st.busy[pos] & ~outside & ~drained
    parts: list[str] = []
    n_unhealthy = int((~healthy).sum())
    if n_unhealthy:
        parts.append(f"{n_unhealthy} unhealthy ({describe_unhealthy(view)})")
    if reserved.any():
        held_keys = map(st.cluster.keys.__getitem__, pos[reserved].tolist())
        jobs = Counter(map(st.holders().get, held_keys))  # C-level loops: thousands of GPUs per pool
        if None in jobs:
            jobs["?"] = jobs.pop(None)
        listed = ", ".join(f"{job}×{n}" if n > 1 else job for job, n in sorted(jobs.items())[:MAX_EXAMPLES])
        parts.append(f"{int(reserved.sum())} reserved (by {listed}{_more(len(jobs), min(len(jobs), MAX_EXAMPLES))})")
    if unschedulable.any():
        gpus = [st.cluster.gpus[int(p)] for p in pos[unschedulable]]
        why = Counter(r for g in gpus for r in g.unschedulable)
        shown = ", ".join(f"{unit_name(g)} {'+'.join(g.unschedulable)}" for g in gpus[:MAX_EXAMPLES])
        parts.append(f"{int(unschedulable.sum())} not handed out whole ({shown}{_more(len(gpus), min(len(gpus), MAX_EXAMPLES))})"
                     if set(why) == {"mig-enabled"} else
                     f"{int(unschedulable.sum())} unschedulable ({shown}{_more(len(gpus), min(len(gpus), MAX_EXAMPLES))})")
    if drained.any():
        hosts = sorted({st.cluster.gpus[int(p)].host for p in pos[drained]})
        shown = ", ".join(drain_reason(h, st.drained[h]) for h in hosts[:MAX_EXAMPLES])
        parts.append(f"{int(drained.sum())} on drained hosts ({shown}{_more(len(hosts), min(len(hosts), MAX_EXAMPLES))})")
    if outside.any():
        gpus = [st.cluster.gpus[int(p)] for p in pos[outside]]
        shown = ", ".join(f"{unit_name(g)} {outside_reason(g)}" for g in gpus[:MAX_EXAMPLES])
        parts.append(f"{int(outside.sum())} {OUTSIDE} ({shown}{_more(len(gpus), min(len(gpus), MAX_EXAMPLES))})")
    if busy.any():
        parts.append(f"{int(busy.sum())} busy (load > {st.thresholds.busy_utilization:g})")
    if low_mem.any():
        need = st.request.gpu_memory_mib
        parts.append(f"{int(low_mem.sum())} with less than {need:g} MiB free")
    return "; ".join(parts) or "no GPUs"
