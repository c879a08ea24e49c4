"""From emulated GPU hosts over real SSH to the planner's inventory, GPU for GPU, with faults."""

from __future__ import annotations

import time

from collect_helpers import (
    FLEET_UNHEALTHY,
    actual_inventory,
    expected_inventory,
    mixed_fleet,
    paramiko_factory,
)

from airflow_hetero_gpu.capture.directory import QUERY_FIELDS
from airflow_hetero_gpu.capture.query import OPTIONAL_FIELDS
from airflow_hetero_gpu.collect.ssh import collect_captures
from airflow_hetero_gpu.collect.targets import parse_hosts_arg
from airflow_hetero_gpu.core.inventory import load_cluster
from airflow_hetero_gpu.testing import nvsmi
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401

DRIVER_GONE = ("nvidia-smi exit 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
               "driver. Make sure that the latest NVIDIA driver is installed and running.")

#: What the collector asks nvidia-smi for: the SPEC fields plus the optional health fields.
COLLECTED_FIELDS = ",".join([QUERY_FIELDS, *OPTIONAL_FIELDS])


def collect(cluster, out, **kwargs):
    return collect_captures(parse_hosts_arg(cluster.hosts_arg()), out, paramiko_factory(cluster), **kwargs)


def test_inventory_of_eight_hosts_of_four_card_types_equals_their_state(emulated_cluster, tmp_path):
    cluster = emulated_cluster(mixed_fleet())
    out = tmp_path / "captures"
    report = collect(cluster, out, max_parallel=8, connect_timeout=5, command_timeout=10)
    assert [h.host for h in report.ok] == [h.name for h in cluster.hosts]
    inventory = load_cluster(out)
    assert inventory.host_errors == {}
    for host in cluster.hosts:
        assert actual_inventory(inventory, host.name) == expected_inventory(
            host.name, cluster.state(host.name), FLEET_UNHEALTHY), host.name
    assert len(inventory.gpus) == 56
    assert {g.name for g in inventory.gpus} == {
        "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB", "NVIDIA GeForce RTX 4090", "NVIDIA H200"}
    assert sorted(p.id for p in inventory.pools) == sorted({g.name for g in inventory.gpus})
    # The lost GPU's host warned about it; the others had nothing to say.
    assert report["a100-1"].warnings == [
        "nvidia-smi exit 255: Unable to determine the device handle for GPU 0000:BD:00.0: Unknown Error"]
    assert all(not h.warnings for h in report.hosts if h.host != "a100-1")


def test_faults_in_one_collection(emulated_cluster, tmp_path):
    """A stopped sshd, a changed host key, a hung nvidia-smi and a gone driver, all at once: the
    collection ends within its time budget, the healthy hosts are complete, every failed host
    says why, and the failed hosts' GPUs (known from the previous collection) are unreachable."""
    cluster = emulated_cluster(small_hosts(6, gpus=2))
    out = tmp_path / "captures"
    assert len(collect(cluster, out).ok) == 6
    cluster.inject_fault("node01", "host_down")
    cluster.inject_fault("node02", "host_key_changed")
    cluster.set_state("node03", nvidia_smi_delay_s=30)
    cluster.inject_fault("node04", "driver_gone")
    cluster.update_gpu("node05", 1, utilization_gpu=77, memory_used_mib=40000)

    # the command timeout well above what a loaded machine takes to run the emulated nvidia-smi
    # (a Python process per command: 1.5 s timed out the driver-gone host once), far below the
    # hung host's 30 s
    connect_timeout, command_timeout, retries = 2.0, 8.0, 1
    started = time.monotonic()
    report = collect(cluster, out, connect_timeout=connect_timeout, command_timeout=command_timeout,
                     retries=retries)
    elapsed = time.monotonic() - started
    # One host's worst case: every connect attempt, then three commands (hosts run in parallel).
    budget = connect_timeout * (retries + 1) + 3 * command_timeout
    assert elapsed < min(budget, command_timeout + connect_timeout + 1.5), report.as_dict()

    port = {h.name: h.port for h in cluster.hosts}
    reasons = {h.host: h.reason for h in report.hosts}
    assert reasons["node01"] == f"connection refused (127.0.0.11:{port['node01']})"
    assert reasons["node02"].startswith(f"host key mismatch for 127.0.0.12:{port['node02']}: server offered")
    assert reasons["node03"] == "timeout: 'nvidia-smi --query-gpu' did not finish within 8s"
    assert reasons["node04"] == DRIVER_GONE
    assert reasons["node05"] is None and reasons["node06"] is None
    assert report["node02"].attempts == 1 and report["node03"].attempts == 1
    assert report["node01"].attempts == retries + 1  # refused is transient: retried

    for name in ("node05", "node06"):
        state = cluster.state(name)
        host_dir = out / "hosts" / name
        assert sorted(p.name for p in host_dir.iterdir()) == ["apps.csv", "procs.txt", "query.csv", "topo.txt",
                                                              "xid.log"]
        assert (host_dir / "query.csv").read_text() == nvsmi.query_gpu(state, COLLECTED_FIELDS, "csv")[0]
        assert (host_dir / "topo.txt").read_text() == nvsmi.topo_text(state)

    inventory = load_cluster(out)
    assert inventory.host_errors == {n: reasons[n] for n in ("node01", "node02", "node03", "node04")}
    for gpu in inventory.gpus:
        if gpu.host in inventory.host_errors:
            assert (gpu.healthy, gpu.reasons) == (False, ("unreachable",)), gpu
        else:
            assert gpu.healthy, gpu
    assert inventory.gpu(("node05", 1)).utilization == 0.77
    assert len(inventory.gpus) == 12  # the failed hosts' GPUs stay known from the last good capture
