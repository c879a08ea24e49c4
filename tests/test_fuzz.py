"""Property-based tests (hypothesis) of every reader and of the planner.

Readers: every generated input either parses or raises the project's own error type with a
one-line message naming the file. Planner: it never returns a GPU that is unhealthy, reserved,
evicted, busy, of the wrong type or twice, and never fewer or more than k.

The example counts add up to more than 10,000 generated inputs per run (8 × 1,200 + 1,500).
"""

from __future__ import annotations

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_hetero_gpu.capture.query import parse_query_csv
from airflow_hetero_gpu.capture.slurm import expand_hostlist, parse_topology_conf
from airflow_hetero_gpu.capture.topo import parse_topo
from airflow_hetero_gpu.capture.xid import parse_xid_log
from airflow_hetero_gpu.core.cardtype import card_type_matches
from airflow_hetero_gpu.core.cluster import build_cluster
from airflow_hetero_gpu.core.config import config_from_mapping
from airflow_hetero_gpu.core.model import Gpu, GpuKey, PlanRequest
from airflow_hetero_gpu.core.planner import cluster_state, plan
from airflow_hetero_gpu.core.topology import HostWiring, NetworkTiers
from airflow_hetero_gpu.errors import HeteroGpuError

FUZZ = settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- readers ------------------------------------------------------------------------------------

LABELS = ["X", "NV1", "NV2", "NV4", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC", "N/A", "", "x", "NV"]
CELLS = ["0", "1", "7", "81920 MiB", "0 MiB", "35 %", "[N/A]", "[Not Supported]", "[Unknown Error]",
         "[GPU requires reset]", "250.00 W", "Yes", "No", "NVIDIA A100-SXM4-80GB", "GPU-1234", "00000000:3B:00.0",
         "-3", "1e309", "nan", "12 GiB", "", "a,b", "\x00", "Unable to determine the device handle for GPU0000:07:00.0: Unknown Error"]
FIELDS = ["index", "uuid", "name", "pci.bus_id", "memory.total [MiB]", "memory.used [MiB]", "utilization.gpu [%]",
          "temperature.gpu", "power.draw [W]", "power.limit [W]", "ecc.errors.uncorrected.volatile.total",
          "retired_pages.pending", "gpu_name", "fan.speed [%]", "bogus"]


def _one_line_error(err: HeteroGpuError, path: str) -> None:
    text = str(err)
    assert "\n" not in text and text.strip() == text
    assert path in text


def _check_reader(fn, text: str, path: str):
    try:
        return fn(text, path)
    except HeteroGpuError as err:
        _one_line_error(err, path)
        return None


@FUZZ
@given(st.text(alphabet=string.printable + "\x1b\u00e9", max_size=400))
def test_query_reader_on_any_text(text):
    _check_reader(parse_query_csv, text, "hosts/h/query.csv")


@FUZZ
@given(
    st.lists(st.sampled_from(FIELDS), min_size=1, max_size=8, unique=True),
    st.lists(st.lists(st.sampled_from(CELLS), min_size=0, max_size=9), min_size=0, max_size=5),
)
def test_query_reader_on_csv_shaped_input(header, rows):
    text = ", ".join(header) + "\n" + "".join(", ".join(r) + "\n" for r in rows)
    result = _check_reader(parse_query_csv, text, "hosts/h/query.csv")
    if result is not None and result.host_error is None:
        indices = [r.index for r in result.rows]
        assert len(indices) == len(set(indices))  # never two rows for one GPU
        for row in result.rows:
            assert isinstance(row.name, str) and row.name
            if row.utilization_pct is not None:
                assert row.utilization_pct == row.utilization_pct  # not NaN


@FUZZ
@given(st.integers(1, 6), st.data())
def test_topo_reader_on_matrix_shaped_input(n, data):
    cells = [[data.draw(st.sampled_from(LABELS)) for _ in range(n)] for _ in range(n)]
    sep = data.draw(st.sampled_from(["\t", " ", "  ", "\t\t"]))
    lines = [sep + sep.join(f"GPU{i}" for i in range(n)) + sep + "CPU Affinity"]
    lines += [f"GPU{i}" + sep + sep.join(cells[i]) + sep + "0-15" for i in range(n)]
    if data.draw(st.booleans()):
        lines.insert(0, "\x1b[4m")
    text = "\n".join(lines) + "\n"
    matrix = _check_reader(parse_topo, text, "hosts/h/topo.txt")
    if matrix is not None:
        assert len(matrix.gpus) == n
        for (a, b), label in matrix.links.items():
            assert a != b and matrix.links[(b, a)] == label


@FUZZ
@given(st.text(alphabet=string.printable, max_size=300))
def test_topo_reader_on_any_text(text):
    _check_reader(parse_topo, text, "hosts/h/topo.txt")


@FUZZ
@given(st.lists(st.one_of(
    st.text(alphabet=string.printable, max_size=80),
    st.builds(lambda bus, xid, tail: f"[ 12.5] NVRM: Xid (PCI:{bus}): {xid}, {tail}",
              st.sampled_from(["0000:3b:00", "0000:3B:00", "3b:00", "zz", "", "0000:07:00.0"]),
              st.sampled_from(["79", "13", "-1", "x", "", "48"]), st.text(max_size=20)),
), max_size=6))
def test_xid_reader(lines):
    events = _check_reader(parse_xid_log, "\n".join(lines), "hosts/h/xid.log")
    for ev in events or []:
        assert ev.xid >= 0 and ev.pci_bus_id.count(":") == 2


@FUZZ
@given(st.lists(st.builds(
    lambda name, key, value: f"SwitchName={name} {key}={value}",
    st.sampled_from(["s0", "s1", "s2", "leaf", "spine", "s[0-1]", ""]),
    st.sampled_from(["Nodes", "Switches", "LinkSpeed", "Bogus", "nodes"]),
    st.sampled_from(["n[01-04]", "a,b", "s[0-1]", "s0", "n[3-1]", "n[", "", "leaf,spine", "x[1-3]-y[1-2]"]),
), max_size=5))
def test_topology_conf_reader(lines):
    topo = _check_reader(parse_topology_conf, "\n".join(lines) + "\n", "topology.conf")
    if topo is not None:
        for host in topo.hosts:
            for other in topo.hosts:
                tier = topo.lowest_common_tier(host, other)
                assert tier is None or 1 <= tier <= topo.max_tier


@FUZZ
@given(st.text(alphabet="abn0123456789[]-,", max_size=30))
def test_hostlist_expansion(expr):
    try:
        hosts = expand_hostlist(expr)
    except ValueError as err:
        assert "\n" not in str(err)
        return
    assert all(hosts) and len(hosts) < 100_000


YAML_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(-2, 2, allow_nan=False),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["weights", "thresholds", "task_types", "hosts", "models",
                                                             "load_balance", "topology", "busy_utilization",
                                                             "dgx-*", "x"]), inner, max_size=3)),
    max_leaves=8,
)


