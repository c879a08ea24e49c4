"""What a kept planner carries from one question to the next (core/plankept.py): the arrays of a
reserved mask patched where the next mask differs (``_Parts.now``) and each pool's view cache
shared by the requests asked under one mask (``_Parts.view``) equal what cluster_state() and a
fresh PoolView compute from scratch, after every kind of change a pass makes; the arrays handed
out earlier keep saying what they said.

The cluster is ``benchmarks/plan_latency.py``'s synthetic one, small, with processes from outside
the scheduler on some GPUs (so "outside" and the foreign-process rule have something to do).
"""

from __future__ import annotations

import copy
import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest

from airflow_hetero_gpu.core.candidates import host_candidates
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.core.plankept import KeptPlans
from airflow_hetero_gpu.core.planner import cluster_state
from airflow_hetero_gpu.core.scorers import fragmentation, load_balance
from airflow_hetero_gpu.core.view import PoolView

_SPEC = importlib.util.spec_from_file_location(
    "plan_latency", Path(__file__).resolve().parent.parent / "benchmarks" / "plan_latency.py")
plan_latency = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(plan_latency)

ARRAYS = ("reserved", "healthy", "load", "busy", "memory_ok", "available", "outside", "on_drained")


@pytest.fixture(scope="module")
def cluster():
    c = copy.copy(plan_latency.synthetic_cluster(1600, seed=3))
    rng = np.random.default_rng(4)
    c.has_processes = c.has_processes | (rng.random(len(c.gpus)) < 0.05)
    return c


def _changes(c, rng: random.Random, mask: np.ndarray) -> None:
    """One change as passes make them: an admission on one host, a job's end, a claim across a
    pool, many at once (more than the patching takes), or none."""
    kind = rng.choice(("admit", "admit", "end", "claim", "many", "none"))
    if kind == "admit":
        h = rng.randrange(len(c.hosts))
        s, e = int(c.host_start[h]), int(c.host_start[h + 1])
        mask[s:s + rng.randint(1, max(1, e - s))] = True
    elif kind == "end":
        held = np.flatnonzero(mask).tolist()
        mask[rng.sample(held, min(6, len(held)))] = False
    elif kind == "claim":
        pool = c.pools[rng.randrange(len(c.pools))]
        mask[pool.positions[: rng.randint(1, 40)]] = True
    elif kind == "many":
        flip = np.array([rng.random() < 0.3 for _ in range(len(mask))])
        mask ^= flip


def _check(c, config, parts, now, mask, mib) -> None:
    req = PlanRequest(1, gpu_memory_mib=mib)
    want = cluster_state(c, req, {}, config=config, reserved_mask=mask)
    got = parts.state(req, {}, now)
    for name in ARRAYS:
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    for i, pool in enumerate(c.pools):
        view, fresh = parts.view(i, got, now), PoolView(pool, want)
        assert (view.healthy_count, view.available_count) == (fresh.healthy_count, fresh.available_count)
        assert parts.counts(i, now, mib) == (fresh.healthy_count, fresh.available_count)
        for name in ("healthy", "available"):
            assert np.array_equal(view._mask(name), fresh._mask(name)), name
        assert np.array_equal(view.healthy_loads, fresh.healthy_loads)
        assert (load_balance(view), fragmentation(view)) == (load_balance(fresh), fragmentation(fresh))
        for k in (1, 8, 16):  # the host groups kept in the shared cache serve every k
            assert host_candidates(view, k) == host_candidates(PoolView(pool, want), k), k


@pytest.mark.parametrize("foreign", ["block", "ignore"])
def test_patched_arrays_and_shared_views_are_from_scratch(cluster, foreign):
    c = cluster
    config = c.config.model_copy(update={"thresholds": c.config.thresholds.model_copy(
        update={"foreign_processes": foreign})})
    rng = random.Random(7 if foreign == "block" else 8)
    parts = KeptPlans(c, config=config).parts(c)
    mask = np.array([rng.random() < 0.8 for _ in c.gpus], dtype=bool)
    earlier = []
    for step in range(16):
        now = parts.now(mask)
        for mib in (None, 30000):
            _check(c, config, parts, now, mask, mib)
        if step % 5 == 0:
            earlier.append((now, mask.copy()))
        _changes(c, rng, mask)
    for now, then in earlier:  # what an earlier question was handed still says what it said
        assert np.array_equal(now.mask, then)
        _check(c, config, parts, now, then, None)


def test_what_is_handed_out_cannot_be_written(cluster):
    """The arrays are shared with later questions and with reasons written later: read-only."""
    parts = KeptPlans(cluster).parts(cluster)
    mask = np.zeros(len(cluster.gpus), dtype=bool)
    now = parts.now(mask)
    state = parts.state(PlanRequest(2, gpu_memory_mib=1000), {}, now)
    view = parts.view(0, state, now)
    for a in (state.reserved, state.load, state.busy, state.available, state.outside, state.memory_ok,
              view._mask("available"), view.healthy_loads):
        with pytest.raises(ValueError):
            a[0] = a[0]
