"""Placement policies behind one interface (:class:`~airflow_hetero_gpu.sim.policies.base.Policy`).

``seed`` is the planner (SPEC §7); the others are the baselines it is measured against.
"""

from __future__ import annotations

from typing import Callable, Mapping

from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.sim.policies.base import BasePolicy, Policy
from airflow_hetero_gpu.sim.policies.fgd import Fgd
from airflow_hetero_gpu.sim.policies.seed import SeedPolicy
from airflow_hetero_gpu.sim.policies.simple import BestFit, FirstFit, RandomFit
from airflow_hetero_gpu.sim.policies.topology import TopologyOnly

POLICIES: dict[str, Callable[..., BasePolicy]] = {
    "seed": SeedPolicy,
    "random": RandomFit,
    "first-fit": FirstFit,
    "best-fit": BestFit,
    "topology-only": TopologyOnly,
    "fgd": Fgd,
}
POLICY_NAMES = tuple(POLICIES)


def make_policy(name: str, *, seed: int = 0, weights: Mapping[str, float] | None = None) -> BasePolicy:
    """A fresh policy by name (``random`` takes ``seed``, ``seed`` takes ``weights``)."""
    if name not in POLICIES:
        raise HeteroGpuError(f"--policies: unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")
    if name == "random":
        return RandomFit(seed)
    if name == "seed":
        return SeedPolicy(weights)
    return POLICIES[name]()


__all__ = ["POLICIES", "POLICY_NAMES", "BasePolicy", "Policy", "make_policy"]
