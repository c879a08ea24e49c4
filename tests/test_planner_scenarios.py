"""The planner on a hand-made cluster (tests/plan_fixtures.py), against values computed by hand.

The first four cases check the SPEC §7 formula term by term, so they pass SPEC §3's weights
(E = 0.3·LB − 0.2·FR + 0.5·TS, no free-blocks term); the rest use the defaults,
E = 0.1·LB − 0.2·FR + 0.5·TS + 0.2·FB (docs/algorithm.md), and two cases show where the
free-blocks term changes the pool. Every expected number below is worked out beside it.
"""

from __future__ import annotations

import pytest

from airflow_hetero_gpu.core.inventory import load_cluster
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.core.planner import plan, replacement
from plan_fixtures import A100, RTX, V100, make_captures

TOL = 1e-9
SPEC_WEIGHTS = {"load_balance": 0.3, "fragmentation": -0.2, "topology": 0.5, "free_blocks": 0.0}


def _plan(tmp_path, request, reserved=None, evicted=None, weights=None, **captures):
    cluster = load_cluster(make_captures(tmp_path, **captures))
    return plan(cluster, request, reserved=reserved, evicted=evicted, weights=weights)


def _pool(result, card):
    return next(p for p in result.pools if p.card_type == card)


def _keys(decision):
    return [(g.host, g.index) for g in decision.gpus]


def test_load_balance_decides(tmp_path):
    # a100-1 GPU0 at 95 %: A100 pool (16 GPUs) u_max .95, mean .95/16 -> LB = 1 - (.95 - .059375)
    # FR = 0 (.95 is above full), TS = 1 (NV12 pair). V100: LB 1, FR 0, TS 1 (NV1 pair).
    r = _plan(tmp_path, PlanRequest(2), loads={"a100-1": {0: 0.95}}, weights=SPEC_WEIGHTS)
    a, v = _pool(r, A100), _pool(r, V100)
    lb_a = 1 - (0.95 - 0.95 / 16)
    assert a.score.load_balance == pytest.approx(lb_a, abs=TOL)
    assert a.score.total == pytest.approx(0.3 * lb_a + 0.5, abs=TOL)  # 0.5328125
    assert v.score.total == pytest.approx(0.8, abs=TOL)
    assert r.decision.pool == V100 and v.stage == "scheduling" and a.stage == "preselected"
    assert _keys(r.decision) == [("v100", 0), ("v100", 1)]  # smallest d (1), lowest indices


def test_fragmentation_decides(tmp_path):
    # V100 GPUs 0-3 at 95 %: LB = 1 - (.95 - .475) = .525, FR 0, TS 1 -> E = .1575 + .5 = .6575
    # A100: six at .95 and two at .5 on a100-1, two at .45 on a100-2: sum 7.6, mean .475, max .95
    #   -> LB .525 too; fragments .5, .5, .45, .45 -> FR 4/16 = .25 -> E = .1575 - .05 + .5 = .6075
    loads = {
        "v100": {0: 0.95, 1: 0.95, 2: 0.95, 3: 0.95},
        "a100-1": {0: 0.95, 1: 0.95, 2: 0.95, 3: 0.95, 4: 0.95, 5: 0.95, 6: 0.5, 7: 0.5},
        "a100-2": {0: 0.45, 1: 0.45},
    }
    r = _plan(tmp_path, PlanRequest(2), loads=loads, weights=SPEC_WEIGHTS)
    a, v = _pool(r, A100), _pool(r, V100)
    assert a.score.load_balance == pytest.approx(0.525, abs=TOL)
    assert v.score.load_balance == pytest.approx(0.525, abs=TOL)
    assert (a.score.fragmentation, v.score.fragmentation) == (pytest.approx(0.25, abs=TOL), 0.0)
    assert a.score.total == pytest.approx(0.6075, abs=TOL)
    assert v.score.total == pytest.approx(0.6575, abs=TOL)
    assert r.decision.pool == V100
    assert _keys(r.decision) == [("v100", 4), ("v100", 5)]  # 4-5 is NV1, the lowest free pair


