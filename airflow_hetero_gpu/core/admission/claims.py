"""The heads' claims: which GPUs are held for a job that cannot start, kept stable between passes.

* **Target.** ``plan()`` on the cluster as if the jobs holding GPUs had ended, in a pool the job
  accepts that has no head yet. Without run-time estimates, the fewest GPUs still held is the best
  guess of "frees up first", so hosts are released in stages: first only the hosts (able to hold
  the whole job) with the fewest held GPUs, then more; a job no host can hold is planned with
  every held GPU released. On the one host chosen, the jobs running there are then released one
  at a time, smallest first, and the first set plan() finds is the claim: it waits on as few
  jobs as that order allows, not on every job of the host.
* **Kept.** The previous pass's claim stays while it is valid: the job's size, one pool the job
  accepts that has no head ahead of it, every GPU healthy, not loaded from outside the ledger,
  not claimed by a head ahead, and with the free memory the job asks for (a held GPU's memory
  counts as free: it will be when its job ends).
* **Moved** only to a place where strictly fewer GPUs are still held than the claim waits for, so
  a claim moves at most k times while it waits (unless jobs ahead of it take its GPUs).
* A head whose claim is on one host starts only on one host (``PassState.try_start``).
"""

from __future__ import annotations

import numpy as np

from airflow_hetero_gpu.core.admission.model import Claim, QueueEntry
from airflow_hetero_gpu.core.admission.passstate import PassState, Shape
from airflow_hetero_gpu.core.admission.placer import Placement


def claim_for(p: PassState, entry: QueueEntry, shape: Shape) -> Claim | None:
    """The claim of a job that cannot start now, or None (its pools all have a head, or nothing
    can ever hold it on the usable GPUs)."""
    open_pools = shape.ok & ~p.headed
    if not open_pools.any():
        return None
    old = _valid(p, entry, open_pools) if entry.claim else None
    if old is not None and not _should_move(p, entry, old, open_pools):
        return record_claim(p, entry, old, kept=True)
    target = None if shape.target_failed else _target(p, entry, shape, open_pools)
    if target is None:
        shape.target_failed = True
        return record_claim(p, entry, old, kept=True) if old is not None else None
    new = p.positions(target.gpus)
    if old is not None and int(p.held[new].sum()) >= int(p.held[old].sum()):
        return record_claim(p, entry, old, kept=True)
    return record_claim(p, entry, new, kept=False)


def keep_claim(p: PassState, entry: QueueEntry, shape: Shape) -> Claim | None:
    """The previous pass's claim of ``entry``, kept as it is while valid (never moved), or None: a
    preemptor whose victims still stop waits on the GPUs they free, not on a host where fewer GPUs
    are held by jobs that may never end (docs/preemption.md)."""
    open_pools = shape.ok & ~p.headed
    if not entry.claim or not open_pools.any():
        return None
    old = _valid(p, entry, open_pools)
    return record_claim(p, entry, old, kept=True) if old is not None else None


def _valid(p: PassState, entry: QueueEntry, open_pools: np.ndarray) -> np.ndarray | None:
    keys = entry.claim
    c = p.cluster
    if len(keys) != entry.request.gpus or any(k not in c.position for k in keys):
        return None
    pos = p.positions(keys)
    pools = c.pool_of[pos]
    if len(set(pos.tolist())) != len(pos) or (pools != pools[0]).any() or not open_pools[pools[0]]:
        return None
    if not p.usable[pos].all() or p.claimed[pos].any():
        return None
    need = entry.request.gpu_memory_mib
    if need:
        idle = pos[~p.held[pos]]
        with np.errstate(invalid="ignore"):
            if not (c.memory_free[idle] >= need).all():  # unknown (nan) is not enough
                return None
    return pos


def _should_move(p: PassState, entry: QueueEntry, old: np.ndarray, open_pools: np.ndarray) -> bool:
    waiting_on = int(p.held[old].sum())
    if waiting_on == 0:
        return False
    cap, held = p.per_host(open_pools)
    eligible = cap >= entry.request.gpus
    return bool(eligible.any() and held[eligible].min() < waiting_on)


def _target(p: PassState, entry: QueueEntry, shape: Shape, open_pools: np.ndarray) -> Placement | None:
    c = p.cluster
    closed = p.claimed | ~open_pools[c.pool_of]
    cap, held = p.per_host(open_pools)
    eligible = cap >= entry.request.gpus
    released_all = False
    for m in np.unique(held[eligible]).tolist():
        keep = p.held & ~(eligible & (held <= m))[c.host_of]
        released_all = not (keep & ~closed).any()
        placement = p.adm.placer(entry, closed | keep, p.holders, idle=p.held)
        if placement.placed:
            return _narrow(p, entry, placement, closed)
    if not released_all:
        placement = p.adm.placer(entry, closed, p.holders, idle=p.held)
        if placement.placed:
            return placement
        shape.no_target = placement.why_not() or shape.no_target
    return None


def _narrow(p: PassState, entry: QueueEntry, placement: Placement, closed: np.ndarray) -> Placement:
    """On a one-host target, release that host's jobs one at a time (fewest GPUs first, then job
    id) and keep the first set plan() finds."""
    c = p.cluster
    pos = p.positions(placement.gpus)
    host = int(c.host_of[pos[0]])
    if (c.host_of[pos] != host).any() or not p.held[pos].any():
        return placement
    s, e = int(c.host_start[host]), int(c.host_start[host + 1])
    on_host = np.zeros(len(c.gpus), dtype=bool)
    on_host[s:e] = True
    jobs: dict[str, list[int]] = {}
    for q in range(s, e):
        if p.held[q] and p.usable[q] and not closed[q]:
            jobs.setdefault(p.holder(c.gpus[q].key), []).append(q)
    released = np.zeros(len(c.gpus), dtype=bool)
    for _, gpus in sorted(jobs.items(), key=lambda kv: (len(kv[1]), kv[0]))[:-1]:
        released[gpus] = True
        blocked = closed | ~on_host | (p.held & ~released)
        narrowed = p.adm.placer(entry, blocked, p.holders, idle=p.held)
        if narrowed.placed:
            return narrowed
    return placement


def record_claim(p: PassState, entry: QueueEntry, pos: np.ndarray, *, kept: bool) -> Claim:
    c = p.cluster
    pos = np.sort(pos)
    keys = tuple(c.gpus[q].key for q in pos.tolist())
    pool = int(c.pool_of[int(pos[0])])
    held_by = {k: p.holder(k) for k, h in zip(keys, p.held[pos].tolist()) if h}
    claim = Claim(entry.job_id, c.pools[pool].id, keys, held_by, kept)
    p.claim(entry.job_id, pos)
    p.headed[pool] = True
    p.head_of[pool] = claim
    return claim
