"""What limits a collection's fan-out says so clearly: the process's open-file limit (raised
towards the hard limit when the fan-out needs it), and sshd's MaxStartups (real sshd)."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from airflow_hetero_gpu.collect.clients import paramiko_client_factory
from airflow_hetero_gpu.collect.limits import OpenFilesLimitError, ensure_open_files, needed_open_files
from airflow_hetero_gpu.collect.ssh import collect_captures
from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import embedded_cluster  # noqa: F401
from airflow_hetero_gpu.testing.sshd import Sshd, find_sshd, free_port, generate_key

ROOT = Path(__file__).resolve().parents[1]
SOFT, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)

COLLECT = textwrap.dedent("""
    import json, resource, sys
    from airflow_hetero_gpu.collect.clients import paramiko_client_factory
    from airflow_hetero_gpu.collect.ssh import collect_captures
    from airflow_hetero_gpu.collect.targets import parse_hosts_file
    cfg = json.loads(sys.argv[1])
    report = collect_captures(parse_hosts_file(cfg["hosts"]), cfg["out"],
                              paramiko_client_factory(cfg["key"], cfg["known_hosts"]),
                              max_parallel=cfg["parallel"], retries=0, connect_timeout=30)
    print(json.dumps({"ok": len(report.ok), "failed": [h.reason for h in report.failed][:3],
                      "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
""")


def _limited(soft: int, hard: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.skipif(HARD != resource.RLIM_INFINITY and HARD < 2048, reason="hard open-file limit below 2048")
def test_a_wide_fan_out_raises_the_soft_limit_and_every_host_is_collected(embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(120, gpus=1))
    hosts = cluster.write_hosts_file(tmp_path / "hosts")
    cfg = {"hosts": str(hosts), "out": str(tmp_path / "out"), "key": str(cluster.identity_file),
           "known_hosts": str(cluster.known_hosts_path), "parallel": 120}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", COLLECT, json.dumps(cfg)], capture_output=True, text=True,
                          env=env, timeout=600, preexec_fn=_limited(256, 2048))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["failed"] == [] and result["ok"] == 120
    assert 256 < result["soft"] <= 2048  # 120 hosts in flight do not fit in 256 descriptors


def test_the_fan_out_is_sized_by_the_hosts_not_by_max_parallel(embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(2, gpus=1))
    hosts = cluster.write_hosts_file(tmp_path / "hosts")
    done = subprocess.run(
        [sys.executable, "-m", "airflow_hetero_gpu.cli", "collect", "--hosts-file", str(hosts),
         "--identity-file", str(cluster.identity_file), "--known-hosts", str(cluster.known_hosts_path),
         "--out", str(tmp_path / "out"), "--max-parallel", "500"],
        capture_output=True, text=True, timeout=300, preexec_fn=_limited(128, 128),
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr  # two workers fit in 128 descriptors
    assert done.stdout.splitlines()[-1].startswith("collected 2/2 hosts")


def test_ensure_open_files_raises_towards_the_hard_limit_or_says_why():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
        assert ensure_open_files(5) == 128                    # fits already
        raised = ensure_open_files(200)
        assert raised == needed_open_files(200) or raised == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == raised
        if hard != resource.RLIM_INFINITY:
            with pytest.raises(OpenFilesLimitError, match=r"^max_parallel \d+ needs about \d+ open files but this "
                                                          r"process may open at most \d+ \(hard limit\): lower "
                                                          r"max_parallel to \d+ or less, or raise the hard limit"):
                ensure_open_files(hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_command_line_says_the_limit_in_one_line(embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(40, gpus=1))
    hosts = cluster.write_hosts_file(tmp_path / "hosts")
    done = subprocess.run(
        [sys.executable, "-m", "airflow_hetero_gpu.cli", "collect", "--hosts-file", str(hosts),
         "--identity-file", str(cluster.identity_file), "--known-hosts", str(cluster.known_hosts_path),
         "--out", str(tmp_path / "out"), "--max-parallel", "40"],
        capture_output=True, text=True, timeout=300, preexec_fn=_limited(128, 128),
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert done.stderr.startswith("hetero-gpu collect: error: max_parallel 40 needs about ")
    assert "(hard limit): lower max_parallel to " in done.stderr and len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "out").exists()  # refused before anything was written


class _ThrottledSshd(Sshd):
    """A real sshd that lets one unauthenticated connection in at a time."""

    def write_config(self) -> None:
        super().write_config()
        self.config.write_text(self.config.read_text() + "MaxStartups 1:100:1\n", encoding="utf-8")


@pytest.mark.skipif(find_sshd() is None, reason="OpenSSH server (sshd) not installed")
def test_maxstartups_refusals_say_so(tmp_path):
    address = "127.0.0.61"
    client_pub = generate_key(tmp_path / "id", "client")
    (tmp_path / "authorized_keys").write_text(client_pub + "\n")
    sshd = _ThrottledSshd(tmp_path, address, free_port(address), env_marker="maxstartups",
                          path_value="/usr/bin:/bin", state_file=tmp_path / "state.json",
                          authorized_keys=tmp_path / "authorized_keys")
    host_pub = generate_key(sshd.host_key, "host")
    sshd.start()
    holders: list[socket.socket] = []
    try:
        (tmp_path / "known_hosts").write_text(f"[{address}]:{sshd.port} {' '.join(host_pub.split()[:2])}\n")
        # Take the one slot: a connection that said hello and then waits (until LoginGraceTime).
        deadline = time.monotonic() + 30
        while True:
            sock = socket.create_connection((address, sshd.port), timeout=5)
            holders.append(sock)
            sock.sendall(b"SSH-2.0-holder\r\n")
            if sock.recv(256).startswith(b"SSH-"):
                break
            assert time.monotonic() < deadline, "sshd never let a connection in"
        report = collect_captures([SshTarget("h", address, sshd.port, "root")], tmp_path / "out",
                                  paramiko_client_factory(tmp_path / "id", tmp_path / "known_hosts"),
                                  retries=1, connect_timeout=5)
        reason = report["h"].reason
        assert reason == (f"connection closed by {address}:{sshd.port} before the SSH banner (sshd's "
                          "MaxStartups refuses unauthenticated connections beyond its limit: lower "
                          "max_parallel behind a shared sshd)")
        assert report["h"].attempts == 2  # retried: throttling passes
    finally:
        for sock in holders:
            sock.close()
        sshd.kill()
