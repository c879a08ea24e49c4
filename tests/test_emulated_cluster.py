"""The emulated cluster: real sshd per loopback host, faults, state changes, clean shutdown."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_hetero_gpu.testing import procs
from airflow_hetero_gpu.testing.cluster import EmulatedCluster
from airflow_hetero_gpu.testing.cluster_base import SYSTEM_PATH
from airflow_hetero_gpu.testing.demo import FAULTY_GPU, small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from airflow_hetero_gpu.testing.sshd import Sshd, SshdError, find_sshd, free_port, generate_key

pytestmark = pytest.mark.skipif(find_sshd() is None, reason="OpenSSH server (sshd) not installed")

ROOT = Path(__file__).resolve().parents[1]


def ssh(cluster: EmulatedCluster, host: str, command: str, timeout: float = 20,
        connect_timeout: int = 5) -> subprocess.CompletedProcess[str]:
    argv = cluster.ssh_argv(host, command)
    argv[argv.index("ConnectTimeout=5")] = f"ConnectTimeout={connect_timeout}"
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def pgrep(pattern: str) -> list[str]:
    """``pgrep -af PATTERN`` minus ourselves (a /proc scan where procps is not installed)."""
    own = str(os.getpid())
    if shutil.which("pgrep"):
        out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout.splitlines()
    else:
        out = []
        for entry in Path("/proc").iterdir():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            if entry.name.isdigit() and cmd and re.search(pattern, cmd):
                out.append(f"{entry.name} {cmd}")
    return [line for line in out if not line.startswith(own + " ") and "pgrep" not in line]


def test_demo_cluster_layout(emulated_cluster):
    cluster = emulated_cluster()
    names = [h.name for h in cluster.hosts]
    assert names == ["dgx-a1", "dgx-a2", "dgx1-v100", "rtx-box", "hgx-h200"]
    assert [h.address for h in cluster.hosts] == [f"127.0.0.{11 + i}" for i in range(5)]
    assert all(h.port > 1024 for h in cluster.hosts)
    known = cluster.known_hosts_path.read_text().splitlines()
    assert [line.split()[0] for line in known] == [f"[{h.address}]:{h.port}" for h in cluster.hosts]
    assert all(re.fullmatch(r"\[127\.0\.0\.\d+\]:\d+ ssh-ed25519 [A-Za-z0-9+/=]+", line) for line in known)
    assert cluster.identity_file.is_file() and cluster.user
    cards = {h.name: {g["name"] for g in cluster.state(h.name)["gpus"]} for h in cluster.hosts}
    assert cards == {
        "dgx-a1": {"NVIDIA A100-SXM4-80GB"}, "dgx-a2": {"NVIDIA A100-SXM4-80GB"},
        "dgx1-v100": {"Tesla V100-SXM2-32GB"}, "rtx-box": {"NVIDIA GeForce RTX 4090"},
        "hgx-h200": {"NVIDIA H200"},
    }
    assert cluster.state("hgx-h200")["gpus"][FAULTY_GPU]["ecc_uncorrected_volatile"] > 0


def test_remote_nvidia_smi_reflects_state_changes(emulated_cluster):
    cluster = emulated_cluster(small_hosts(1, gpus=2))
    query = "nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader"
    first = ssh(cluster, "node01", query)
    assert (first.returncode, first.stdout) == (0, "0, 0 %, 4 MiB\n1, 0 %, 4 MiB\n")
    cluster.update_gpu("node01", 1, utilization_gpu=93, memory_used_mib=70000)
    second = ssh(cluster, "node01", query + "; nvidia-smi topo -m | head -1; echo $HETERO_GPU_EMU_STATE")
    lines = second.stdout.splitlines()
    assert lines[:2] == ["0, 0 %, 4 MiB", "1, 93 %, 70000 MiB"]
    assert lines[2] == "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    assert lines[3] == str(cluster.host("node01").state_file)


def test_the_hosts_shells_start_bare_with_exactly_the_hosts_path(emulated_cluster):
    # not the account's ~/.bashrc (on a machine whose ~/.bashrc runs `pyenv init -`, that put the
    # shims in front and cost 140 ms of CPU per command)
    cluster = emulated_cluster(small_hosts(1, gpus=1))
    host = cluster.host("node01")
    done = ssh(cluster, "node01", 'echo "$PATH"; command -v nvidia-smi')
    assert done.returncode == 0, done.stderr
    path, tool = done.stdout.splitlines()
    assert path == ":".join((str(host.bin_dir),) + cluster._software_path() + SYSTEM_PATH)
    assert tool == str(host.bin_dir / "nvidia-smi")


def test_update_gpu_refuses_unknown_fields(emulated_cluster):
    cluster = emulated_cluster(small_hosts(1, gpus=1))
    with pytest.raises(ValueError, match="unknown GPU fields"):
        cluster.update_gpu("node01", 0, utilisation=3)
    with pytest.raises(KeyError, match="no GPU with index 7"):
        cluster.update_gpu("node01", 7, lost=True)


FAULT_TABLE = [
    # fault, command, exit status, text expected in stdout+stderr
    ("driver_gone", "nvidia-smi -L", 9, "NVIDIA-SMI has failed because it couldn't communicate"),
    ("no_devices", "nvidia-smi topo -m", 6, "No devices were found"),
    ("nvidia_smi_missing", "nvidia-smi -L", 127, "nvidia-smi: command not found"),
    ("dmesg_denied", "dmesg", 1, "dmesg: read kernel buffer failed: Operation not permitted"),
    ("journal_denied", "journalctl -k -q", 1, "insufficient permissions"),
]


@pytest.mark.parametrize("fault, command, rc, text", FAULT_TABLE)
def test_state_faults_and_clearing_them(emulated_cluster, fault, command, rc, text):
    cluster = emulated_cluster(small_hosts(1, gpus=1))
    cluster.inject_fault("node01", fault)
    broken = ssh(cluster, "node01", command)
    assert broken.returncode == rc and text in broken.stdout + broken.stderr
    cluster.clear_fault("node01", fault)
    assert ssh(cluster, "node01", command).returncode == 0
    assert cluster.faults("node01") == []


def test_host_down_refuses_then_comes_back_on_the_same_port(emulated_cluster):
    cluster = emulated_cluster(small_hosts(2, gpus=1))
    port = cluster.host("node01").port
    cluster.inject_fault("node01", "host_down")
    down = ssh(cluster, "node01", "true")
    assert down.returncode == 255 and "Connection refused" in down.stderr
    assert ssh(cluster, "node02", "true").returncode == 0
    cluster.clear_fault("node01", "host_down")
    assert cluster.host("node01").port == port
    assert ssh(cluster, "node01", "true").returncode == 0


def test_hang_blocks_new_connections_until_resumed(emulated_cluster):
    cluster = emulated_cluster(small_hosts(1, gpus=1))
    cluster.inject_fault("node01", "hang")
    started = time.monotonic()
    hung = ssh(cluster, "node01", "true", connect_timeout=1)
    assert hung.returncode == 255 and time.monotonic() - started < 5
    assert "timed out" in hung.stderr.lower()
    cluster.clear_fault("node01", "hang")
    assert ssh(cluster, "node01", "true").returncode == 0


def test_changed_host_key_is_detected_and_restored(emulated_cluster):
    cluster = emulated_cluster(small_hosts(1, gpus=1))
    cluster.inject_fault("node01", "host_key_changed")
    changed = ssh(cluster, "node01", "true")
    assert changed.returncode == 255 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in changed.stderr
    cluster.clear_fault("node01", "host_key_changed")
    assert ssh(cluster, "node01", "true").returncode == 0


def test_xid_lines_reach_the_kernel_log(emulated_cluster):
    cluster = emulated_cluster(small_hosts(1, gpus=2))
    cluster.add_xid("node01", 1, 79, time=4321.5, pid=77, process="python3")
    out = ssh(cluster, "node01", "journalctl -k -q --no-pager -g 'NVRM: Xid'; dmesg | grep 'NVRM: Xid'").stdout
    journal, dmesg = out.splitlines()
    assert journal.endswith("node01 kernel: NVRM: Xid (PCI:0000:0f:00): 79, pid=77, name=python3, "
                            "GPU has fallen off the bus.")
    assert dmesg == "[ 4321.500000] NVRM: Xid (PCI:0000:0f:00): 79, pid=77, name=python3, GPU has fallen off the bus."


def test_stop_leaves_nothing_running(tmp_path):
    cluster = EmulatedCluster(tmp_path / "c", small_hosts(2, gpus=1)).start()
    pids = cluster.sshd_pids()
    # A long-running remote command, a session left open, and a paused sshd.
    runaway = subprocess.Popen(cluster.ssh_argv("node01", "sleep 3171 & sleep 3172"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not pgrep("sleep 317[12]") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pgrep("sleep 317[12]"), "the remote command did not start"
    sessions = procs.descendants(pids["node01"])
    cluster.inject_fault("node02", "hang")
    cluster.stop()
    runaway.wait(timeout=10)
    assert pgrep(str(tmp_path)) == []
    assert pgrep("sleep 317[12]") == []
    assert [pid for pid in list(sessions) + list(pids.values()) if procs.alive(pid)] == []
    cluster.stop()  # idempotent


def test_start_failure_reports_sshd_stderr(tmp_path):
    sshd = Sshd(tmp_path, "127.0.0.11", free_port("127.0.0.11"), env_marker="m", path_value="/usr/bin",
                state_file=tmp_path / "state.json", authorized_keys=tmp_path / "authorized_keys")
    # No host key was generated: sshd refuses to start and says why.
    with pytest.raises(SshdError, match="no hostkeys available"):
        sshd.start(timeout=5)


def test_bad_cluster_definitions_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        EmulatedCluster(tmp_path, small_hosts(1) + small_hosts(1))
    with pytest.raises(ValueError, match="outside 127.0.0.0/8"):
        EmulatedCluster(tmp_path, small_hosts(2), first_address="127.255.255.255")
    with pytest.raises(ValueError, match="at least one host"):
        EmulatedCluster(tmp_path, [])


def test_generate_key_writes_a_private_key(tmp_path):
    public = generate_key(tmp_path / "k", "comment")
    assert public.startswith("ssh-ed25519 ") and public.endswith(" comment")
    assert (tmp_path / "k").stat().st_mode & 0o077 == 0


def test_cli_starts_prints_and_stops_on_sigterm(tmp_path):
    root = tmp_path / "cli"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "airflow_hetero_gpu.testing", "start", "--root", str(root),
                             "--hosts", "small"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("ready: "):
                break
        assert any(line.strip().startswith("node01 ") for line in lines), lines
        assert f"known_hosts:   {root / 'known_hosts'}" in lines
        assert pgrep(str(root))
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert out.strip().endswith("stopped")
    assert pgrep(str(root)) == []


def test_a_port_taken_before_sshd_binds_it_moves_the_host(tmp_path, monkeypatch):
    from airflow_hetero_gpu.testing import cluster as cluster_module

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.11", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        offers = iter([taken])
        real_free_port = cluster_module.free_port
        monkeypatch.setattr(cluster_module, "free_port", lambda address: next(offers, None) or real_free_port(address))
        with EmulatedCluster(tmp_path / "c", small_hosts(1, gpus=1)) as cluster:
            port = cluster.host("node01").port
            assert port != taken
            assert cluster.known_hosts_path.read_text().startswith(f"[127.0.0.11]:{port} ssh-ed25519 ")
            assert ssh(cluster, "node01", "true").returncode == 0
