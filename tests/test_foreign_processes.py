"""GPUs used outside the scheduler, from the real outputs of an H200 (driver 580.159.04): the
compute-apps listing and ``ps`` read, the planner's decision, its reason, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_hetero_gpu.capture.apps import parse_apps_csv, parse_procs
from airflow_hetero_gpu.capture.directory import parse_host, read_capture_dir
from airflow_hetero_gpu.core.config import config_from_mapping
from airflow_hetero_gpu.core.inventory import cluster_from_captures
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.core.occupancy import fleet_state, gpu_states, pool_counts
from airflow_hetero_gpu.core.planner import plan
from airflow_hetero_gpu.capture.directory import CaptureSet
from airflow_hetero_gpu.errors import CaptureError
from airflow_hetero_gpu.testing.nvsmi.apps import query_compute_apps

DATA = Path(__file__).parent / "data" / "nvidia-smi" / "h200-device"
TWO_GPU_UUID = "GPU-6e841afe-c5b7-9589-9c35-35532d81dc85"  # the GPU of the two-processes listing


def _idle_query() -> str:
    """The idle H200's query (0 % utilization, 0 MiB used), its UUID that of the GPU whose
    compute-apps listing holds the two processes (same model, another lending of the machine)."""
    text = (DATA / "query-allfields-h200-idle.csv").read_text()
    old = text.splitlines()[1].split(", ")[1]
    return text.replace(old, TWO_GPU_UUID)


def _files(**extra: str) -> dict[str, str]:
    return {"query.csv": _idle_query(), "topo.txt": (DATA / "topo-h200-1gpu-vm.txt").read_text(), **extra}


def _cluster(files: dict[str, str], config=None):
    caps = CaptureSet(root=None, hosts={"h200": parse_host("h200", files, "h200")})
    return cluster_from_captures(caps, config)


def test_the_real_listing_and_ps_output_parse():
    apps = parse_apps_csv((DATA / "compute-apps-two-processes.csv").read_text(), "apps.csv")
    assert [(a.gpu_uuid, a.pid, a.name, a.memory_mib) for a in apps] == [
        (TWO_GPU_UUID, 440, "python3", 866.0), (TWO_GPU_UUID, 439, "python3", 1386.0)]
    owners = parse_procs((DATA / "ps-owners-two-processes.txt").read_text(), "procs.txt")
    assert {p: (o.pgid, o.user) for p, o in owners.items()} == {439: (436, "root"), 440: (436, "nobody")}
    assert parse_apps_csv((DATA / "compute-apps-h200-none.csv").read_text().replace(
        "pid, process_name", "gpu_uuid, pid, process_name"), "apps.csv") == []


def test_a_gpu_with_someone_elses_process_is_not_placed_on_and_the_reason_names_who():
    files = _files(**{"apps.csv": (DATA / "compute-apps-two-processes.csv").read_text(),
                      "procs.txt": (DATA / "ps-owners-two-processes.txt").read_text()})
    cluster = _cluster(files)
    (gpu,) = cluster.gpus
    assert gpu.load() == 0.0  # 0 % and 0 MiB: the load alone would call it available
    result = plan(cluster, PlanRequest(1))
    assert result.decision is None
    (report,) = result.pools
    assert ("1 in use outside the scheduler (h200 GPU0 in use outside the scheduler: nobody, pid 440 python3, "
            "866 MiB; root, pid 439 python3, 1,386 MiB)") in report.reason
    state = fleet_state(cluster)
    assert gpu_states(state).tolist() == ["busy"] and pool_counts(cluster, state=state)[0].available == 0
    # a job holding the GPU: its own workers run there; the GPU stays reserved
    held = fleet_state(cluster, {GpuKey("h200", 0): "job-1"})
    assert gpu_states(held).tolist() == ["reserved"] and not held.outside.any()
    # sites that share GPUs on purpose
    ignore = config_from_mapping({"thresholds": {"foreign_processes": "ignore"}})
    placed = plan(_cluster(files, ignore), PlanRequest(1))
    assert placed.decision is not None and placed.decision.keys == [GpuKey("h200", 0)]


def test_the_header_alone_and_no_listing_leave_the_gpu_available():
    none = (DATA / "compute-apps-h200-none.csv").read_text().replace("pid, process_name", "gpu_uuid, pid, process_name")
    for files in (_files(**{"apps.csv": none, "procs.txt": ""}), _files()):
        assert plan(_cluster(files), PlanRequest(1)).decision is not None


@pytest.mark.parametrize("name, text, message", [
    ("apps.csv", (DATA / "compute-apps-h200-training.csv").read_text(),
     "h200/apps.csv:1: not a --query-compute-apps=gpu_uuid,pid,used_memory,process_name header"),
    ("apps.csv", "gpu_uuid, pid, used_gpu_memory [MiB], process_name\nGPU-1, x12, 5 MiB, python3\n",
     "h200/apps.csv:2: pid 'x12' is not a number"),
    ("apps.csv", "gpu_uuid, pid, used_gpu_memory [MiB], process_name\nGPU-1, 12, lots, python3\n",
     "h200/apps.csv:2: memory 'lots' is not a number of MiB"),
    ("procs.txt", "  439   436 root\nps: error: unsupported SysV option\n",
     "h200/procs.txt:2: expected 'PID PGID USER' (ps -o pid=,pgid=,user=), got 'ps: error: unsupported SysV option'"),
])
def test_an_unreadable_listing_is_one_line_naming_the_file_and_line(name, text, message):
    files = _files(**{"apps.csv": (DATA / "compute-apps-two-processes.csv").read_text(), name: text})
    with pytest.raises(CaptureError) as err:
        parse_host("h200", files, "h200")
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_emulated_listing_prints_what_the_580_driver_prints():
    host = {"gpus": [{"uuid": TWO_GPU_UUID, "processes": [{"pid": 440, "name": "python3", "memory_mib": 866},
                                                            {"pid": 439, "name": "python3", "memory_mib": 1386}]}]}
    fields = "gpu_uuid,pid,used_memory,process_name"
    assert query_compute_apps(host, fields, "csv") == ((DATA / "compute-apps-two-processes.csv").read_text(), 0)
    assert query_compute_apps(host, fields, "csv,noheader,nounits") == (
        (DATA / "compute-apps-two-processes-noheader-nounits.csv").read_text(), 0)
    empty = {"gpus": [{"uuid": TWO_GPU_UUID, "processes": []}]}
    assert query_compute_apps(empty, "pid,process_name,used_memory", "csv") == (
        (DATA / "compute-apps-h200-none.csv").read_text(), 0)


def test_a_capture_directory_reads_the_listing(tmp_path):
    host = tmp_path / "hosts" / "h200"
    host.mkdir(parents=True)
    for name, text in _files(**{"apps.csv": (DATA / "compute-apps-two-processes.csv").read_text(),
                               "procs.txt": (DATA / "ps-owners-two-processes.txt").read_text()}).items():
        (host / name).write_text(text)
    caps = read_capture_dir(tmp_path)
    assert [a.pid for a in caps.hosts["h200"].apps] == [440, 439]
    assert plan(cluster_from_captures(caps), PlanRequest(1)).decision is None


def test_a_mig_instance_is_judged_on_its_own(tmp_path):
    """a100-1 GPU0 has MIG on (3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb); alice's process runs on MIG
    device 2, placed there by the plain table's process list: device 2 is in use outside the
    scheduler, device 3 of the same profile is not."""
    from airflow_hetero_gpu.core.inventory import load_cluster
    from airflow_hetero_gpu.testing.captures import write_capture_dir
    from airflow_hetero_gpu.testing.demo import enable_mig
    from plan_fixtures import A100, TOPOLOGY_CONF, hosts

    specs = hosts()
    gpu = enable_mig(specs[0], 0)
    gpu.mig_devices[2]["processes"] = [{"pid": 4242, "name": "python3", "memory_mib": 900}]
    gpu.mig_devices[2]["memory_used_mib"] = 900
    root = write_capture_dir(tmp_path, specs, topology_conf=TOPOLOGY_CONF)
    state = specs[0].to_state()
    host = root / "hosts" / specs[0].name
    (host / "apps.csv").write_text(query_compute_apps(state, "gpu_uuid,pid,used_memory,process_name", "csv")[0])
    (host / "procs.txt").write_text("   4242    4200 alice\n")
    cluster = load_cluster(root)
    outside = {g.key: g.outside for g in cluster.gpus if g.outside}
    assert list(outside) == [GpuKey("a100-1", 0, 2)]
    result = plan(cluster, PlanRequest(1, f"{A100} MIG 1g.10gb"))
    assert result.decision.keys == [GpuKey("a100-1", 0, 3)]
    busy = plan(cluster, PlanRequest(1, f"{A100} MIG 1g.10gb"), reserved={GpuKey("a100-1", 0, 3): "job-a"})
    (report,) = [p for p in busy.pools if p.pool == f"{A100} MIG 1g.10gb"]
    assert report.reason == ("needs 1 available, has 0: 1 reserved (by job-a); 1 in use outside the scheduler "
                             "(a100-1 GPU0 MIG 2 in use outside the scheduler: alice, pid 4242 python3, 900 MiB)")
