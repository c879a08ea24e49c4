"""``seed``: the planner itself. Every decision is one :func:`~airflow_hetero_gpu.core.planner.plan`
call with the running jobs' GPUs as ``reserved`` (load 1), exactly as the operator calls it;
``weights`` override the evaluation weights (SPEC §7 and the free-blocks term) for a sweep."""

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

