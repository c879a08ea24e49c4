"""Each policy's choice on one hand-set cluster state, expected GPUs written out.

Hosts (one leaf):
  a: 8 x G2, all pairs NV12 (1)     -- a0-a4 held, a5 a6 a7 free
  b: 8 x V100M32, DGX-1 cube mesh   -- all 8 free
  c: 2 x T4, PHB (4)                -- both free
  d: 4 x T4, NODE pairs, SYS across -- all 4 free

FGD learns the workload {1 GPU: 1/2, 4 GPUs: 1/2}. Its fragmentation of a host with f free GPUs
out of c: F(f) = 1/2 f [f < 1] + 1/2 f [f < min(4, c)] = 1/2 f [f < min(4, c)].
  k=1: a 3 -> 2: F 1.5 -> 1.0 (-0.5); b 8 -> 7: 0 -> 0 (0); c 2 -> 1: 0 -> 0.5 (+0.5);
       d 4 -> 3: 0 -> 1.5 (+1.5)                                    => a
  k=2: a 3 -> 1: 1.5 -> 0.5 (-1.0); b 0 -> 0; c 0 -> 0; d 0 -> 1.0 (+1.0)  => a

The seed (default weights 0.1, -0.2, 0.5, 0.2; reserved GPUs have load 1, so FR = 0 everywhere):
  pool G2:      LB = 1 - (1 - 5/8) = 0.625, TS 1 (NV12)         E = 0.0625 + 0.5 + 0.2 FB
  pool T4:      LB = 1 (nothing held)                            E = 0.1 + 0.5 TS + 0.2 FB
  pool V100M32: LB = 1                                           E = 0.1 + 0.5 TS + 0.2 FB
  FB (free blocks, the largest host has 8): block sizes above k, a b-block worth b / d_min(b) of
  its host: a NV12 and b's NVLink blocks of 2 and 4 are worth 2 and 4, b's 8 GPUs d 40/28 -> 5.6;
  c's PHB pair 2/4 = 0.5.
  k=1 (sizes 2, 4, 8; sum 14): in T4 both hosts have d 1 -> fewer available: c -> c0, 2 -> 1
       breaks c's pair: FB = 1 - 0.5/14, E = 0.792857; G2 a5, 3 -> 2 free breaks nothing: FB 1,
       E = 0.7625; V100M32 b0 breaks b's 2-, 4- and 8-block: FB = 1 - 11.6/14, E = 0.634286 -> c0
  k=2 (sizes 4, 8; sum 12): G2 a5-a6 (TS 1), 3 -> 1 free, no block: E = 0.7625; V100M32 b0-b1
       (TS 1) breaks a 4- and the 8-block: FB = 1 - 9.6/12 = 0.2, E = 0.64; T4 c0-c1 (PHB, TS
       1/4), no block of 4 on c: E = 0.425 -> a5 a6 (the idle DGX-1 stays whole; with SPEC §3's
       weights and no FB term the seed took b0 b1)
  k=8: only V100M32 has 8 available -> b0-b7
"""

from __future__ import annotations

import pytest

from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.sim.fleet import Node, build_fleet
from airflow_hetero_gpu.sim.policies import POLICY_NAMES, make_policy
from airflow_hetero_gpu.sim.state import ClusterView
from airflow_hetero_gpu.sim.trace import Job

NODES = [Node("a", 8, "G2"), Node("b", 8, "V100M32"), Node("c", 2, "T4"), Node("d", 4, "T4")]
WORKLOAD = [Job("w1", 0, 1, 1), Job("w4", 0, 1, 4)]


@pytest.fixture(scope="module")
def cluster():
    return build_fleet(NODES).cluster


@pytest.fixture
def view(cluster):
    v = ClusterView(cluster)
    v.allocate("running", [("a", i) for i in range(5)])
    return v


def _place(view, policy, gpus, types=()):
    p = make_policy(policy)
    p.prepare(view, WORKLOAD)
    keys = p.place(view, Job("new", 0, 1, gpus, tuple(types)))
    return None if keys is None else [f"{k.host}{k.index}" for k in sorted(GpuKey(*k) for k in keys)]


B_ALL = [f"b{i}" for i in range(8)]

