"""The policy interface: ``Policy.place(view, job) -> list[GpuKey] | None``.

A policy is asked only when the job fits (some allowed card type has ``job.gpus`` free GPUs);
it answers the GPUs to give the job (exactly ``job.gpus`` free GPUs of one allowed card type:
gang, all or nothing) or ``None`` to leave it queued. It must not change the view.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.sim.state import ClusterView
from airflow_hetero_gpu.sim.trace import Job


@runtime_checkable
class Policy(Protocol):
    """A placement policy."""

    name: str

    def place(self, view: ClusterView, job: Job) -> list[GpuKey] | None:  # pragma: no cover - protocol
        ...


class BasePolicy:
    """Shared helpers; ``prepare`` is called once before a run with the whole job list."""

    name = "base"

    def prepare(self, view: ClusterView, jobs: Sequence[Job]) -> None:
        """Learn what the policy needs from the workload (most policies need nothing)."""

    # --- helpers ---------------------------------------------------------------------------
    @staticmethod
    def single_host_candidates(view: ClusterView, job: Job) -> np.ndarray:
        """Host ids (ascending, i.e. by name) of allowed hosts with at least ``job.gpus`` free."""
        return np.flatnonzero((view.host_free >= job.gpus) & view.allowed_hosts(job.gpu_types))

    @staticmethod
    def feasible_models(view: ClusterView, job: Job) -> np.ndarray:
        """Card-type ids (by name) allowed for the job with at least ``job.gpus`` free GPUs."""
        return np.flatnonzero((view.model_free >= job.gpus) & view.allowed_models(job.gpu_types))

    @staticmethod
    def keys(view: ClusterView, positions) -> list[GpuKey]:
        return [view.key(p) for p in positions]

    @staticmethod
    def take_in_order(view: ClusterView, hosts, k: int, pick=None) -> list[int]:
        """Walk ``hosts`` in order taking free GPUs (``pick(free_positions, n)`` chooses which,
        default the lowest indices) until ``k`` are taken."""
        out: list[int] = []
        for h in hosts:
            if len(out) == k:
                break
            free = view.free_positions(int(h))
            if len(free) == 0:
                continue
            n = min(k - len(out), len(free))
            out.extend(int(p) for p in (pick(free, n) if pick else free[:n]))
        return out