def test_topology_decides(tmp_path):
    # 4 GPUs, V100 or RTX 4090 accepted. Both idle: LB 1, FR 0.
    # V100 {0,1,2,3}: every pair one NVLink -> d 1, TS 1 -> E .8
    # RTX 4090 one box: pairs 0-1, 2-3 PHB (4), four SYS (6): d = (4+4+24)/6 = 16/3, TS = 3/16
    #   -> E = .3 + .5 · .1875 = .39375. The V100 pool wins although its id sorts last.
    r = _plan(tmp_path, PlanRequest(4, gpu_type=("RTX 4090", "V100-SXM2-32GB")), weights=SPEC_WEIGHTS)
    v, g = _pool(r, V100), _pool(r, RTX)
    assert g.score.topology == pytest.approx(3 / 16, abs=TOL)
    assert g.score.total == pytest.approx(0.39375, abs=TOL)
    assert v.score.total == pytest.approx(0.8, abs=TOL)
    assert r.decision.pool == V100 and _keys(r.decision) == [("v100", i) for i in range(4)]
    assert _pool(r, A100).stage == "rejected"


def test_dgx1_subset_goes_through_a_third_gpu(tmp_path):
    # V100 GPUs 1-4 and 7 busy: available 0, 5, 6. d(0,5) = d(0,6) = 2 (no direct NVLink: via a
    # third GPU), d(5,6) = 1 -> d = 5/3, TS = .6; LB = 1 - (1 - 5/8) = .625 (five at 100 %)
    r = _plan(tmp_path, PlanRequest(3, gpu_type="V100-SXM2-32GB"),
              loads={"v100": {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 7: 1.0}}, weights=SPEC_WEIGHTS)
    assert _keys(r.decision) == [("v100", 0), ("v100", 5), ("v100", 6)]
    assert r.decision.mean_distance == pytest.approx(5 / 3, abs=TOL)
    assert r.decision.score.total == pytest.approx(0.3 * 0.625 + 0.5 * 0.6, abs=TOL)


def test_free_blocks_keeps_the_idle_dgx1_whole(tmp_path):
    # The load-balance case above with the default weights (0.1, -0.2, 0.5, 0.2). A 2-GPU job:
    # block sizes 4 and 8 (sum 12). A100: best fit a100-1 (7 available: GPUs 1-7) -> 1, 2; 7 -> 5
    #   idle keeps its 4-block and had no 8-block: FB 1, E = 0.1 * 0.109375 + 0.5 + 0.2 = 0.7109375
    # V100: v100 0-1 out of 8 idle breaks a 4-block (NVLink quad, d 1: worth 4) and the 8-block
    #   (DGX-1 cube mesh d 40/28: worth 8 * 0.7 = 5.6): FB = 1 - 9.6/12 = 0.2, E = 0.1 + 0.5 + 0.04
    # So the job joins the partly used A100 host, where SPEC §3's weights broke the idle DGX-1.
    r = _plan(tmp_path, PlanRequest(2), loads={"a100-1": {0: 0.95}})
    a, v = _pool(r, A100), _pool(r, V100)
    assert (a.score.free_blocks, v.score.free_blocks) == (pytest.approx(1.0, abs=TOL), pytest.approx(0.2, abs=TOL))
    assert a.score.total == pytest.approx(0.7109375, abs=TOL)
    assert v.score.total == pytest.approx(0.64, abs=TOL)
    assert r.decision.pool == A100 and _keys(r.decision) == [("a100-1", 1), ("a100-1", 2)]


def test_free_blocks_keeps_a_free_nvlink_quad(tmp_path):
    # The fragmentation case above with the default weights. V100's free GPUs 4-7 are one NVLink
    # quad: taking 2 breaks it (worth 4 of 12): FB = 2/3, E = 0.1 * 0.525 + 0.5 + 0.2 * 2/3 = 0.685833
    # A100: only a100-2 GPUs 2-7 are available (6 idle -> 4: its 4-block stays): FB 1,
    #   E = 0.0525 - 0.2 * 0.25 + 0.5 + 0.2 = 0.7025 -> A100, a100-2 GPUs 2, 3
    loads = {
        "v100": {0: 0.95, 1: 0.95, 2: 0.95, 3: 0.95},
        "a100-1": {0: 0.95, 1: 0.95, 2: 0.95, 3: 0.95, 4: 0.95, 5: 0.95, 6: 0.5, 7: 0.5},
        "a100-2": {0: 0.45, 1: 0.45},
    }
    r = _plan(tmp_path, PlanRequest(2), loads=loads)
    a, v = _pool(r, A100), _pool(r, V100)
    assert v.score.free_blocks == pytest.approx(2 / 3, abs=TOL)
    assert a.score.total == pytest.approx(0.7025, abs=TOL)
    assert v.score.total == pytest.approx(0.0525 + 0.5 + 0.2 * 2 / 3, abs=TOL)
    assert r.decision.pool == A100 and _keys(r.decision) == [("a100-2", 2), ("a100-2", 3)]