# (policy, GPUs asked, card types, expected GPUs)
CASES = [
    ("first-fit", 1, (), ["a5"]),
    ("first-fit", 2, (), ["a5", "a6"]),
    ("first-fit", 8, (), B_ALL),
    ("first-fit", 6, ("T4",), ["c0", "c1", "d0", "d1", "d2", "d3"]),  # spans: T4 hosts by name
    ("best-fit", 1, (), ["c0"]),  # the fullest host with room: c (2 free)
    ("best-fit", 2, (), ["c0", "c1"]),
    ("best-fit", 3, (), ["a5", "a6", "a7"]),
    ("best-fit", 8, (), B_ALL),
    ("topology-only", 1, (), ["a5"]),  # every single GPU is d 1: the first host
    ("topology-only", 2, (), ["a5", "a6"]),  # NV12 pair, d 1, a before b
    ("topology-only", 2, ("T4",), ["c0", "c1"]),  # PHB (4) beats d's NODE pair (5)
    ("topology-only", 3, ("V100M32",), ["b0", "b1", "b2"]),  # 0-1 NV1, 0-2 NV1, 1-2 NV2: d 1, lowest
    ("topology-only", 8, (), B_ALL),
    ("fgd", 1, (), ["a5"]),
    ("fgd", 2, (), ["a5", "a6"]),
    ("fgd", 8, (), B_ALL),
    ("fgd", 6, ("T4",), ["c0", "c1", "d0", "d1", "d2", "d3"]),
    ("seed", 1, (), ["c0"]),
    ("seed", 2, (), ["a5", "a6"]),
    ("seed", 8, (), B_ALL),
    ("seed", 2, ("G2",), ["a5", "a6"]),
    ("seed", 6, ("T4",), ["c0", "c1", "d0", "d1", "d2", "d3"]),
    ("seed", 2, (), ["a5", "a6"]),]


@pytest.mark.parametrize("policy,gpus,types,expected", CASES,
                         ids=[f"{p}-{k}-{'|'.join(t) or 'any'}" for p, k, t, _ in CASES])
def test_policy_choice(view, policy, gpus, types, expected):
    assert _place(view, policy, gpus, types) == expected


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_nothing_fits_gives_none(view, policy):
    assert _place(view, policy, 9, ("V100M32",)) is None  # b has 8


@pytest.mark.parametrize("gpus", [1, 2, 3, 8])
def test_random_places_on_free_gpus_of_one_host_and_repeats_with_its_seed(view, gpus):
    a, b = make_policy("random", seed=5), make_policy("random", seed=5)
    job = Job("new", 0, 1, gpus)
    first, second = a.place(view, job), b.place(view, job)
    assert first == second
    assert len({k.host for k in first}) == 1 and len(set(first)) == gpus
    assert all(view.free[view.cluster.position[k]] for k in first)


def test_a_policy_does_not_change_the_view(view):
    before = (view.free.copy(), dict(view.reserved), view.host_free.copy())
    for name in POLICY_NAMES:
        _place(view, name, 2)
    assert (view.free == before[0]).all() and view.reserved == before[1] and (view.host_free == before[2]).all()


def test_seed_weights_change_its_choice(view):
    """With w1 = 1 and w3 = w4 = 0 only load balance counts: G2 has LB 0.625, T4 and V100M32 tie
    at 1, then one host each, then the smaller pool id: T4; inside it c (PHB, d 4) beats d (NODE, 5)."""
    p = make_policy("seed", weights={"load_balance": 1.0, "fragmentation": 0.0, "topology": 0.0,
                                     "free_blocks": 0.0})
    keys = p.place(view, Job("new", 0, 1, 2))
    assert sorted(f"{k.host}{k.index}" for k in keys) == ["c0", "c1"]


def _schedule(cluster, weights):
    from airflow_hetero_gpu.sim.engine import simulate

    jobs = [Job(f"j{i}", i * 3.0, 20 + (i * 13) % 40, [1, 2, 1, 4, 8, 1, 2][i % 7]) for i in range(60)]
    result = simulate(cluster, jobs, make_policy("seed", weights=weights))
    return [(r.id, r.start, r.keys) for r in result.records]


def test_w2_and_the_scale_of_the_weights_change_no_seed_decision(cluster):
    """Every GPU is idle (load 0) or held (load 1), so FR = 0 in every pool and w2 multiplies 0;
    and plan() only compares E, so scaling all weights changes nothing. The sweep relies on both."""
    base = _schedule(cluster, {"load_balance": 0.1, "fragmentation": -0.2, "topology": 0.5, "free_blocks": 0.2})
    assert _schedule(cluster, {"load_balance": 0.1, "fragmentation": -5.0, "topology": 0.5, "free_blocks": 0.2}) == base
    assert _schedule(cluster, {"load_balance": 0.1, "fragmentation": 0.0, "topology": 0.5, "free_blocks": 0.2}) == base
    assert _schedule(cluster, {"load_balance": 0.3, "fragmentation": 0.0, "topology": 1.5, "free_blocks": 0.6}) == base
    assert _schedule(cluster, {"load_balance": 1.0, "fragmentation": 0.0, "topology": 0.0, "free_blocks": 0.0}) != base
