"""The bookkeeping of one admission pass: which GPUs are held, claimed and still free, per GPU,
per pool and per host, kept up to date as jobs are admitted and heads claim GPUs.

Everything only grows within a pass (held and claimed GPUs), so a request that could not start,
or could not become a head, cannot later in the same pass: :class:`Shape` remembers that once
per distinct request.
"""

from __future__ import annotations

import dataclasses
from collections import ChainMap
from typing import Any, Mapping

import numpy as np

from airflow_hetero_gpu.core.admission.kept import start_arrays, start_from_mask
from airflow_hetero_gpu.core.admission.model import Claim, QueueEntry
from airflow_hetero_gpu.core.admission.placer import Placement
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest


class Shape:
    """What one pass learnt about one distinct request (every entry asking the same shares it)."""

    __slots__ = ("request", "ok", "rejected", "start_failed", "target_failed", "dead", "why_not", "no_target",
                 "possible")

    def __init__(self, request: PlanRequest, ok: np.ndarray, rejected: Mapping[str, str]) -> None:
        self.request = request
        self.ok = ok  # pools passing the primary filters
        self.rejected = rejected  # pool id -> why not, for the others
        self.start_failed = False
        self.target_failed = False
        self.dead = False  # can neither start nor become a head for the rest of the pass
        self.why_not: str | None = None  # why it cannot start now
        self.no_target: str | None = None  # why nothing can hold it even when running jobs end
        self.possible = bool(ok.any())  # some pool passes its primary filters