def test_best_fit_prefers_the_host_with_fewer_free_gpus(tmp_path):
    # a100-1 has 3 free GPUs (5-7), a100-2 has 8: both give d 1 for 2 GPUs; fewer available wins
    r = _plan(tmp_path, PlanRequest(2, gpu_type="A100-SXM4-80GB"),
              loads={"a100-1": {i: 0.5 for i in range(5)}})
    assert _keys(r.decision) == [("a100-1", 5), ("a100-1", 6)]


def test_healthy_cluster_takes_a100_1(tmp_path):
    r = _plan(tmp_path, PlanRequest(8, gpu_type="A100-SXM4-80GB"))
    assert r.decision.hosts == ["a100-1"]  # tie on d and on free count: host name


@pytest.mark.parametrize(
    "captures, reason",
    [
        ({"faults": {"a100-1": {3: {"ecc_uncorrected_volatile": 2}}}}, "ecc"),
        ({"faults": {"a100-1": {3: {"temperature_c": 93}}}}, "temperature"),
        ({"faults": {"a100-1": {3: {"retired_pages_pending": True}}}}, "retired-pages-pending"),
        ({"faults": {"a100-1": {3: {"overrides": {"memory.used": "[Unknown Error]"}}}}}, "lost"),
        ({"xid": {"a100-1": [{"time": 812.5, "gpu": 3, "xid": 79}]}}, "xid-79"),
        ({"errors": {"a100-1": "connection refused (127.0.0.11:2222)"}}, "unreachable"),
    ],
)
def test_an_unhealthy_gpu_changes_the_answer(tmp_path, captures, reason):
    r = _plan(tmp_path, PlanRequest(8, gpu_type="A100-SXM4-80GB"), **captures)
    assert r.decision.hosts == ["a100-2"]
    sick = {(g.host, g.index): g.reasons for g in r.unhealthy}
    if reason == "unreachable":
        assert set(sick) == {("a100-1", i) for i in range(8)}
        assert all(v == ("unreachable",) for v in sick.values())
    else:
        assert sick == {("a100-1", 3): (reason,)}
    # the pool lost one (or eight) healthy GPUs, LB/FR unchanged (all idle); 8 GPUs: no larger
    # block to keep, FB 1: E = 0.1 + 0.5 + 0.2
    assert r.decision.score.total == pytest.approx(0.8, abs=TOL)


def test_an_application_xid_changes_nothing(tmp_path):
    r = _plan(tmp_path, PlanRequest(8, gpu_type="A100-SXM4-80GB"),
              xid={"a100-1": [{"time": 5.0, "gpu": 3, "xid": 13}, {"time": 6.0, "gpu": 2, "xid": 43}]})
    assert r.decision.hosts == ["a100-1"] and r.unhealthy == []


def test_no_pool_fits_gives_every_reason(tmp_path):
    r = _plan(tmp_path, PlanRequest(9, gpu_type=("A100-SXM4-80GB", "V100-SXM2-32GB")),
              loads={"a100-1": {i: 0.5 for i in range(8)}, "a100-2": {0: 1.0}})
    assert r.decision is None
    reasons = {p.card_type: (p.stage, p.reason) for p in r.pools}
    assert reasons == {
        A100: ("primary", "needs 9 available, has 7: 9 busy (load > 0.1)"),
        V100: ("rejected", "needs 9 GPUs, has 8 healthy of 8"),
        RTX: ("rejected", "card type 'NVIDIA GeForce RTX 4090' is not the requested "
                          "'A100-SXM4-80GB' or 'V100-SXM2-32GB'"),
    }


