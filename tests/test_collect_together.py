"""The collector's first three reads of a host (query, topo, kernel log) in one SSH session, split
at marker lines; one by one on a host whose login shell is not POSIX (fish)."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_hetero_gpu.capture.directory import QUERY_FIELDS
from airflow_hetero_gpu.capture.query import OPTIONAL_FIELDS
from airflow_hetero_gpu.collect.clients import paramiko_client_factory
from airflow_hetero_gpu.collect.command import run_together, together_line
from airflow_hetero_gpu.collect.gather import TOPO_COMMAND, XID_COMMAND, gather
from airflow_hetero_gpu.collect.ssh import collect_captures
from airflow_hetero_gpu.collect.targets import parse_hosts_file
from airflow_hetero_gpu.testing import nvsmi
from airflow_hetero_gpu.testing.cluster import EmulatedCluster
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import embedded_cluster  # noqa: F401


def _files(root, name):
    return {p.name: p.read_text() for p in sorted((root / "hosts" / name).iterdir())}


def test_one_session_per_host_and_the_same_files_as_one_by_one(embedded_cluster, tmp_path):
    """node03 has a fish login shell: its line with the markers is refused, the reads run one by
    one there, and its files are the same as those of its twin node02 read in one session."""
    hosts = small_hosts(4, gpus=2)
    cluster = embedded_cluster(hosts)
    twin = cluster.state("node02")
    cluster.set_state("node03", **{key: twin[key] for key in ("gpus", "xid", "topology") if key in twin})
    cluster.inject_fault("node03", "fish_shell")
    targets = parse_hosts_file(cluster.write_hosts_file(tmp_path / "hosts"))
    before = cluster.sessions_opened()
    report = collect_captures(targets, tmp_path / "out",
                              paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path),
                              max_parallel=4, retries=0)
    assert [h.host for h in report.failed] == []
    sessions = {name: n - before[name] for name, n in cluster.sessions_opened().items()}
    # one by one: query, topo, kernel log and the compute-apps listing (no process: no ps)
    assert sessions == {"node01": 1, "node02": 1, "node03": 1 + 4, "node04": 1}
    posix, fish = _files(tmp_path / "out", "node02"), _files(tmp_path / "out", "node03")
    assert {"query.csv", "topo.txt", "xid.log"} <= set(posix)
    for name in ("query.csv", "topo.txt", "xid.log", "apps.csv", "procs.txt"):
        assert fish[name] == posix[name], name
    assert posix["topo.txt"] == nvsmi.topo_text(twin)
    assert posix["query.csv"] == nvsmi.query_gpu(twin, ",".join([QUERY_FIELDS, *OPTIONAL_FIELDS]), "csv")[0]
    assert posix["xid.log"].count("NVRM: Xid") == len(twin.get("xid") or [])


@pytest.fixture
def client(embedded_cluster):
    cluster = embedded_cluster(small_hosts(1, gpus=2))
    target = parse_hosts_file(cluster.write_hosts_file(cluster.root / "hosts-file"))[0]
    made = paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)(target)
    yield cluster, made
    made.close()


def test_outputs_and_statuses_are_split_byte_for_byte(client):
    cluster, ssh = client
    cluster.inject_fault("node01", "journal_denied")
    cluster.inject_fault("node01", "dmesg_denied")
    results = run_together(ssh, [(TOPO_COMMAND, "topo"), ("nvidia-smi --query-gpu=index,bogus --format=csv", "q"),
                                 (XID_COMMAND, "xid")], 30)
    assert results is not None
    topo, bogus, xid = results
    assert (topo.returncode, topo.stdout, topo.stderr) == (0, nvsmi.topo_text(cluster.state("node01")), "")
    assert bogus.returncode == 2 and bogus.stdout.startswith('Field "bogus" is not a valid field to query')
    assert xid.returncode == 1 and xid.stdout == ""
    assert xid.stderr == "dmesg: read kernel buffer failed: Operation not permitted\n"


def test_a_shell_that_prints_no_markers_gives_none_and_the_collection_still_succeeds(client):
    cluster, ssh = client
    cluster.inject_fault("node01", "fish_shell")
    assert run_together(ssh, [(TOPO_COMMAND, "topo")], 30) is None
    files, warnings, source = gather(ssh, 30, read_kernel_log=True)
    assert source == "nvidia-smi" and warnings == []
    assert files["topo.txt"] == nvsmi.topo_text(cluster.state("node01"))


def test_a_command_printing_a_look_alike_marker_cannot_split_the_output(client):
    """The marker carries a fresh random token each time: another marker's text is output."""
    _cluster, ssh = client
    look_alike = "printf '\\n%s %s\\n' HGPU-0000000000000000 0"
    results = run_together(ssh, [(look_alike, "look-alike"), ("nvidia-smi -L", "list")], 30)
    assert results is not None and len(results) == 2
    assert results[0].stdout == "\nHGPU-0000000000000000 0\n"
    assert results[1].stdout.startswith("GPU 0: ")
    assert "HGPU-0000000000000000" in together_line([look_alike], "HGPU-1")


def test_the_real_sshd_cluster_refuses_the_fish_fault_clearly(tmp_path):
    spec = dataclasses.replace(small_hosts(1, gpus=1)[0], faults=("fish_shell",))
    with pytest.raises(ValueError, match="fault 'fish_shell' is only emulated by the embedded SSH server"):
        EmulatedCluster(tmp_path, [spec])


def test_a_timeout_in_the_one_session_read_names_the_command_still_running(client):
    from airflow_hetero_gpu.collect.reasons import HostFailure

    cluster, ssh = client
    cluster.set_state("node01", nvidia_smi_delay_s=5.0)  # every nvidia-smi takes 5 s
    with pytest.raises(HostFailure, match=r"^timeout: 'nvidia-smi --query-gpu' did not finish within 1s$"):
        gather(ssh, 1.0, read_kernel_log=True)
