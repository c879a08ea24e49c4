"""Multi-node NVLink domains (GB200 NVL72): trays of one clique are NVLink-close, hosts that merely
share a clique id of 0 are not, a split rack keeps a job inside one partition; fabric health;
rank order along the network tree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_hetero_gpu.core.inventory import load_cluster
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.core.planner import plan
from airflow_hetero_gpu.core.topology import NVLINK_DOMAIN_DISTANCE, REGISTRY
from airflow_hetero_gpu.launch.remote import placements_from_decision
from airflow_hetero_gpu.testing.captures import write_capture_dir
from airflow_hetero_gpu.testing.demo import hgx_h100_hosts, nvl72_rack, small_hosts

FABRIC = Path(__file__).resolve().parent / "data" / "fabric"
RACK_UUID = "9c6f5af3-53bf-49b5-a436-b66766c413c3"
TOPOLOGY = """\
SwitchName=leaf1 Nodes=h100-a,h100-b
SwitchName=leaf2 Nodes=nvl72-t[00-08]
SwitchName=leaf3 Nodes=nvl72-t[09-17]
SwitchName=spine Switches=leaf[1-3]
"""
SPLIT = [1] * 9 + [2] * 9


def fleet(tmp_path, cliques=None, busy_trays=(), edit=None):
    rack = nvl72_rack(cliques=cliques)
    for tray in busy_trays:  # one GPU of the tray runs something
        rack[tray].gpus[0].utilization_gpu = 95
    if edit:
        edit(rack)
    specs = rack + hgx_h100_hosts(["h100-a", "h100-b"])
    return load_cluster(write_capture_dir(tmp_path, specs, topology_conf=TOPOLOGY))


def trays(decision) -> list[str]:
    return decision.hosts


def test_a_16_gpu_job_goes_to_four_trays_of_one_clique(tmp_path):
    cluster = fleet(tmp_path)
    assert cluster.nvlink_domains() == {f"{RACK_UUID}/1": [f"nvl72-t{t:02d}" for t in range(18)]}
    result = plan(cluster, PlanRequest(16))
    d = result.decision
    assert d.pool == "NVIDIA GB200" and trays(d) == ["nvl72-t00", "nvl72-t01", "nvl72-t02", "nvl72-t03"]
    assert d.mean_distance == NVLINK_DOMAIN_DISTANCE == 1  # NVLink-class: no network switch on the way
    hgx = next(p for p in result.pools if p.pool == "NVIDIA H100 80GB HBM3")
    # the two HGX hosts under one leaf: 28 NVSwitch pairs each at 1, 64 pairs across the leaf at 10
    assert hgx.mean_distance == pytest.approx((2 * 28 * 1 + 64 * 10) / 120)
    assert hgx.stage == "preselected" and "below NVIDIA GB200" in hgx.reason


def test_hgx_hosts_reporting_clique_0_are_not_one_domain(tmp_path):
    cluster = fleet(tmp_path)
    gpu = cluster.gpu(("h100-a", 0))
    assert (gpu.fabric.state, gpu.fabric.clique_id, gpu.fabric.domain) == ("Completed", 0, None)
    assert "h100-a" not in cluster.net.domain_of and "h100-b" not in cluster.net.domain_of
    assert cluster.distance(("h100-a", 0), ("h100-b", 0)) == 10
    assert cluster.distance(("nvl72-t00", 0), ("nvl72-t17", 3)) == NVLINK_DOMAIN_DISTANCE
    assert cluster.distance(("nvl72-t00", 0), ("h100-a", 0)) == 20  # spine


def test_a_partition_split_keeps_the_job_inside_one_partition(tmp_path):
    busy = range(6)  # trays 00-05 have one GPU busy: 3 free each
    whole = plan(fleet(tmp_path / "whole", busy_trays=busy), PlanRequest(16, "GB200")).decision
    assert trays(whole) == ["nvl72-t06", "nvl72-t07", "nvl72-t08", "nvl72-t09"]  # across the future split
    split_cluster = fleet(tmp_path / "split", cliques=SPLIT, busy_trays=busy)
    assert sorted(split_cluster.nvlink_domains()) == [f"{RACK_UUID}/1", f"{RACK_UUID}/2"]
    split = plan(split_cluster, PlanRequest(16, "GB200")).decision
    # partition 1 (trays 00-08) cannot give 16 GPUs on 4 trays any more (4+4+4+3): partition 2 does
    assert trays(split) == ["nvl72-t09", "nvl72-t10", "nvl72-t11", "nvl72-t12"]
    assert split.mean_distance == 1.0
    assert split_cluster.distance(("nvl72-t08", 0), ("nvl72-t09", 0)) == 20  # leaf2 -> spine -> leaf3


def test_when_no_partition_can_hold_the_job_it_spans_partitions_under_a_leaf(tmp_path):
    six = [t // 3 + 1 for t in range(18)]  # six partitions of 3 trays (12 GPUs each)
    cluster = fleet(tmp_path, cliques=six)
    d = plan(cluster, PlanRequest(16, "GB200")).decision
    assert trays(d) == ["nvl72-t00", "nvl72-t01", "nvl72-t02", "nvl72-t03"]  # under leaf2
    # 3 trays of partition 1 (12 GPUs, 66 pairs at 1), tray 03 of partition 2 (6 pairs at 1, 4 x 12 at 10)
    assert d.mean_distance == pytest.approx((66 * 1 + 6 * 1 + 48 * 10) / 120)


def test_topology_caching_by_content_survives_domains(tmp_path):
    whole = fleet(tmp_path / "a")
    size = len(REGISTRY.matrices)
    split = fleet(tmp_path / "b", cliques=SPLIT)
    assert len(REGISTRY.matrices) == size  # the trays' wiring is interned once, domains or not
    assert whole.matrix_id["nvl72-t00"] == split.matrix_id["nvl72-t17"] == whole.matrix_id["nvl72-t17"]
    assert whole.distance(("nvl72-t00", 0), ("nvl72-t17", 0)) == 1
    assert split.distance(("nvl72-t00", 0), ("nvl72-t17", 0)) == 20


def _q_excerpt(name: str) -> dict:
    """A real ``-q`` Fabric block as the GPU state's fabric (``Key : Value`` lines)."""
    values = {}
    for line in (FABRIC / name).read_text().splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip()] = value.strip()
    return {"state": values["State"], "status": values["Status"], "clique_id": int(values["CliqueId"]),
            "cluster_uuid": values["ClusterUUID"], "health_summary": values.get("Summary"),
            "bandwidth": values.get("Bandwidth")}