def test_spanning_two_hosts_under_the_spine(tmp_path):
    # 6 RTX 4090: no box holds 6 -> two hosts (rtx-1 on leaf2, rtx-2 on leaf3: common tier 2,
    # 20 apart). Most available first, ties by name: all 4 of rtx-1, the best pair of rtx-2 (0,1).
    # Pair sums: rtx-1 32, rtx-2 pair 4, across 4·2·20 = 160 -> d = 196/15, TS = 15/196
    r = _plan(tmp_path, PlanRequest(6, gpu_type="RTX 4090"))
    assert _keys(r.decision) == [("rtx-1", 0), ("rtx-1", 1), ("rtx-1", 2), ("rtx-1", 3), ("rtx-2", 0), ("rtx-2", 1)]
    assert r.decision.hosts == ["rtx-1", "rtx-2"]
    assert r.decision.score.topology == pytest.approx(15 / 196, abs=TOL)
    # LB 1, FR 0; FB 1 (a spanning job finds no host with more than k idle GPUs, so no block of
    # more than k to break): E = 0.1 + 0.5 TS + 0.2
    assert r.decision.score.free_blocks == pytest.approx(1.0, abs=TOL)
    assert r.decision.score.total == pytest.approx(0.3 + 0.5 * 15 / 196, abs=TOL)


def test_spanning_prefers_the_lower_switch_tier(tmp_path):
    # 10 A100 with a100-1 fully busy except 2 GPUs: a100-2 (8, leaf2) must pair with a100-1 (2,
    # leaf1): tier 2. No lower-tier pair exists, so the spine is used: d = (28 + 1 + 8·2·20)/45
    r = _plan(tmp_path, PlanRequest(10, gpu_type="A100-SXM4-80GB"),
              loads={"a100-1": {i: 1.0 for i in range(6)}})
    assert r.decision.hosts == ["a100-1", "a100-2"]
    assert r.decision.mean_distance == pytest.approx((28 + 1 + 320) / 45, abs=TOL)


def test_reserved_and_evicted_gpus_from_the_ledger(tmp_path):
    # reserved GPUs count as load 1, evicted ones are not healthy: a100-1 can no longer take 8
    reserved = {GpuKey("a100-1", 0): "job-7"}
    evicted = {GpuKey("a100-2", 5): ("ecc",)}
    r = _plan(tmp_path, PlanRequest(7, gpu_type="A100-SXM4-80GB"), reserved=reserved, evicted=evicted)
    # both hosts have 7 free: tie on d (1) and count -> a100-1 (name); LB = 1 - (1 - 1/15)
    assert r.decision.hosts == ["a100-1"] and ("a100-1", 0) not in _keys(r.decision)
    assert r.decision.score.load_balance == pytest.approx(1 / 15, abs=TOL)
    assert _pool(r, A100).healthy == 15
    r = _plan(tmp_path, PlanRequest(8, gpu_type="A100-SXM4-80GB"), reserved=reserved, evicted=evicted)
    # 7 free on each: most available first, ties by name -> all 7 of a100-1, then a100-2's GPU0
    assert _keys(r.decision) == [("a100-1", i) for i in range(1, 8)] + [("a100-2", 0)]


def test_replacement_of_an_abnormal_gpu(tmp_path):
    # job on v100 0-3 loses GPU1; candidates 4-7: sums with {0,2,3}: 4 -> 1+2+2, 5 -> 2+2+2,
    # 6 -> 2+1+2, 7 -> 2+2+1: 4, 6 and 7 tie at 5; same host, lowest index -> 4
    cluster = load_cluster(make_captures(tmp_path))
    holding = [GpuKey("v100", i) for i in range(4)]
    reserved = {k: "job" for k in holding}
    assert replacement(cluster, holding, GpuKey("v100", 1), reserved=reserved) == GpuKey("v100", 4)
    busy = {**reserved, **{GpuKey("v100", i): "other" for i in range(4, 8)}}
    assert replacement(cluster, holding, GpuKey("v100", 1), reserved=busy) is None
