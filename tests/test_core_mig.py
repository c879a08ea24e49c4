"""Planning with MIG: a MIG-enabled GPU is never handed out whole; its instances are 1-GPU units
of their own card type; unknown utilization is not idle; a pending mode change holds a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from airflow_hetero_gpu.core.inventory import load_cluster
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.core.planner import plan, replacement
from airflow_hetero_gpu.errors import RequestError
from airflow_hetero_gpu.testing.captures import write_capture_dir
from airflow_hetero_gpu.testing.demo import enable_mig
from plan_fixtures import A100, TOPOLOGY_CONF, hosts

MIG_1G = f"{A100} MIG 1g.10gb"
MIG_3G = f"{A100} MIG 3g.40gb"


def mig_fleet(tmp_path, *, busy_a100_2: bool = False, **edit):
    """plan_fixtures' five hosts; a100-1 GPU0 has MIG on (3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb)."""
    specs = hosts(loads={"a100-2": {i: 0.95 for i in range(8)}} if busy_a100_2 else None)
    a100_1 = specs[0]
    gpu = enable_mig(a100_1, 0)
    for key, value in edit.items():
        if key == "processes_on":  # a compute process on MIG device N
            gpu.mig_devices[value]["processes"] = [{"pid": 4242, "name": "python3", "memory_mib": 900}]
            gpu.mig_devices[value]["memory_used_mib"] = 900
        else:
            setattr(gpu, key, value)
    return load_cluster(write_capture_dir(tmp_path, specs, topology_conf=TOPOLOGY_CONF))


def whole(key) -> bool:
    return GpuKey(*key).instance is None


@pytest.mark.parametrize("k", [1, 2, 7, 8])
def test_a_mig_enabled_a100_is_never_handed_out_whole(tmp_path, k):
    cluster = mig_fleet(tmp_path)
    for request in (PlanRequest(k, "A100-SXM4-80GB"), PlanRequest(k, "A100*"), PlanRequest(k)):
        d = plan(cluster, request).decision
        assert d is not None and len(d.gpus) == k
        assert ("a100-1", 0) not in d.keys and all(g.instance is None for g in d.gpus)
    # an 8-GPU A100 job: a100-1 has 7 GPUs to give, so the job takes a100-2 (idle), not a100-1
    d = plan(cluster, PlanRequest(8, "A100-SXM4-80GB")).decision
    assert d.hosts == ["a100-2"]


def test_with_a100_2_busy_an_8_gpu_job_cannot_use_the_mig_gpu(tmp_path):
    cluster = mig_fleet(tmp_path, busy_a100_2=True)
    result = plan(cluster, PlanRequest(8, "A100-SXM4-80GB"))
    assert result.decision is None
    report = next(p for p in result.pools if p.pool == A100)
    assert report.available == 7
    assert report.reason == ("needs 8 available, has 7: 1 not handed out whole (a100-1 GPU0 mig-enabled); "
                             "8 busy (load > 0.1)")


def test_a_one_gpu_job_for_the_mig_type_gets_an_instance(tmp_path):
    cluster = mig_fleet(tmp_path)
    d = plan(cluster, PlanRequest(1, MIG_1G)).decision
    assert d.pool == MIG_1G and [g.key for g in d.gpus] == [("a100-1", 0, 2)]
    ref = d.to_json()["gpus"][0]
    assert ref["instance"] == 2 and ref["uuid"].startswith("MIG-") and ref["name"] == MIG_1G
    assert d.gpus[0].cuda_device == ref["uuid"]
    # a pattern naming MIG takes slices too; without "MIG" it never does
    assert plan(cluster, PlanRequest(1, "A100*MIG 3g*")).decision.gpus[0].key == ("a100-1", 0, 0)
    assert plan(cluster, PlanRequest(1, "A100*")).decision.gpus[0].instance is None


@pytest.mark.parametrize("gpu_type", [MIG_1G, "A100-SXM4-80GB MIG 1g.10gb", "*MIG*"])
def test_more_than_one_mig_instance_is_a_user_mistake(tmp_path, gpu_type):
    cluster = mig_fleet(tmp_path)
    with pytest.raises(RequestError, match="MIG instances, which serve 1-GPU jobs only"):
        plan(cluster, PlanRequest(2, gpu_type))


def test_mig_pools_say_why_they_are_passed_over(tmp_path):
    cluster = mig_fleet(tmp_path)
    result = plan(cluster, PlanRequest(1))  # any card type: a whole GPU, never a slice
    mig_pools = [p for p in result.pools if "MIG" in p.pool]
    assert len(mig_pools) == 3 and result.decision.gpus[0].instance is None
    assert {(p.stage, p.reason) for p in mig_pools} == {
        ("rejected", "MIG instances go only to requests that name a MIG card type")}
    # whole A100s or 1g slices, 2 GPUs: the A100 pool can, the slices cannot
    result = plan(cluster, PlanRequest(2, ("A100-SXM4-80GB", "*MIG 1g.10gb")))
    assert result.decision.pool == A100
    assert next(p for p in result.pools if p.pool == MIG_1G).reason == (
        "MIG instances serve 1-GPU jobs only, the job asks for 2")


