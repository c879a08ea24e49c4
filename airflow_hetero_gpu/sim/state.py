"""What a policy sees: the cluster and which of its GPUs running jobs hold right now.

A :class:`ClusterView` is the simulator's live allocation state over a planner
:class:`~airflow_hetero_gpu.core.cluster.Cluster`: a per-GPU ``free`` mask, per-host free
counts, per-card-type free counts, and the ``reserved`` mapping ``{GpuKey: job id}`` that
:func:`~airflow_hetero_gpu.core.planner.plan` takes (a reserved GPU has load 1, SPEC §4, which is
exactly how a live cluster with running jobs looks to the planner). Policies read it; only the
simulator changes it (:meth:`allocate`, :meth:`release`).
"""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import Sequence

import numpy as np

from airflow_hetero_gpu.core.cardtype import card_type_matches
from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.model import GpuKey


class ClusterView:
    """Live allocation state; GPU positions and host ids are those of ``cluster``."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        n = len(cluster.gpus)
        self.free = np.ones(n, dtype=bool)
        self.reserved: dict[GpuKey, str] = {}
        self.holding: dict[str, np.ndarray] = {}  # job id -> GPU positions
        self.host_of = cluster.host_of
        self.n_hosts = len(cluster.hosts)
        self.host_capacity = np.bincount(self.host_of, minlength=self.n_hosts).astype(np.int64)
        self.host_free = self.host_capacity.copy()
        # GPUs of a host in index order: host h owns positions host_start[h] .. host_start[h+1]-1
        self.host_start = np.searchsorted(self.host_of, np.arange(self.n_hosts + 1))
        self.host_model = [cluster.gpus[int(s)].name if c else "" for s, c in
                           zip(self.host_start[:-1], self.host_capacity)]
        self.models = sorted({g.name for g in cluster.gpus})
        self.model_id = {m: i for i, m in enumerate(self.models)}
        self.host_model_id = np.array([self.model_id.get(m, -1) for m in self.host_model], dtype=np.int64)
        self.model_capacity = np.bincount(self.host_model_id, weights=self.host_capacity,
                                          minlength=len(self.models)).astype(np.int64)
        self.model_free = self.model_capacity.copy()

    # --- queries --------------------------------------------------------------------------
    @property
    def total_gpus(self) -> int:
        return len(self.free)

    @property
    def allocated(self) -> int:
        return self.total_gpus - int(self.model_free.sum())

    def allowed_models(self, gpu_types: Sequence[str]) -> np.ndarray:
        """Boolean mask over :attr:`models`: the card types a job asking for ``gpu_types`` may use."""
        return _allowed(tuple(self.models), tuple(gpu_types))

    def allowed_hosts(self, gpu_types: Sequence[str]) -> np.ndarray:
        return self.allowed_models(gpu_types)[self.host_model_id]

    def fits(self, gpus: int, gpu_types: Sequence[str] = ()) -> bool:
        """Whether some allowed card type has ``gpus`` free GPUs now (a gang job stays on one
        card type, as the planner's pools do)."""
        return bool((self.model_free[self.allowed_models(gpu_types)] >= gpus).any())

    def one_host_fits(self, gpus: int, gpu_types: Sequence[str] = ()) -> bool:
        """Whether one allowed host has ``gpus`` free GPUs now."""
        return bool(((self.host_free >= gpus) & self.allowed_hosts(gpu_types)).any())

    def capacity_for(self, gpu_types: Sequence[str] = ()) -> int:
        """The most GPUs one job of these card types could ever get (the largest allowed type)."""
        mask = self.allowed_models(gpu_types)
        return int(self.model_capacity[mask].max()) if mask.any() else 0

    def free_positions(self, host: int) -> np.ndarray:
        s, e = self.host_start[host], self.host_start[host + 1]
        return s + np.flatnonzero(self.free[s:e])

    def key(self, position: int) -> GpuKey:
        return self.cluster.gpus[int(position)].key

    def positions(self, keys: Sequence[tuple[str, int]]) -> np.ndarray:
        return np.fromiter((self.cluster.position[GpuKey(*k)] for k in keys), dtype=np.int64, count=len(keys))

    def masked(self, free: np.ndarray) -> "ClusterView":
        """A read-only copy that shows only ``free`` as free (the admission queue's view of a
        job: claimed GPUs hidden, or held GPUs shown free when it plans a head's target)."""
        v = copy.copy(self)
        v.free = free
        v.host_free = np.bincount(self.host_of[free], minlength=self.n_hosts).astype(np.int64)
        v.model_free = np.bincount(self.host_model_id, weights=v.host_free,
                                   minlength=len(self.models)).astype(np.int64)
        return v

    # --- changes (the simulator's) ---------------------------------------------------------
    def allocate(self, job_id: str, keys: Sequence[tuple[str, int]]) -> np.ndarray:
        pos = self.positions(keys)
        if len(set(pos.tolist())) != len(pos):
            raise ValueError(f"job {job_id}: the same GPU twice in {list(keys)}")
        if not self.free[pos].all():
            taken = [str(self.key(p)) for p in pos if not self.free[p]]
            raise ValueError(f"job {job_id}: GPUs already held: {', '.join(taken)}")
        self.free[pos] = False
        hosts = self.host_of[pos]
        np.subtract.at(self.host_free, hosts, 1)
        np.subtract.at(self.model_free, self.host_model_id[hosts], 1)
        for p in pos:
            self.reserved[self.key(p)] = job_id
        self.holding[job_id] = pos
        return pos

    def release(self, job_id: str) -> None:
        pos = self.holding.pop(job_id)
        self.free[pos] = True
        hosts = self.host_of[pos]
        np.add.at(self.host_free, hosts, 1)
        np.add.at(self.model_free, self.host_model_id[hosts], 1)
        for p in pos:
            del self.reserved[self.key(p)]


@lru_cache(maxsize=1024)
def _allowed(models: tuple[str, ...], gpu_types: tuple[str, ...]) -> np.ndarray:
    if not gpu_types:
        mask = np.ones(len(models), dtype=bool)
    else:
        mask = np.array([any(card_type_matches(m, t) for t in gpu_types) for m in models], dtype=bool)
    mask.setflags(write=False)
    return mask
