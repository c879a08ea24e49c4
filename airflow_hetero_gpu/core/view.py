"""A pool as one request sees it: the state of its GPUs at this instant (SPEC §6.3).

Built by the planner once per (pool, request); filters and scorers read it and never mutate it.
"""

from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

import numpy as np

from airflow_hetero_gpu.core.config import Thresholds
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest

if TYPE_CHECKING:
    from airflow_hetero_gpu.core.cluster import Cluster, Pool
    from airflow_hetero_gpu.core.selection import Selection


@dataclass
class ClusterState:
    """Per-request arrays over every GPU of the cluster (reservations and evictions applied)."""

    cluster: "Cluster"
    request: PlanRequest
    thresholds: Thresholds
    reserved_by: Mapping[GpuKey, str]
    evicted: Mapping[GpuKey, tuple[str, ...]]
    reserved: np.ndarray
    healthy: np.ndarray
    load: np.ndarray
    busy: np.ndarray
    memory_ok: np.ndarray
    available: np.ndarray
    outside: np.ndarray  # in use outside the scheduler (core/foreign.py), not reserved
    drained: Mapping[str, str] = field(default_factory=dict)  # drained host -> reason (core/drain.py)
    on_drained: np.ndarray | None = None  # the GPUs of the drained hosts
    _holders: dict | None = field(default=None, repr=False)

    def holders(self) -> dict:
        """``reserved_by`` as one plain dict (a caller may pass a ChainMap of layers, whose
        lookups cost ~5 µs each: a reason over thousands of held GPUs reads it per GPU)."""
        if self._holders is None:
            rb = self.reserved_by
            if type(rb) is dict:
                self._holders = rb
            elif isinstance(rb, ChainMap):
                self._holders = {}
                for layer in reversed(rb.maps):  # the first layer wins, as in the ChainMap
                    self._holders.update(layer)
            else:
                self._holders = dict(rb)
        return self._holders


@dataclass
class PoolView:
    """One pool of ``state``. ``_cache`` holds the pool's slices of the state's arrays and what
    :meth:`memo` keeps: values that depend on the pool's GPUs' state alone, so one cache may serve
    the views of that pool for every request with the same memory ask and reserved mask."""

    pool: "Pool"
    state: ClusterState
    selection: "Selection | None" = None
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def request(self) -> PlanRequest:
        return self.state.request

    @property
    def thresholds(self) -> Thresholds:
        return self.state.thresholds

    @property
    def positions(self) -> np.ndarray:
        return self.pool.positions

    def _mask(self, name: str) -> np.ndarray:
        m = self._cache.get(name)
        if m is None:
            m = getattr(self.state, name)[self.pool.positions]
            self._cache[name] = m
        return m

    @property
    def gpu_count(self) -> int:
        return len(self.pool.positions)

    def memo(self, name: str, make):
        """``make()``, kept in the view's cache under ``name``: only for what the pool's GPUs'
        state alone decides (never the request, beyond its memory ask), since a caller may share
        one cache among the views of a pool under one state (``core/plankept.py`` does)."""
        try:
            return self._cache[name]
        except KeyError:
            value = self._cache[name] = make()
            return value

    def _count(self, name: str) -> int:
        n = self._cache.get("#" + name)
        if n is None:
            n = self._cache["#" + name] = int(self._mask(name).sum())
        return n

    @property
    def healthy_count(self) -> int:
        return self._count("healthy")

    @property
    def available_count(self) -> int:
        return self._count("available")

    @property
    def healthy_loads(self) -> np.ndarray:
        """The loads of the pool's healthy GPUs (read by two scorers: gathered once)."""
        loads = self._cache.get("healthy_loads")
        if loads is None:
            loads = self._cache["healthy_loads"] = self.state.load[self.pool.positions[self._mask("healthy")]]
        return loads

    def positions_where(self, name: str, value: bool = True) -> np.ndarray:
        m = self._mask(name)
        return self.pool.positions[m if value else ~m]
