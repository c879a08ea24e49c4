"""Table-driven tests of the small units of the placement core: card types, health rules,
scorers, filters, config validation."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_hetero_gpu.core.cardtype import card_type_matches
from airflow_hetero_gpu.core.cluster import build_cluster
from airflow_hetero_gpu.core.config import ClusterConfig, Thresholds, config_from_mapping
from airflow_hetero_gpu.core.filters import PRESELECT, PRIMARY
from airflow_hetero_gpu.core.health import GpuFacts, health_reasons
from airflow_hetero_gpu.core.model import Gpu, GpuKey, PlanRequest
from airflow_hetero_gpu.core.planner import cluster_state
from airflow_hetero_gpu.core.scorers import fragmentation, free_blocks, load_balance, topology_score
from airflow_hetero_gpu.core.scorers.free_blocks import block_sizes
from airflow_hetero_gpu.core.selection import Selection
from airflow_hetero_gpu.core.topology import HostWiring
from airflow_hetero_gpu.core.view import PoolView
from airflow_hetero_gpu.errors import ConfigError, RequestError


@pytest.mark.parametrize(
    "card, wanted, ok",
    [
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", True),
        ("NVIDIA A100-SXM4-80GB", "nvidia a100-sxm4-80gb", True),
        ("NVIDIA A100-SXM4-80GB", "A100", False),
        ("NVIDIA A100-SXM4-80GB", "A100*", True),
        ("NVIDIA GeForce RTX 4090", "RTX 4090", True),
        ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090", True),
        ("NVIDIA GeForce RTX 4090", "rtx  4090", True),
        ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB", True),
        ("Tesla V100-SXM2-32GB", "V100-SXM2-16GB", False),
        ("NVIDIA H100 80GB HBM3", "H100 80GB HBM3", True),
        ("NVIDIA H100 80GB HBM3", "*h100*", True),
    ],
)
def test_card_type_matching(card, wanted, ok):
    assert card_type_matches(card, wanted) is ok


TH = Thresholds()


@pytest.mark.parametrize(
    "facts, reasons",
    [
        (GpuFacts(), ()),
        (GpuFacts(host_error="connection refused"), ("unreachable",)),
        (GpuFacts(lost=True), ("lost",)),
        (GpuFacts(ecc_uncorrected=0), ()),
        (GpuFacts(ecc_uncorrected=2), ("ecc",)),
        (GpuFacts(retired_pages_pending=True), ("retired-pages-pending",)),
        (GpuFacts(retired_pages_pending=False), ()),
        (GpuFacts(temperature_c=89.9), ()),
        (GpuFacts(temperature_c=90), ("temperature",)),
        (GpuFacts(xids=(13, 31, 43, 45, 68, 109)), ()),
        (GpuFacts(xids=(79, 13, 48, 79)), ("xid-48", "xid-79")),
        (GpuFacts(ecc_uncorrected=1, temperature_c=95, xids=(63,)), ("ecc", "temperature", "xid-63")),
    ],
)
def test_health_rules(facts, reasons):
    assert health_reasons(facts, TH) == reasons


def _pool_view(loads, healthy=None, request=PlanRequest(1), reserved=(), mem_used=None, selection_d=1.0):
    n = len(loads)
    healthy = healthy or [True] * n
    gpus = [
        Gpu("h", i, f"u{i}", "NVIDIA A100-SXM4-80GB", 1000.0, (mem_used or [0] * n)[i], loads[i],
            healthy=healthy[i], reasons=() if healthy[i] else ("ecc",))
        for i in range(n)
    ]
    c = build_cluster(gpus)
    st = cluster_state(c, request, {GpuKey("h", i): "job-x" for i in reserved})
    return PoolView(c.pools[0], st, Selection((), selection_d))


@pytest.mark.parametrize(
    "loads, healthy, reserved, lb, fr",
    [
        ([0.0, 0.0, 0.0, 0.0], None, (), 1.0, 0.0),
        ([0.0, 0.5, 1.0, 0.5], None, (), 0.5, 0.5),  # max 1, mean .5; .5 and .5 are fragments
        ([0.05, 0.1, 0.9, 0.95], None, (), 1 - (0.95 - 0.5), 0.0),  # .1 and .9 are at the bounds
        ([0.0, 0.2, 0.0, 0.0], None, (1,), 1 - (1.0 - 0.25), 0.0),  # reserved counts as load 1
        ([0.0, 0.3, 0.9, 0.0], [True, True, False, True], (), 1 - (0.3 - 0.1), 1 / 3),  # sick not counted
    ],
)
def test_load_balance_and_fragmentation(loads, healthy, reserved, lb, fr):
    v = _pool_view(loads, healthy, reserved=reserved)
    assert load_balance(v) == pytest.approx(lb, abs=1e-12)
    assert fragmentation(v) == pytest.approx(fr, abs=1e-12)


@pytest.mark.parametrize("d, ts", [(1.0, 1.0), (2.0, 0.5), (4 / 3, 0.75), (10.0, 0.1)])
def test_topology_score(d, ts):
    assert topology_score(_pool_view([0.0], selection_d=d)) == pytest.approx(ts, abs=1e-12)


@pytest.mark.parametrize(
    "k, largest, sizes",
    [(1, 8, [2, 4, 8]), (2, 8, [4, 8]), (3, 8, [4, 8]), (4, 8, [8]), (7, 8, [8]), (8, 8, []), (1, 6, [2, 4]),
     (1, 1, []), (1, 16, [2, 4, 8, 16])],
)
def test_block_sizes(k, largest, sizes):
    assert block_sizes(k, largest) == sizes


def _fb(k, selection, reserved=(), loads=None, sick=()):
    """FB of ``selection`` on three hosts of one card type (one pool), the largest holding 8:
    nv: 8 GPUs, every pair NV12: a b-block is worth b (d 1);
    pcie: 8 GPUs, PIX inside 0-3 and 4-7, PHB across: pairs and quads d 2 (worth b/2), all 8
      d = (12·2 + 16·4)/28 = 22/7 (worth 8·7/22 = 28/11);
    box: 2 GPUs, PHB: its pair d 4 (worth 2/4)."""
    loads = loads or {}
    pix = {(a, b): "PIX" if (a < 4) == (b < 4) else "PHB" for a in range(8) for b in range(8) if a < b}
    wiring = {"nv": HostWiring.from_links(range(8), {(a, b): "NV12" for a in range(8) for b in range(8) if a < b}),
              "pcie": HostWiring.from_links(range(8), pix), "box": HostWiring.from_links(range(2), {(0, 1): "PHB"})}
    gpus = [Gpu(h, i, f"{h}{i}", "T", 1000.0, 0.0, loads.get((h, i), 0.0), healthy=(h, i) not in sick,
                reasons=("ecc",) if (h, i) in sick else ())
            for h, n in (("nv", 8), ("pcie", 8), ("box", 2)) for i in range(n)]
    c = build_cluster(gpus, wiring)
    st = cluster_state(c, PlanRequest(k), {GpuKey(*g): "job" for g in reserved})
    return free_blocks(PoolView(c.pools[0], st, Selection(tuple(selection), 1.0)))


NV = [("nv", i) for i in range(8)]
PCIE = [("pcie", i) for i in range(8)]


@pytest.mark.parametrize(
    "k, selection, reserved, loads, sick, fb",
    [
        # one GPU: sizes 2, 4, 8 (sum 14)
        (1, NV[:1], (), None, (), 0.0),  # idle NVSwitch host: breaks a 2-, 4- and 8-block, 14/14
        (1, PCIE[:1], (), None, (), 1 - (2 / 2 + 4 / 2 + 28 / 11) / 14),  # 0.603896
        (1, [("box", 0)], (), None, (), 1 - (2 / 4) / 14),  # 0.964286: only a PHB pair
        (1, NV[5:6], NV[:5], None, (), 1.0),  # 3 idle -> 2: still one pair, no 4: nothing broken
        (1, NV[4:5], NV[:4], None, (), 1 - (2 + 4) / 14),  # 4 -> 3: the 4-block and a pair
        (1, NV[1:2], (), {("nv", 0): 0.5}, (), 1.0),  # GPU0 busy: 7 idle -> 6 breaks nothing
        (1, NV[1:2], (), None, (("nv", 0),), 1.0),  # GPU0 unhealthy: likewise
        # two GPUs: sizes 4, 8 (sum 12)
        (2, NV[:2], (), None, (), 0.0),
        (2, PCIE[:2], (), None, (), 1 - (4 / 2 + 28 / 11) / 12),  # 0.621212
        (2, NV[6:8], NV[:4], None, (), 1 - 4 / 12),  # 4 -> 2: the 4-block, no 8-block was left
        # four GPUs: size 8 only; eight: nothing larger to keep
        (4, NV[:4], (), None, (), 0.0),
        (4, PCIE[:4], (), None, (), 1 - (28 / 11) / 8),  # 0.681818
        (8, NV, (), None, (), 1.0),
        # spanning: the mean over its hosts (H = 2)
        (3, NV[6:8] + [("box", 0)], NV[:6], None, (), 1.0),  # 2 idle on nv, 2 on box: no 4-block
        (3, NV[:1] + [("box", 0), ("box", 1)], (), None, (), 1 - 12 / (2 * 12)),  # nv loses 4 + 8
    ],
)
def test_free_blocks(k, selection, reserved, loads, sick, fb):
    assert _fb(k, selection, reserved, loads, sick) == pytest.approx(fb, abs=1e-12)


@pytest.mark.parametrize(
    "request_, loads, healthy, mem_used, stage_reason",
    [
        (PlanRequest(2), [0, 0, 0], None, None, (None, None)),
        (PlanRequest(2, gpu_type="V100-SXM2-32GB"), [0, 0, 0], None, None,
         ("card type 'NVIDIA A100-SXM4-80GB' is not the requested 'V100-SXM2-32GB'", None)),
        (PlanRequest(2, gpu_type=("V100-SXM2-32GB", "A100-SXM4-80GB")), [0, 0, 0], None, None, (None, None)),
        (PlanRequest(2, task_type="llm"), [0, 0, 0], None, None,
         ("does not support task type 'llm' (supports NVIDIA A100-SXM4-80GB)", None)),
        (PlanRequest(3), [0, 0, 0], [True, False, True], None,
         ("needs 3 GPUs, has 2 healthy of 3: h GPU1 ecc", None)),
        (PlanRequest(2), [0.5, 0.0, 0.9], None, None,
         (None, "needs 2 available, has 1: 2 busy (load > 0.1)")),
        (PlanRequest(2, gpu_memory_mib=950), [0, 0, 0], None, [0, 60, 60],
         (None, "needs 2 available, has 1: 2 with less than 950 MiB free")),
    ],
)
def test_filters(request_, loads, healthy, mem_used, stage_reason):
    v = _pool_view(loads, healthy, request=request_, mem_used=mem_used)
    primary = next((r for r in (f(v) for f in PRIMARY) if r), None)
    pre = next((r for r in (f(v) for f in PRESELECT) if r), None) if primary is None else None
    assert (primary, pre) == stage_reason


def test_reserved_reason_names_the_job():
    v = _pool_view([0, 0, 0], request=PlanRequest(2), reserved=(0, 1))
    assert [f(v) for f in PRESELECT] == ["needs 2 available, has 1: 2 reserved (by job-x×2)"]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"weights": {"load_balance": 1}}, None),
        ({"weigths": {}}, "cluster.yaml: weigths: unknown key"),
        ({"weights": {"topo": 1}}, "cluster.yaml: weights.topo: unknown key"),
        ({"weights": {"topology": "high"}}, "cluster.yaml: weights.topology: input should be a number, got 'high'"),
        ({"weights": {"free_blocks": True}}, "cluster.yaml: weights.free_blocks: input should be a number, got True"),
        ({"thresholds": {"busy_utilization": 2}}, "cluster.yaml: thresholds.busy_utilization: input should be less than or equal to 1"),
        ({"thresholds": {"busy_utilization": 0.5, "full_utilization": 0.4}},
         "cluster.yaml: thresholds: full_utilization (0.4) must not be below busy_utilization (0.5)"),
        ({"task_types": {"hosts": {"dgx-*": "llm"}}}, "cluster.yaml: task_types.hosts.dgx-*: input should be a valid list"),
        ([1, 2], "cluster.yaml: expected a mapping of keys at the top level, got list"),
    ],
)
def test_config_validation(data, message):
    if message is None:
        assert config_from_mapping(data).weights.load_balance == 1
    else:
        with pytest.raises(ConfigError) as err:
            config_from_mapping(data)
        assert str(err.value).startswith(message)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "host, card, types",
    [
        ("dgx-a1", "NVIDIA A100-SXM4-80GB", ("finetune", "llm-pretrain")),
        ("ws-1", "NVIDIA GeForce RTX 4090", ("cv", "finetune")),
        ("ws-2", "Tesla V100-SXM2-32GB", ("Tesla V100-SXM2-32GB",)),
    ],
)
def test_task_type_rules(host, card, types):
    cfg = config_from_mapping({"task_types": {
        "hosts": {"dgx-*": ["llm-pretrain", "finetune"]},
        "models": {"RTX 4090": ["finetune", "cv"]},
    }})
    assert cfg.task_types_for(host, card) == types


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gpus": 0}, "gpus: must be at least 1, got 0"),
        ({"gpus": -2}, "gpus: must be at least 1, got -2"),
        ({"gpus": "4"}, "gpus: expected a positive integer, got '4'"),
        ({"gpus": True}, "gpus: expected a positive integer, got True"),
        ({"gpus": 1, "gpu_memory_mib": -1}, "gpu_memory_mib: must not be negative, got -1"),
        ({"gpus": 1, "gpu_type": ""}, "gpu_type: expected card type names, got ''"),
    ],
)
def test_request_validation(kwargs, message):
    with pytest.raises(RequestError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        PlanRequest(**kwargs)


def test_default_config():
    # SPEC §3's defaults except w1 (0.3 there) and the added free-blocks weight: docs/concepts.md
    c = ClusterConfig()
    assert (c.weights.load_balance, c.weights.fragmentation, c.weights.topology, c.weights.free_blocks) == (
        0.1, -0.2, 0.5, 0.2)
    assert (c.thresholds.busy_utilization, c.thresholds.full_utilization, c.thresholds.max_temperature_c) == (0.10, 0.90, 90)
    assert np.isclose(c.thresholds.readmit_after_healthy_checks, 3)