class PassState:
    """Held, claimed and free GPUs during one pass.

    ``adm`` is the :class:`~airflow_hetero_gpu.core.admission.rule.Admission` running the pass
    (its ``cluster``, ``healthy``, ``loaded``, ``host_pool`` and ``placer``).
    """

    def __init__(self, adm: Any, reserved: Mapping[GpuKey, str] | None, reserved_mask: np.ndarray | None):
        c = adm.cluster
        self.adm, self.cluster = adm, c
        n = len(c.gpus)
        self.serial: int | None = None  # the kept start's serial (KeptHeld), None: computed for this pass
        if reserved_mask is None:
            kept = getattr(adm, "kept_held", None)
            if kept is not None and reserved:
                start, self.serial = kept.start(adm, reserved)
            else:
                keys = list(reserved or {})
                start = start_arrays(adm, c.positions_of(keys), list((reserved or {}).values()))
        else:
            held = np.array(reserved_mask, dtype=bool)
            if held.shape != (n,):
                raise ValueError(f"reserved_mask: expected {n} entries, got {held.shape}")
            start = start_from_mask(adm, held, None, None)
        self._start = start
        self.held = start.held.copy()  # live reservations and jobs admitted in this pass
        # usable: could serve a queued job now or once its holder ends (a held GPU's load is its job's)
        self.usable = start.usable
        self.claimed = np.zeros(n, dtype=bool)
        self.blocked = start.held.copy()  # held or claimed: no job may start there
        self.free = start.free.copy()
        # per host: usable GPUs not claimed, and how many of those are held
        self.host_cap = start.host_cap.copy()
        self.host_held = start.host_held.copy()
        self.headed = np.zeros(len(c.pools), dtype=bool)
        self.head_of: dict[int, Claim] = {}
        self._heads: dict[tuple[bytes, int], list[Claim]] = {}  # see heads_for
        self.extra: dict[GpuKey, str] = {}
        self.holders = ChainMap(self.extra, reserved if reserved is not None else {})

    def reserved_positions(self) -> tuple[np.ndarray, list]:
        """Each live reservation's GPU position (-1: a GPU the cluster no longer lists) and job id,
        in one order (the order of ``reserved``, or of an equal mapping an earlier pass was given)."""
        start = self._start
        if start.pos is None:
            reserved = self.holders.maps[1]
            self._start = start = dataclasses.replace(start, pos=self.cluster.positions_of(list(reserved)),
                                                      jobs=list(reserved.values()))
        return start.pos, start.jobs

    def positions(self, keys) -> np.ndarray:
        return np.fromiter((self.cluster.position[GpuKey(*k)] for k in keys), dtype=np.int64, count=len(keys))

    def holder(self, key: GpuKey) -> str:
        return self.extra.get(key) or self.holders.maps[1].get(key, "?")

    def admit(self, job_id: str, keys) -> np.ndarray:
        """Mark ``keys`` held by ``job_id``, admitted now."""
        pos = self.positions(keys)
        if len(set(pos.tolist())) != len(pos) or self.blocked[pos].any():
            raise RuntimeError(f"job {job_id}: the placer answered GPUs that are taken or repeated: "
                               f"{', '.join(map(str, keys))}")
        counted = pos[self.usable[pos]]
        np.subtract.at(self.free, self.cluster.pool_of[counted], 1)
        np.add.at(self.host_held, self.cluster.host_of[counted], 1)
        self.blocked[pos] = True
        self.held[pos] = True
        for k in keys:
            self.extra[GpuKey(*k)] = job_id
        return pos

    def claim(self, job_id: str, pos: np.ndarray) -> None:
        """Mark the GPUs at ``pos`` claimed for the head ``job_id``."""
        c = self.cluster
        usable = pos[self.usable[pos]]
        np.subtract.at(self.free, c.pool_of[usable[~self.blocked[usable]]], 1)
        np.subtract.at(self.host_cap, c.host_of[usable], 1)
        np.subtract.at(self.host_held, c.host_of[usable[self.held[usable]]], 1)
        self.blocked[pos] = True
        self.claimed[pos] = True
        for p in pos[~self.held[pos]].tolist():
            self.extra[c.gpus[p].key] = f"{job_id} (claim)"

    def heads_for(self, pools: np.ndarray) -> list[Claim]:
        """The heads so far of the pools in the mask ``pools`` (the ones a waiting job is behind).
        One list per mask while no head is added (the jobs waiting behind the same heads share
        it; nobody changes it)."""
        key = (pools.tobytes(), len(self.head_of))  # a pool gets its head once in a pass
        hit = self._heads.get(key)
        if hit is None:
            hit = self._heads[key] = [self.head_of[i] for i in np.flatnonzero(pools & self.headed).tolist()]
        return hit

    def per_host(self, open_pools: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per host: usable, unclaimed GPUs a claim in ``open_pools`` could take (0 for hosts of
        other pools, and for the rare host whose GPUs are in several pools), and how many of them
        are held now."""
        hp = self.adm.host_pool
        inside = (hp >= 0) & open_pools[np.maximum(hp, 0)]
        return np.where(inside, self.host_cap, 0), np.where(inside, self.host_held, 0)

    # --- starting now -----------------------------------------------------------------------------
    def try_start(self, entry: QueueEntry, shape: Shape, outside: np.ndarray | None = None) -> Placement | None:
        """Start ``entry`` now on GPUs neither held nor claimed (nor in ``outside``, a mask of
        GPUs it may not use: pools its team's quota rules out), or None."""
        req = entry.request
        if shape.start_failed:
            return None
        most = int(self.free[shape.ok].max())
        if most < req.gpus:
            shape.start_failed = True
            gpus = f"{req.gpus} free GPU{'s' if req.gpus > 1 else ''}"
            shape.why_not = f"needs {gpus} in one pool, has at most {most} outside reservations and claims"
            return None
        placement = self.adm.placer(entry, self.blocked if outside is None else self.blocked | outside,
                                    self.holders)
        if placement.placed:
            if len({k[0] for k in placement.gpus}) > 1 and len({k.host for k in entry.claim}) == 1:
                # a head whose claim is on one host waits for one host (its claim, or any other
                # with room) rather than spanning hosts; jobs without that claim may still span
                return None
            return placement
        shape.start_failed = True
        shape.why_not = placement.why_not() or shape.why_not
        return None