def test_an_instance_in_use_or_reserved_is_not_available(tmp_path):
    cluster = mig_fleet(tmp_path, processes_on=2)  # a process on 1g.10gb device 2
    d = plan(cluster, PlanRequest(1, MIG_1G)).decision
    assert [g.key for g in d.gpus] == [("a100-1", 0, 3)]
    # device 3 reserved by a job as well: no 1g.10gb left
    result = plan(cluster, PlanRequest(1, MIG_1G), reserved={GpuKey("a100-1", 0, 3): "job-a"})
    assert result.decision is None
    report = next(p for p in result.pools if p.pool == MIG_1G)
    assert report.reason == "needs 1 available, has 0: 1 reserved (by job-a); 1 busy (load > 0.1)"
    # two jobs on two instances of one GPU at once
    both = {GpuKey("a100-1", 0, 0): "job-b", GpuKey("a100-1", 0, 1): "job-c"}
    assert plan(cluster, PlanRequest(1, MIG_1G), reserved=both).decision.gpus[0].key == ("a100-1", 0, 3)


def test_an_eviction_or_whole_gpu_reservation_covers_the_instances(tmp_path):
    cluster = mig_fleet(tmp_path)
    result = plan(cluster, PlanRequest(1, MIG_1G), evicted={GpuKey("a100-1", 0): ("xid-79",)})
    assert result.decision is None
    assert result.unhealthy[0].key == GpuKey("a100-1", 0) and result.unhealthy[0].reasons == ("evicted:xid-79",)
    assert plan(cluster, PlanRequest(1, MIG_1G), reserved={("a100-1", 0): "old-job"}).decision is None
    # and an instance reservation of a GPU whose MIG mode is now off keeps the GPU itself out
    plain = load_cluster(write_capture_dir(tmp_path / "plain", hosts(), topology_conf=TOPOLOGY_CONF))
    d = plan(plain, PlanRequest(8, "A100-SXM4-80GB"), reserved={GpuKey("a100-2", 5, 1): "mig-job"}).decision
    assert d.hosts == ["a100-1"]


def test_a_pending_mode_change_holds_the_gpu_and_its_instances(tmp_path):
    cluster = mig_fleet(tmp_path, mig_pending="Disabled")
    assert cluster.gpu(("a100-1", 0)).unschedulable == ("mig-enabled", "mig-mode-change-pending")
    result = plan(cluster, PlanRequest(1, MIG_1G))
    assert result.decision is None
    report = next(p for p in result.pools if p.pool == MIG_1G)
    assert report.reason == ("needs 1 available, has 0: 2 unschedulable (a100-1 GPU0 MIG 2 mig-mode-change-pending, "
                             "a100-1 GPU0 MIG 3 mig-mode-change-pending)")
    # a GPU about to turn MIG on is held too
    specs = hosts()
    specs[1].gpus[4].mig_mode, specs[1].gpus[4].mig_pending = "Disabled", "Enabled"
    other = load_cluster(write_capture_dir(tmp_path / "pending", specs, topology_conf=TOPOLOGY_CONF))
    assert other.gpu(("a100-2", 4)).unschedulable == ("mig-mode-change-pending",)
    result = plan(other, PlanRequest(8, "A100-SXM4-80GB"), reserved={GpuKey("a100-1", i): "x" for i in range(8)})
    assert result.decision is None
    assert next(p for p in result.pools if p.pool == A100).reason == (
        "needs 8 available, has 7: 8 reserved (by x×8); 1 unschedulable (a100-2 GPU4 mig-mode-change-pending)")


def test_replacement_of_an_instance_is_another_instance_of_its_pool(tmp_path):
    cluster = mig_fleet(tmp_path)
    bad = GpuKey("a100-1", 0, 2)
    assert replacement(cluster, [bad], bad, reserved={bad: "job"}) == GpuKey("a100-1", 0, 3)


# --- unknown utilization ------------------------------------------------------------------------
@pytest.mark.parametrize("yaml, available, host", [(None, 15, "a100-2"),
                                                   ("thresholds:\n  unknown_utilization: 0\n", 16, "a100-1")])
