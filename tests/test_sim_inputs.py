"""Reading traces and node lists: the job CSV, Alibaba pod lists, arrival compression, host
wirings by GPU model, racks; every bad input is one HeteroGpuError naming file, column, value."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.sim.fleet import Node, build_fleet, read_nodes
from airflow_hetero_gpu.sim.sources import load_trace, resolve_nodes
from airflow_hetero_gpu.sim.trace import (
    Job, Trace, compress, fill_missing_times, offered_load, read_alibaba, read_jobs_csv, time_scale_for_load,
)

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# --- the job CSV ------------------------------------------------------------------------------
def test_job_csv(tmp_path):
    p = _write(tmp_path, "jobs.csv", "job_id,arrival_s,duration_s,gpus,gpu_type\n"
                                     "b,5,10,2,\nа,0,0.5,1,V100M16|V100M32\n")
    t = read_jobs_csv(p)
    assert [(j.id, j.arrival, j.duration, j.gpus, j.gpu_types) for j in t.jobs] == [
        ("а", 0.0, 1.0, 1, ("V100M16", "V100M32")),  # sorted by arrival; run time at least 1 s
        ("b", 5.0, 10.0, 2, ()),
    ]
    assert [j.priority for j in t.jobs] == [0, 0]
    p = _write(tmp_path, "prio.csv", "job_id,arrival_s,duration_s,gpus,priority\na,0,1,1,3\nb,0,1,1,\nc,0,1,1,-2\n")
    assert [(j.id, j.priority) for j in read_jobs_csv(p).jobs] == [("a", 3), ("b", 0), ("c", -2)]


@pytest.mark.parametrize("text,message", [
    ("job_id,arrival_s,gpus\nj,0,1\n", "jobs.csv:1: missing column 'duration_s'"),
    ("job_id,arrival_s,duration_s,gpus\nj,0,5,two\n", "jobs.csv:2: column 'gpus': expected a number, got 'two'"),
    ("job_id,arrival_s,duration_s,gpus\nj,0,5,0\n", "jobs.csv:2: column 'gpus': must be at least 1, got '0'"),
    ("job_id,arrival_s,duration_s,gpus\nj,0,5,1.5\n", "jobs.csv:2: column 'gpus': expected a whole number, got '1.5'"),
    ("job_id,arrival_s,duration_s,gpus\nj,-1,5,1\n", "jobs.csv:2: column 'arrival_s': must be at least 0, got '-1'"),
    ("job_id,arrival_s,duration_s,gpus\nj,0,nan,1\n", "jobs.csv:2: column 'duration_s': expected a finite number"),
    ("job_id,arrival_s,duration_s,gpus\nj,0,1,1\nj,0,1,1\n", "jobs.csv:3: column 'job_id': duplicate of line 2"),
    ("job_id,arrival_s,duration_s,gpus\n", "jobs.csv: no jobs"),
    ("", "jobs.csv: empty file"),
    ("job_id,arrival_s,duration_s,gpus\nj,0,1,1,extra\n", "jobs.csv:2: more fields than the header's 4"),
    ("job_id,arrival_s,duration_s,gpus,priority\nj,0,1,1,high\n", "jobs.csv:2: column 'priority': expected a number, got 'high'"),
    ("job_id,arrival_s,duration_s,gpus,priority\nj,0,1,1,0.5\n", "jobs.csv:2: column 'priority': expected a whole number"),
])
def test_job_csv_errors(tmp_path, text, message):
    with pytest.raises(HeteroGpuError) as err:
        read_jobs_csv(_write(tmp_path, "jobs.csv", text))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


# --- Alibaba pod lists ------------------------------------------------------------------------
PODS = POD_HEADER + (
    "p0,1000,1000,1,1000,,LS,Running,100,400,110\n"  # whole GPU: arrival 100, run 290
    "p1,1000,1000,1,460,,BE,Running,200,300,200\n"  # a GPU share
    "p2,1000,1000,0,0,,BE,Running,250,260,250\n"  # CPU only
    "p3,1000,1000,8,1000,G2|G2|T4,LS,Failed,300,1300,300\n"  # 8 GPUs of G2 or T4, run 1000
    "p4,1000,1000,2,1000,,LS,Pending,350,,\n"  # never scheduled: run time drawn
)


@pytest.mark.parametrize("mode,ids,counts", [
    ("round-up", ["p0", "p1", "p3", "p4"], {"cpu_only": 1, "fractional_rounded_up": 1, "fractional_dropped": 0}),
    ("drop", ["p0", "p3", "p4"], {"cpu_only": 1, "fractional_rounded_up": 0, "fractional_dropped": 1}),
])
def test_alibaba_pods(tmp_path, mode, ids, counts):
    t = read_alibaba(_write(tmp_path, "openb_pod_list_x.csv", PODS), fractional=mode)
    assert [j.id for j in t.jobs] == ids
    by_id = {j.id: j for j in t.jobs}
    assert (by_id["p0"].arrival, by_id["p0"].duration, by_id["p0"].gpus) == (100, 290, 1)
    assert (by_id["p3"].gpus, by_id["p3"].gpu_types, by_id["p3"].duration) == (8, ("G2", "T4"), 1000)
    assert by_id["p4"].arrival == 350 and not by_id["p4"].timed
    # p4 has 2 GPUs; fewer than 5 timed 2-GPU jobs, so its run time is one of all timed jobs'
    assert by_id["p4"].duration in {290, 100, 1000}
    assert {k: t.counts[k] for k in counts} == counts


def test_alibaba_list_without_times_takes_them_from_the_default_list(tmp_path):
    _write(tmp_path, "openb_pod_list_default.csv", PODS)
    p = _write(tmp_path, "openb_pod_list_multigpu50.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
               "p0,1,1,1,1000\np3,1,1,8,1000\nnew,1,1,4,1000\n")
    t = read_alibaba(p, seed=1)
    by_id = {j.id: j for j in t.jobs}
    assert (by_id["p0"].arrival, by_id["p0"].duration) == (100, 290)
    assert (by_id["p3"].arrival, by_id["p3"].duration) == (300, 1000)
    assert by_id["new"].arrival in {100, 300} and not by_id["new"].timed  # drawn from timed jobs
    again = read_alibaba(p, seed=1)
    assert [(j.id, j.arrival, j.duration) for j in again.jobs] == [(j.id, j.arrival, j.duration) for j in t.jobs]
    assert t.counts["arrival_drawn"] == 1 and "times taken by pod name" in t.notes[0]


@pytest.mark.parametrize("row,message", [
    ("q,1,1,x,1000,,LS,Running,1,2,1", "column 'num_gpu': expected a number, got 'x'"),
    ("q,1,1,1,1500,,LS,Running,1,2,1", "column 'gpu_milli': must be at most 1000"),
    ("q,1,1,2,500,,LS,Running,1,2,1", "column 'gpu_milli': a multi-GPU pod must ask for whole GPUs"),
    ("q,1,1,1,1000,,LS,Running,5,2,5", "column 'deletion_time': before scheduled_time 5"),
    ("q,1,1,1,1000,,LS,Running,,2,1", "column 'creation_time': empty value"),
])
def test_alibaba_errors(tmp_path, row, message):
    p = _write(tmp_path, "pods.csv", POD_HEADER + row + "\n")
    with pytest.raises(HeteroGpuError) as err:
        read_alibaba(p)
    assert f"pods.csv:2: {message}" in str(err.value)


def test_fill_missing_times_draws_from_same_gpu_count_when_there_are_five():
    timed = [Job(f"t{i}", float(i), 100.0 + i, 2) for i in range(5)] + [Job("one", 9.0, 7.0, 1)]
    untimed = Job("u", math.nan, math.nan, 2, timed=False)
    jobs, drew_a, drew_d = fill_missing_times([*timed, untimed], random.Random(0))
    u = jobs[-1]
    assert u.duration in {100.0, 101.0, 102.0, 103.0, 104.0} and u.arrival in {0, 1, 2, 3, 4, 9}
    assert (drew_a, drew_d) == (1, 1)


# --- compression to an offered load -------------------------------------------------------------
def test_offered_load_and_compression():
    # 3 jobs arriving at 0, 50, 100 on a 10-GPU cluster; window (1st..99th pct) = 0..100
    jobs = [Job("a", 0, 40, 2), Job("b", 50, 500, 1), Job("c", 100, 10, 4)]
    # scale 1: window 100 s; work 2*40 + 1*min(500,100) + 4*10 = 220 -> 220 / (10 * 100)
    assert offered_load(jobs, 10, 1.0) == pytest.approx(0.22)
    # scale 2: window 50 s; work 80 + 50 + 40 = 170 -> 170 / 500
    assert offered_load(jobs, 10, 2.0) == pytest.approx(0.34)
    scale = time_scale_for_load(jobs, 10, 0.34)
    assert scale == pytest.approx(2.0, rel=1e-6)
    t = compress(Trace(jobs, "x"), 2.0)
    assert [j.arrival for j in t.jobs] == [0, 25, 50]
    assert [j.duration for j in t.jobs] == [40, 500, 10]


# --- node lists and wirings ------------------------------------------------------------------
@pytest.mark.parametrize("model,gpus,layout,pairs", [
    # (pair, distance): SPEC §5 weights, shortest paths
    ("V100M32", 8, "DGX-1 V100 hybrid cube mesh", {(0, 1): 1, (0, 5): 2, (0, 4): 1, (5, 6): 1}),
    ("V100M16", 4, "DGX-1 NVLink quad (GPUs 0-3)", {(0, 1): 1, (0, 3): 1, (2, 3): 1}),
    ("G2", 8, "NVSwitch, all pairs NV12 (DGX A100)", {(0, 7): 1, (3, 4): 1}),
    ("G3", 8, "PCIe, PIX quads joined by PHB (8 x P100)", {(0, 3): 2, (0, 4): 4, (5, 7): 2}),
    ("T4", 4, "PCIe, NODE pairs, SYS across (4-GPU server)", {(0, 1): 5, (0, 2): 6, (2, 3): 5}),
    ("T4", 2, "PCIe, PHB (2-GPU box)", {(0, 1): 4}),
    ("P100", 2, "PCIe, PHB (2-GPU box)", {(0, 1): 4}),
    ("A10", 1, "single GPU", {}),
    ("X", 3, "PCIe, every pair PHB", {(0, 2): 4}),
])
def test_host_wiring_by_model(model, gpus, layout, pairs):
    fleet = build_fleet([Node("h", gpus, model)])
    assert fleet.layouts["h"] == layout
    for (i, j), d in pairs.items():
        assert fleet.cluster.distance(("h", i), ("h", j)) == d


def test_racks():
    nodes = [Node(f"n{i}", 1, "A10") for i in range(6)]
    c = build_fleet(nodes, hosts_per_leaf=2, leaves_per_spine=2).cluster
    # leaves {n0,n1} {n2,n3} {n4,n5}; spines {leaf0, leaf1} {leaf2}; one core
    assert [c.distance(("n0", 0), (h, 0)) for h in ("n1", "n2", "n3", "n4", "n5")] == [10, 20, 20, 30, 30]


def test_node_list(tmp_path):
    _write(tmp_path, "box.txt", "\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n")
    p = _write(tmp_path, "nodes.csv", "sn,cpu_milli,memory_mib,gpu,model,topo\n"
                                      "cpu,1,1,0,,\nn1,1,1,2,T4,box.txt\nn2,1,1,2,T4,\n")
    nodes = read_nodes(p)
    assert [(n.name, n.gpus, n.model) for n in nodes] == [("n1", 2, "T4"), ("n2", 2, "T4")]
    fleet = build_fleet(nodes)
    assert fleet.cluster.distance(("n1", 0), ("n1", 1)) == 1  # from its topo file
    assert fleet.cluster.distance(("n2", 0), ("n2", 1)) == 4


@pytest.mark.parametrize("text,message", [
    ("sn,gpu\nn,1\n", "nodes.csv:1: missing column 'model'"),
    ("sn,gpu,model\nn,x,T4\n", "nodes.csv:2: column 'gpu': expected a number, got 'x'"),
    ("sn,gpu,model\nn,2,\n", "nodes.csv:2: column 'model': empty value"),
    ("sn,gpu,model\nn,2,T4\nn,2,T4\n", "nodes.csv:3: column 'sn': duplicate host of line 2"),
    ("sn,gpu,model\nn,0,\n", "nodes.csv: no host with a GPU"),
    ("sn,gpu,model,topo\nn,2,T4,missing.txt\n", "nodes.csv:2: column 'topo': no such file"),
])
def test_node_list_errors(tmp_path, text, message):
    with pytest.raises(HeteroGpuError) as err:
        read_nodes(_write(tmp_path, "nodes.csv", text))
    assert message in str(err.value)


# --- trace sources -------------------------------------------------------------------------------
def test_sources(tmp_path, monkeypatch):
    d = tmp_path / "ali"
    d.mkdir()
    _write(d, "openb_pod_list_tiny.csv", PODS)
    _write(d, "openb_node_list_gpu_node.csv", "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,8,G2\n")
    monkeypatch.setenv("HETERO_GPU_ALIBABA_DIR", str(d))
    assert [j.id for j in load_trace("alibaba:tiny").jobs] == ["p0", "p1", "p3", "p4"]
    assert resolve_nodes(None, "alibaba:tiny") == d / "openb_node_list_gpu_node.csv"
    with pytest.raises(HeteroGpuError, match="alibaba:nope: no such pod list"):
        load_trace("alibaba:nope")
    other = _write(tmp_path, "other.csv", "a,b\n1,2\n")
    with pytest.raises(HeteroGpuError, match="not a trace: expected a job_id column"):
        load_trace(str(other))
    with pytest.raises(HeteroGpuError, match="--nodes: a node list"):
        resolve_nodes(None, str(other))
