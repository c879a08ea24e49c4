"""The embedded emulated fleet (one asyncssh server process): host keys, sessions, real processes,
stdin end-of-file, keepalives, faults and a clean stop."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest

from airflow_hetero_gpu.collect.clients import paramiko_client_factory
from airflow_hetero_gpu.collect.command import run_command
from airflow_hetero_gpu.collect.gather import QUERY_COMMAND
from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.testing import nvsmi, procs
from airflow_hetero_gpu.testing.cluster import EmulatedCluster
from airflow_hetero_gpu.testing.cluster_base import SYSTEM_PATH
from airflow_hetero_gpu.testing.demo import FAULTY_GPU, small_hosts
from airflow_hetero_gpu.testing.embedded import EmbeddedCluster, EmbeddedServerError
from cluster_fixtures import embedded_cluster  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


def target(cluster, name: str) -> SshTarget:
    host = cluster.host(name)
    return SshTarget(name, host.address, host.port, cluster.user)


def connect(cluster, name: str, timeout: float = 10) -> paramiko.SSHClient:
    return paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)(target(cluster, name),
                                                                                   connect_timeout=timeout)


def run(cluster, name: str, command: str, stdin: bytes | None = None, timeout: float = 30):
    client = connect(cluster, name)
    try:
        return run_command(client, command, timeout, stdin=stdin)
    finally:
        client.close()


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# The interface both emulated clusters share
# ---------------------------------------------------------------------------------------------

SHARED = ("hosts", "user", "identity_file", "known_hosts_path", "hosts_arg", "write_hosts_file", "host",
          "ssh_argv", "state", "set_state", "update_gpu", "add_gpu", "add_xid", "inject_fault",
          "clear_fault", "faults", "start", "stop", "__enter__", "__exit__")


@pytest.mark.parametrize("name", SHARED)
def test_same_interface_as_the_real_sshd_cluster(name):
    assert hasattr(EmbeddedCluster, name) or name == "hosts"
    if callable(getattr(EmulatedCluster, name, None)):
        assert list(inspect.signature(getattr(EmbeddedCluster, name)).parameters) \
            == list(inspect.signature(getattr(EmulatedCluster, name)).parameters)


def test_layout_host_keys_and_known_hosts(embedded_cluster):
    cluster = embedded_cluster()
    assert [h.name for h in cluster.hosts] == ["dgx-a1", "dgx-a2", "dgx1-v100", "rtx-box", "hgx-h200"]
    assert [h.address for h in cluster.hosts] == [f"127.0.0.{11 + i}" for i in range(5)]
    known = cluster.known_hosts_path.read_text().splitlines()
    assert [line.split()[0] for line in known] == [f"[{h.address}]:{h.port}" for h in cluster.hosts]
    keys = [line.split()[2] for line in known]
    assert len(set(keys)) == 5 and all(line.split()[1] == "ssh-ed25519" for line in known)
    # each host presents its own key: connecting to one with another's entry is refused
    swapped = cluster.root / "swapped_known_hosts"
    swapped.write_text(known[0].split()[0] + " ssh-ed25519 " + keys[1] + "\n")
    with pytest.raises(paramiko.BadHostKeyException):
        paramiko_client_factory(cluster.identity_file, swapped)(target(cluster, "dgx-a1"))
    assert cluster.hosts_arg(["dgx-a1"]) == f"dgx-a1={cluster.user}@127.0.0.11:{cluster.hosts[0].port}"


def test_only_the_fleet_key_and_user_get_in(embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(1, gpus=1))
    other = paramiko.Ed25519Key.from_private_key_file(str(cluster.identity_file))  # the right key...
    host = cluster.host("node01")
    client = paramiko.SSHClient()
    client.load_host_keys(str(cluster.known_hosts_path))
    with pytest.raises(paramiko.AuthenticationException):  # ...for another user
        client.connect(host.address, host.port, username=cluster.user + "x", pkey=other,
                       look_for_keys=False, allow_agent=False, timeout=10)
    client.close()


@pytest.mark.skipif(shutil.which("ssh") is None, reason="OpenSSH client not installed")
def test_openssh_client_with_strict_host_key_checking(embedded_cluster):
    cluster = embedded_cluster(small_hosts(1, gpus=2))
    done = subprocess.run(cluster.ssh_argv("node01", "nvidia-smi -L; echo $HETERO_GPU_EMU_STATE"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    gpus, state = done.stdout.splitlines()[:2], done.stdout.splitlines()[2]
    assert [line.split(" (UUID")[0] for line in gpus] == ["GPU 0: NVIDIA A100-SXM4-80GB",
                                                          "GPU 1: NVIDIA A100-SXM4-80GB"]
    assert state == str(cluster.host("node01").state_file)


# ---------------------------------------------------------------------------------------------
# Sessions: in-process answers and real processes
# ---------------------------------------------------------------------------------------------

def test_collector_commands_follow_the_state(embedded_cluster):
    cluster = embedded_cluster()
    before = run(cluster, "hgx-h200", QUERY_COMMAND)
    expected, rc = nvsmi.query_gpu(cluster.state("hgx-h200"), QUERY_COMMAND.split("=")[1].split()[0], "csv")
    assert (before.returncode, before.stdout) == (rc, expected)
    cluster.update_gpu("hgx-h200", FAULTY_GPU, utilization_gpu=77)
    after = run(cluster, "hgx-h200", "nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader")
    assert after.stdout.splitlines()[FAULTY_GPU] == f"{FAULTY_GPU}, 77 %"


def test_other_commands_run_as_real_processes_with_the_host_environment(embedded_cluster):
    cluster = embedded_cluster(small_hosts(2, gpus=1))
    host = cluster.host("node02")
    done = run(cluster, "node02", 'echo "$PATH"; echo "$HETERO_GPU_EMU_STATE"; echo "$HOME"; '
                                  'command -v nvidia-smi; nvidia-smi -L | wc -l; echo err >&2; exit 3')
    path, state, home, tool, count = done.stdout.splitlines()
    # exactly the host's PATH: the account's ~/.bashrc is not read (SHLVL=1, as the sshd cluster)
    assert path == ":".join((str(host.bin_dir),) + cluster._software_path() + SYSTEM_PATH)
    assert state == str(host.state_file) and home == str(Path.home())
    assert tool == str(host.bin_dir / "nvidia-smi") and count == "1"
    assert (done.returncode, done.stderr) == (3, "err\n")
    marked = run(cluster, "node02", "sleep 0.1 & echo $$; wait")
    assert marked.returncode == 0


def test_stdin_is_piped_and_its_end_reaches_the_process(embedded_cluster):
    cluster = embedded_cluster(small_hosts(1, gpus=1))
    done = run(cluster, "node01", "wc -c; cat", stdin=b"x" * 100_000)
    assert done.stdout.split() == ["100000"] and done.returncode == 0


def test_a_signal_death_is_reported_as_a_signal(embedded_cluster):
    cluster = embedded_cluster(small_hosts(1, gpus=1))
    assert run(cluster, "node01", "kill -TERM $$").returncode == -1  # paramiko: exit-signal


def test_keepalive_requests_are_answered(embedded_cluster):
    cluster = embedded_cluster(small_hosts(1, gpus=1))
    client = connect(cluster, "node01")
    try:
        transport = client.get_transport()
        started = time.monotonic()
        for _ in range(3):  # what OpenSSH's ServerAliveInterval and the launcher send
            transport.global_request("keepalive@openssh.com", wait=True)
        assert time.monotonic() - started < 10 and transport.is_active()
        assert run_command(client, "nvidia-smi -L", 10).returncode == 0
    finally:
        client.close()


def _start_waiting_for_eof(cluster, name: str, flag: Path) -> paramiko.SSHClient:
    """A remote process that writes ``flag`` once its stdin ends; returns the open client."""
    client = connect(cluster, name)
    channel = client.get_transport().open_session()
    channel.exec_command(f"echo started; cat >/dev/null; echo eof > {flag}")
    assert channel.recv(100) == b"started\n"
    return client


def test_a_dropped_connection_ends_the_processes_stdin(embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(2, gpus=1))
    flag = tmp_path / "eof"
    client = _start_waiting_for_eof(cluster, "node01", flag)
    assert cluster.connections()["node01"] == 1
    assert cluster.drop_connections("node01") == 1
    wait_for(flag.exists, what="end-of-file on the remote process's stdin")
    wait_for(lambda: not client.get_transport().is_active(), what="the client seeing the drop")
    client.close()
    assert run(cluster, "node01", "nvidia-smi -L").returncode == 0  # new connections are fine


def test_a_killed_client_ends_the_processes_stdin(embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(1, gpus=1))
    flag = tmp_path / "eof"
    client = _start_waiting_for_eof(cluster, "node01", flag)
    client.get_transport().sock.shutdown(socket.SHUT_RDWR)  # the connection vanishes
    wait_for(flag.exists, what="end-of-file on the remote process's stdin")
    client.close()


# ---------------------------------------------------------------------------------------------
# Faults
# ---------------------------------------------------------------------------------------------

STATE_FAULTS = [
    ("driver_gone", "nvidia-smi -L", 9, "NVIDIA-SMI has failed"),
    ("no_devices", "nvidia-smi -L", 6, "No devices were found"),
    ("nvidia_smi_missing", "nvidia-smi -L", 127, "nvidia-smi: command not found"),
    ("nvidia_smi_missing", "command -v nvidia-smi || echo gone", 0, "gone"),   # a real shell too
    ("journal_denied", "journalctl -k -g x", 1, "insufficient permissions"),
    ("dmesg_denied", "dmesg", 1, "read kernel buffer failed"),
]


@pytest.mark.parametrize("fault, command, rc, text", STATE_FAULTS)
def test_state_faults(embedded_cluster, fault, command, rc, text):
    cluster = embedded_cluster(small_hosts(1, gpus=1))
    cluster.inject_fault("node01", fault)
    broken = run(cluster, "node01", command)
    assert broken.returncode == rc and text in broken.stdout + broken.stderr
    cluster.clear_fault("node01", fault)
    assert run(cluster, "node01", "nvidia-smi -L").returncode == 0
    assert cluster.faults("node01") == []


def test_host_down_refuses_kills_its_processes_and_comes_back_on_the_same_port(embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(2, gpus=1))
    port = cluster.host("node01").port
    client = connect(cluster, "node01")
    channel = client.get_transport().open_session()
    channel.exec_command("echo $$; exec sleep 3173")
    pid = int(channel.recv(100))
    cluster.inject_fault("node01", "host_down")
    with pytest.raises(ConnectionRefusedError):
        connect(cluster, "node01")
    wait_for(lambda: not procs.alive(pid), what="the host's process to be killed")
    assert run(cluster, "node02", "true").returncode == 0
    client.close()
    cluster.clear_fault("node01", "host_down")
    assert cluster.host("node01").port == port
    assert run(cluster, "node01", "true").returncode == 0


def test_hang_accepts_tcp_but_never_answers_ssh(embedded_cluster):
    cluster = embedded_cluster(small_hosts(1, gpus=1))
    open_client = connect(cluster, "node01")
    cluster.inject_fault("node01", "hang")
    host = cluster.host("node01")
    with socket.create_connection((host.address, host.port), timeout=5) as sock:  # TCP works
        sock.settimeout(1.0)
        with pytest.raises(socket.timeout):
            sock.recv(10)  # ... but no banner ever comes
    started = time.monotonic()
    with pytest.raises(paramiko.SSHException):
        connect(cluster, "node01", timeout=1.5)
    assert time.monotonic() - started < 6
    assert run_command(open_client, "nvidia-smi -L", 10).returncode == 0  # open ones keep working
    open_client.close()
    cluster.clear_fault("node01", "hang")
    assert run(cluster, "node01", "true").returncode == 0


def test_sshd_killed_drops_sessions_refuses_new_ones_and_jobs_see_eof(embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(1, gpus=1))
    flag = tmp_path / "eof"
    client = _start_waiting_for_eof(cluster, "node01", flag)
    cluster.inject_fault("node01", "sshd_killed")
    wait_for(flag.exists, what="end-of-file on the running process's stdin")
    with pytest.raises(ConnectionRefusedError):
        connect(cluster, "node01")
    client.close()
    cluster.clear_fault("node01", "sshd_killed")
    assert run(cluster, "node01", "true").returncode == 0


def test_changed_host_key_is_refused_and_restored(embedded_cluster):
    cluster = embedded_cluster(small_hosts(1, gpus=1))
    cluster.inject_fault("node01", "host_key_changed")
    with pytest.raises(paramiko.BadHostKeyException):
        connect(cluster, "node01")
    cluster.clear_fault("node01", "host_key_changed")
    assert run(cluster, "node01", "true").returncode == 0


def test_faults_it_cannot_emulate_are_refused_clearly(embedded_cluster):
    cluster = embedded_cluster(small_hosts(1, gpus=1))
    with pytest.raises(ValueError, match="'network_silent' is not supported by the embedded SSH server; "
                                         "use EmulatedCluster"):
        cluster.inject_fault("node01", "network_silent")
    with pytest.raises(ValueError, match="unknown fault 'bogus'"):
        cluster.inject_fault("node01", "bogus")
    assert cluster.faults("node01") == []
    spec = small_hosts(1, gpus=1)[0]
    spec.faults = ["network_silent"]
    with pytest.raises(ValueError, match="not supported"):
        EmbeddedCluster(cluster.root / "x", [spec])


def test_faults_in_the_spec_apply_at_start(embedded_cluster):
    specs = small_hosts(2, gpus=1)
    specs[0].faults = ["host_down"]
    cluster = embedded_cluster(specs)
    with pytest.raises(ConnectionRefusedError):
        connect(cluster, "node01")
    assert run(cluster, "node02", "true").returncode == 0


# ---------------------------------------------------------------------------------------------
# Life cycle
# ---------------------------------------------------------------------------------------------

def test_stop_leaves_nothing_running(tmp_path):
    cluster = EmbeddedCluster(tmp_path / "c", small_hosts(2, gpus=1)).start()
    servers = cluster.server_pids()
    client = connect(cluster, "node01")
    channel = client.get_transport().open_session()
    channel.exec_command("setsid sleep 3174 & echo $!; exec sleep 3175")  # one escapes the session
    escaped = int(channel.recv(100))
    marker = cluster.marker
    assert procs.with_env_marker(marker + ".", prefix=True)
    cluster.stop()
    client.close()
    assert not procs.alive(escaped)
    assert procs.with_env_marker(marker + ".", prefix=True) == []
    assert [pid for pid in servers if procs.alive(pid)] == []
    cluster.stop()  # idempotent


def test_a_server_that_cannot_start_says_why(tmp_path):
    with pytest.raises(EmbeddedServerError, match=r"exited with status \d+"):
        EmbeddedCluster(tmp_path / "c", small_hosts(1, gpus=1), python="/bin/false").start()


def test_bad_cluster_definitions_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unique: \\['node01'\\]"):
        EmbeddedCluster(tmp_path, small_hosts(1) + small_hosts(1))
    with pytest.raises(ValueError, match="outside 127.0.0.0/8"):
        EmbeddedCluster(tmp_path, small_hosts(2), first_address="127.255.255.255")
    with pytest.raises(ValueError, match="at least one host"):
        EmbeddedCluster(tmp_path, [])


def test_hosts_split_over_several_server_processes(embedded_cluster):
    cluster = embedded_cluster(small_hosts(4, gpus=1), processes=2)
    assert len(cluster.server_pids()) == 2
    assert all(run(cluster, h.name, "nvidia-smi -L").returncode == 0 for h in cluster.hosts)
    cluster.inject_fault("node04", "host_down")
    with pytest.raises(ConnectionRefusedError):
        connect(cluster, "node04")
    assert set(cluster.connections()) == {"node01", "node02", "node03", "node04"}
    assert re.fullmatch(r"\d+\.\d+", f"{cluster.server_cpu_seconds():.2f}")


def test_the_command_line_serves_an_embedded_fleet_until_sigterm(tmp_path):
    root = tmp_path / "cli"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "airflow_hetero_gpu.testing", "start", "--root", str(root),
                             "--hosts", "scale", "--count", "30", "--embedded"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("ready: "):
                break
        assert lines[0].endswith("(30 hosts, one embedded asyncssh server)"), lines
        assert f"--hosts-file:  {root / 'hosts.txt'}" in lines
        assert len((root / "hosts.txt").read_text().splitlines()) == 30
        server = [int(p) for p in subprocess.run(["pgrep", "-f", f"embedded serve {root}"], capture_output=True,
                                                 text=True).stdout.split()]
        assert server, "no server process"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip().endswith("stopped")
    assert [pid for pid in server if procs.alive(pid)] == []