def test_unknown_utilization_is_not_idle(tmp_path, yaml, available, host):
    specs = hosts()
    specs[0].gpus[3].utilization_gpu = None  # [N/A], MIG or not
    cluster = load_cluster(write_capture_dir(tmp_path, specs, topology_conf=TOPOLOGY_CONF, cluster_yaml=yaml))
    assert cluster.gpu(("a100-1", 3)).utilization is None
    result = plan(cluster, PlanRequest(8, "A100-SXM4-80GB"))
    assert next(p for p in result.pools if p.pool == A100).available == available
    assert result.decision.hosts == [host]  # by default a100-1 GPU3 counts busy: a100-1 cannot take 8


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", *args], capture_output=True, text=True,
                          timeout=60)


def test_cli_plans_an_instance_and_refuses_two(tmp_path):
    specs = hosts()
    enable_mig(specs[0], 0)
    root = write_capture_dir(tmp_path, specs, topology_conf=TOPOLOGY_CONF)
    r = cli("plan", "--captures", str(root), "--gpus", "1", "--gpu-type", MIG_3G, "--json")
    assert r.returncode == 0, r.stderr
    gpu = json.loads(r.stdout)["decision"]["gpus"][0]
    assert (gpu["host"], gpu["index"], gpu["instance"], gpu["uuid"][:4]) == ("a100-1", 0, 0, "MIG-")
    r = cli("plan", "--captures", str(root), "--gpus", "2", "--gpu-type", MIG_3G)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "serve 1-GPU jobs only" in r.stderr
    inventory = json.loads(cli("inventory", "--captures", str(root), "--json").stdout)
    under = [g for g in inventory if g["host"] == "a100-1" and g["index"] == 0]
    assert [(g["instance"], g["name"][-11:]) for g in under] == [
        (None, "A100-SXM4-80GB"[-11:]), (0, "MIG 3g.40gb"), (1, "MIG 2g.20gb"), (2, "MIG 1g.10gb"), (3, "MIG 1g.10gb")]
    assert under[0]["mig"] == {"mode": "Enabled", "pending": "Enabled"} and under[0]["unschedulable"] == ["mig-enabled"]
    assert under[1]["mig"]["gpu_uuid"] == under[0]["uuid"]


def test_the_health_watch_judges_the_gpu_and_its_instances_follow(tmp_path):
    from airflow_hetero_gpu.capture.directory import read_capture_dir
    from airflow_hetero_gpu.core.config import ClusterConfig
    from airflow_hetero_gpu.core.watch import evaluate

    specs = hosts()
    enable_mig(specs[0], 0).ecc_uncorrected_volatile = 2
    captures = read_capture_dir(write_capture_dir(tmp_path, specs, topology_conf=TOPOLOGY_CONF))
    ev = evaluate(captures, ClusterConfig())
    observed = [o.key for o in ev.observations]
    assert GpuKey("a100-1", 0) in observed and all(GpuKey(*k).instance is None for k in observed)
    assert len(observed) == 32  # the 32 physical GPUs, no instance
    assert [g.reasons for g in ev.cluster.gpus if g.host == "a100-1" and g.index == 0] == [("ecc",)] * 5


def _lookups(cluster, keys) -> list[int]:
    return [p if (p := cluster.position.get(k) if isinstance(k, tuple) else None) is not None else -1 for k in keys]


def test_a_keys_position_by_arithmetic_is_the_position_lookups(tmp_path):
    """``Cluster.positions_of`` finds a whole-GPU fleet's positions by arithmetic (host's first
    position + index): the same answer as the lookup of each key, -1 for what the fleet does not
    list (unknown host, index out of range or negative, a MIG instance's key, an index that is not
    an integer); a fleet with MIG instances looks each key up."""
    whole_fleet = load_cluster(write_capture_dir(tmp_path / "whole", hosts(), topology_conf=TOPOLOGY_CONF))
    assert whole_fleet.host_ids is not None
    keys = list(whole_fleet.keys)
    keys += [GpuKey("no-such-host", 0), GpuKey(keys[0].host, 99), GpuKey(keys[0].host, -1), GpuKey(keys[0].host, 0, 1),
             (keys[3].host, keys[3].index), (keys[-1].host, 8), (keys[1].host, True)]
    got = whole_fleet.positions_of(keys).tolist()
    assert got == _lookups(whole_fleet, keys)
    assert got[:len(whole_fleet.keys)] == list(range(len(whole_fleet.keys)))
    assert got[len(whole_fleet.keys):] == [-1, -1, -1, -1, 3, -1, 1]
    assert whole_fleet.positions_of([(keys[0].host, "0")]).tolist() == [-1]  # not an integer: looked up
    assert whole_fleet.positions_of([]).tolist() == []

    mig = mig_fleet(tmp_path / "mig")
    assert mig.host_ids is None
    keys = list(mig.keys) + [GpuKey("no-such-host", 0), GpuKey(mig.keys[0].host, 0, 99)]
    assert mig.positions_of(keys).tolist() == _lookups(mig, keys) == list(range(len(mig.keys))) + [-1, -1]