@pytest.mark.parametrize("fabric, reasons, domain", [
    (_q_excerpt("q-fabric-gb200-clique2-health-unhealthy.txt"), ("fabric-unhealthy",),
     "dc6e40c4-d722-4357-9ba6-5291dd461278/2"),
    (_q_excerpt("q-fabric-completed-insufficient-resources.txt"), ("fabric-error",), None),
    ({"state": "In Progress", "status": "N/A", "clique_id": 1, "cluster_uuid": RACK_UUID}, ("fabric-registering",), None),
    ({"state": "Completed", "status": "Success", "clique_id": 1, "cluster_uuid": RACK_UUID,
      "health_summary": "Healthy", "bandwidth": "Degraded"}, ("fabric-degraded",), f"{RACK_UUID}/1"),
    ({"state": "Completed", "status": "Success", "clique_id": 1, "cluster_uuid": RACK_UUID,
      "health_summary": "Healthy", "bandwidth": "Full"}, (), f"{RACK_UUID}/1"),
])
def test_fabric_health_of_a_tray_gpu(tmp_path, fabric, reasons, domain):
    def edit(rack):
        rack[5].gpus[2].fabric = fabric

    cluster = fleet(tmp_path, edit=edit)
    gpu = cluster.gpu(("nvl72-t05", 2))
    assert (gpu.reasons, gpu.nvlink_domain) == (reasons, domain)
    if reasons:  # never placed: a 16-GPU job on the rack avoids the tray's sick GPU
        d = plan(cluster, PlanRequest(4 * 18 - 1, "GB200")).decision
        assert d is not None and ("nvl72-t05", 2) not in d.keys


def test_an_hgx_fabric_error_does_not_make_an_h100_unhealthy(tmp_path):
    specs = hgx_h100_hosts(["h100-a"])
    specs[0].gpus[0].fabric = dict(specs[0].gpus[0].fabric, status="Insufficient Resources")
    cluster = load_cluster(write_capture_dir(tmp_path, specs))
    assert cluster.gpu(("h100-a", 0)).reasons == ()  # single-host NVSwitch: not a multi-node platform


# --- rank order along the network tree --------------------------------------------------------------
def _two_leaf_fleet(tmp_path, names, conf):
    hosts = small_hosts(len(names), gpus=2)
    for spec, name in zip(hosts, names):
        spec.name = name
    return write_capture_dir(tmp_path, hosts, topology_conf=conf)


@pytest.mark.parametrize("names, conf, ranks", [
    (["a1", "b1", "a2", "b2"], "SwitchName=la Nodes=a1,a2\nSwitchName=lb Nodes=b1,b2\nSwitchName=spine Switches=la,lb\n",
     ["a1", "a2", "b1", "b2"]),
    # names that interleave the leaves: name order would alternate leaves at every rank
    (["n1", "n2", "n3", "n4"], "SwitchName=la Nodes=n1,n3\nSwitchName=lb Nodes=n2,n4\nSwitchName=spine Switches=la,lb\n",
     ["n1", "n3", "n2", "n4"]),
    # a deeper tree: two pods of two leaves; ranks walk pod by pod, leaf by leaf
    (["h1", "h2", "h3", "h4"], "SwitchName=l1 Nodes=h1\nSwitchName=l2 Nodes=h4\nSwitchName=l3 Nodes=h2\n"
     "SwitchName=l4 Nodes=h3\nSwitchName=p1 Switches=l1,l2\nSwitchName=p2 Switches=l3,l4\nSwitchName=top Switches=p1,p2\n",
     ["h1", "h4", "h2", "h3"]),
])
def test_node_ranks_follow_the_network_tree(tmp_path, names, conf, ranks):
    root = _two_leaf_fleet(tmp_path, names, conf)
    d = plan(load_cluster(root), PlanRequest(8)).decision
    assert d.hosts == ranks
    assert [g.host for g in d.gpus] == [h for h in ranks for _ in range(2)]
    targets = {h: h for h in names}
    assert [host for host, _ in placements_from_decision(d, targets)] == ranks  # node rank = position
    r = subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", "plan", "--captures", str(root),
                        "--gpus", "8", "--json"], capture_output=True, text=True, timeout=60)
    decision = json.loads(r.stdout)["decision"]
    assert decision["hosts"] == ranks and [g["host"] for g in decision["gpus"]][::2] == ranks


def test_trays_of_one_clique_rank_before_the_next_clique(tmp_path):
    # 6 partitions of 3 trays; 16 GPUs span partitions 1 and 2: their trays come clique by clique
    cluster = fleet(tmp_path, cliques=[t // 3 + 1 for t in range(18)])
    d = plan(cluster, PlanRequest(16, "GB200")).decision
    domains = [cluster.net.domain_of[h] for h in d.hosts]
    assert domains == sorted(domains) and len(set(domains)) == 2
    assert all(GpuKey(*k).instance is None for k in d.keys)
