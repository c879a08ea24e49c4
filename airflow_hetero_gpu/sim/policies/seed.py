"""``seed``: the planner itself. Every decision is one :func:`~airflow_hetero_gpu.core.planner.plan`
call with the running jobs' GPUs as ``reserved`` (load 1), exactly as the operator calls it;
``weights`` override the evaluation weights (SPEC §7) for a sweep."""

from __future__ import annotations

from typing import Mapping

from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.core.planner import plan
from airflow_hetero_gpu.sim.policies.base import BasePolicy
from airflow_hetero_gpu.sim.state import ClusterView
from airflow_hetero_gpu.sim.trace import Job


class SeedPolicy(BasePolicy):
    name = "seed"

    def __init__(self, weights: Mapping[str, float] | None = None, label: str | None = None) -> None:
        self.weights = dict(weights) if weights else None
        if label:
            self.name = label

    def place(self, view: ClusterView, job: Job) -> list[GpuKey] | None:
        gpu_type = None
        if job.gpu_types:
            gpu_type = job.gpu_types[0] if len(job.gpu_types) == 1 else tuple(job.gpu_types)
        result = plan(view.cluster, PlanRequest(job.gpus, gpu_type), reserved=view.reserved,
                      reserved_mask=~view.free, weights=self.weights)
        return None if result.decision is None else list(result.decision.keys)


class SeedWithFragmentation(SeedPolicy):
    """``seed+fgd`` (experimental, not a SPEC policy): the seed's evaluation plus one more term,
    ``E' = E + w_f * (-growth / k)``, where growth is the FGD fragmentation growth (see
    :mod:`~airflow_hetero_gpu.sim.policies.fgd`) of the k GPUs the pool would give the job.

    Each pool's E and selection come from one :func:`plan` call, unchanged; only the argmax over
    the preselected pools adds the term. It shows what a fragmentation scorer in the planner's
    registry would do, without changing the planner.
    """

    name = "seed+fgd"

    def __init__(self, weights: Mapping[str, float] | None = None, fgd_weight: float = 0.5) -> None:
        super().__init__(weights)
        self.fgd_weight = fgd_weight
        self._fgd = None

    def prepare(self, view: ClusterView, jobs) -> None:
        from airflow_hetero_gpu.sim.policies.fgd import Fgd

        self._fgd = Fgd()
        self._fgd.prepare(view, jobs)

    def _term(self, view: ClusterView, keys, k: int) -> float:
        import numpy as np

        hosts: dict[int, int] = {}
        for key in keys:
            h = int(view.host_of[view.cluster.position[key]])
            hosts[h] = hosts.get(h, 0) + 1
        ids = np.fromiter(hosts, dtype=np.int64)
        take = np.fromiter(hosts.values(), dtype=np.int64)
        return -float(self._fgd.growth(view, ids, take).sum()) / k

    def place(self, view: ClusterView, job: Job) -> list[GpuKey] | None:
        if self._fgd is None:
            self.prepare(view, [job])
        gpu_type = None
        if job.gpu_types:
            gpu_type = job.gpu_types[0] if len(job.gpu_types) == 1 else tuple(job.gpu_types)
        result = plan(view.cluster, PlanRequest(job.gpus, gpu_type), reserved=view.reserved,
                      reserved_mask=~view.free, weights=self.weights)
        best = None
        for rep in result.pools:
            if rep.stage not in ("preselected", "scheduling"):
                continue
            total = rep.score.total + self.fgd_weight * self._term(view, rep.selection, job.gpus)
            rank = (-round(total, 9), rep.hosts_spanned, rep.pool)
            if best is None or rank < best[0]:
                best = (rank, rep.selection)
        return None if best is None else list(best[1])
