"""plan(..., reserved_mask=...) answers exactly what plan(..., reserved=...) answers."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.core.planner import plan
from airflow_hetero_gpu.sim.fleet import Node, build_fleet

NODES = [Node("a", 8, "V100M32"), Node("b", 8, "G2"), Node("c", 2, "T4"), Node("d", 4, "T4"), Node("e", 8, "G2")]


@pytest.mark.parametrize("k", [1, 2, 4, 8, 12])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mask_fast_path_gives_the_same_decision(k, seed):
    cluster = build_fleet(NODES, hosts_per_leaf=2, leaves_per_spine=2).cluster
    rng = np.random.default_rng(seed)
    mask = rng.random(len(cluster.gpus)) < 0.4
    reserved = {cluster.gpus[int(p)].key: f"job{p}" for p in np.flatnonzero(mask)}
    slow = plan(cluster, PlanRequest(k), reserved=reserved)
    fast = plan(cluster, PlanRequest(k), reserved=reserved, reserved_mask=mask)
    assert slow.to_json() == fast.to_json()


def test_mask_of_the_wrong_length_is_refused():
    cluster = build_fleet(NODES).cluster
    with pytest.raises(ValueError, match="reserved_mask"):
        plan(cluster, PlanRequest(1), reserved={GpuKey("a", 0): "j"}, reserved_mask=np.zeros(3, dtype=bool))
