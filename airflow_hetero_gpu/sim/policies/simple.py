"""The plain baselines: ``first-fit``, ``best-fit`` and ``random``.

All three keep a gang job on one card type and on one host when one allowed host has enough
free GPUs; otherwise they span hosts of one card type that has enough free GPUs.

* ``first-fit``: the first host by name with room, its lowest free indices; spanning: the first
  card type by name with room, its hosts by name.
* ``best-fit``: the host with the fewest free GPUs that still holds the job (pack the fullest
  host first; ties by name), its lowest free indices; spanning: the card type with the fewest
  free GPUs that holds the job, its hosts fullest first.
* ``random``: a uniformly drawn host with room and a uniformly drawn set of its free GPUs;
  spanning: a drawn card type with room, its hosts in a drawn order, drawn GPUs on each.
  Seeded: the same seed gives the same run.
"""

from __future__ import annotations

import numpy as np

from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.sim.policies.base import BasePolicy
from airflow_hetero_gpu.sim.state import ClusterView
from airflow_hetero_gpu.sim.trace import Job


class FirstFit(BasePolicy):
    name = "first-fit"

    def place(self, view: ClusterView, job: Job) -> list[GpuKey] | None:
        k = job.gpus
        hosts = self.single_host_candidates(view, job)
        if len(hosts):
            return self.keys(view, view.free_positions(int(hosts[0]))[:k])
        models = self.feasible_models(view, job)
        if not len(models):
            return None
        hosts = np.flatnonzero((view.host_model_id == models[0]) & (view.host_free > 0))
        return self.keys(view, self.take_in_order(view, hosts, k))


class BestFit(BasePolicy):
    name = "best-fit"

    def place(self, view: ClusterView, job: Job) -> list[GpuKey] | None:
        k = job.gpus
        hosts = self.single_host_candidates(view, job)
        if len(hosts):
            h = int(hosts[np.argmin(view.host_free[hosts])])  # first minimum: smallest name
            return self.keys(view, view.free_positions(h)[:k])
        models = self.feasible_models(view, job)
        if not len(models):
            return None
        m = int(models[np.argmin(view.model_free[models])])
        hosts = np.flatnonzero((view.host_model_id == m) & (view.host_free > 0))
        hosts = hosts[np.argsort(view.host_free[hosts], kind="stable")]
        return self.keys(view, self.take_in_order(view, hosts, k))


class RandomFit(BasePolicy):
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def prepare(self, view: ClusterView, jobs) -> None:
        self.rng = np.random.default_rng(self.seed)

    def _pick(self, free: np.ndarray, n: int) -> np.ndarray:
        return np.sort(self.rng.choice(free, size=n, replace=False))

    def place(self, view: ClusterView, job: Job) -> list[GpuKey] | None:
        k = job.gpus
        hosts = self.single_host_candidates(view, job)
        if len(hosts):
            h = int(self.rng.choice(hosts))
            return self.keys(view, self._pick(view.free_positions(h), k))
        models = self.feasible_models(view, job)
        if not len(models):
            return None
        m = int(self.rng.choice(models))
        hosts = self.rng.permutation(np.flatnonzero((view.host_model_id == m) & (view.host_free > 0)))
        return self.keys(view, self.take_in_order(view, hosts, k, pick=self._pick))