@FUZZ
@given(YAML_VALUES)
def test_cluster_yaml_validation(data):
    try:
        config_from_mapping(data, source="cluster.yaml")
    except HeteroGpuError as err:
        _one_line_error(err, "cluster.yaml")


# --- the planner ----------------------------------------------------------------------------------

CARDS = ["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB", "NVIDIA GeForce RTX 4090"]
WIRINGS = {
    "nv": lambda n: {(i, j): "NV12" for i in range(n) for j in range(n) if i < j},
    "pcie": lambda n: {(i, j): ("PIX" if i // 2 == j // 2 else "SYS") for i in range(n) for j in range(n) if i < j},
}


@st.composite
def clusters(draw):
    n_hosts = draw(st.integers(1, 5))
    gpus, wiring = [], {}
    for h in range(n_hosts):
        host = f"h{h}"
        n = draw(st.sampled_from([1, 2, 4, 8]))
        card = draw(st.sampled_from(CARDS))
        wiring[host] = HostWiring.from_links(range(n), WIRINGS[draw(st.sampled_from(list(WIRINGS)))](n))
        for i in range(n):
            healthy = draw(st.booleans()) or draw(st.booleans())
            gpus.append(Gpu(host, i, f"u-{h}-{i}", card, 1000.0, float(draw(st.sampled_from([0, 50, 500, 1000]))),
                            draw(st.sampled_from([0.0, 0.05, 0.3, 0.95, None])),
                            healthy=healthy, reasons=() if healthy else ("ecc",)))
    net = NetworkTiers.single_switch() if draw(st.booleans()) else NetworkTiers.from_groups(
        [("leaf0", 1, [f"h{i}" for i in range(0, n_hosts, 2)]), ("leaf1", 1, [f"h{i}" for i in range(1, n_hosts, 2)]),
         ("spine", 2, [f"h{i}" for i in range(n_hosts)])])
    cluster = build_cluster(gpus, wiring, net)
    keys = [g.key for g in gpus]
    reserved = {k: "job" for k in draw(st.lists(st.sampled_from(keys), max_size=len(keys), unique=True))}
    evicted = {k: ("xid-79",) for k in draw(st.lists(st.sampled_from(keys), max_size=3, unique=True))}
    request = PlanRequest(draw(st.integers(1, 12)), draw(st.sampled_from([None, "A100-SXM4-80GB", "RTX 4090",
                                                                          ("V100-SXM2-32GB", "RTX 4090")])),
                          gpu_memory_mib=draw(st.sampled_from([None, 100, 900])))
    return cluster, request, reserved, evicted


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_planner_only_hands_out_what_it_may(case):
    cluster, request, reserved, evicted = case
    result = plan(cluster, request, reserved=reserved, evicted=evicted)
    state = cluster_state(cluster, request, reserved, evicted)
    d = result.decision
    placed = [p for p in result.pools if p.stage == "scheduling"]
    if d is None:
        assert placed == []
        assert all(p.reason for p in result.pools)
        # nothing could have hosted it: no pool of an accepted type has k available GPUs
        for pool in cluster.pools:
            if not request.gpu_types or any(card_type_matches(pool.card_type, t) for t in request.gpu_types):
                assert int(state.available[pool.positions].sum()) < request.gpus
        return
    keys = [GpuKey(g.host, g.index) for g in d.gpus]
    assert len(keys) == request.gpus == len(set(keys))  # exactly k, no duplicate
    assert len(placed) == 1 and placed[0].pool == d.pool
    for key in keys:
        g = cluster.gpu(key)
        pos = cluster.position[key]
        assert g.healthy and key not in reserved and key not in evicted
        assert state.available[pos]
        assert cluster.pool_of_gpu(key).id == d.pool  # one pool: one card type
        if request.gpu_types:
            assert any(card_type_matches(g.name, t) for t in request.gpu_types)
    assert 0 < d.score.topology <= 1
