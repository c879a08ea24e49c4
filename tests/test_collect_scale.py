"""``hetero-gpu collect`` at fleet scale, against the embedded emulated fleet (one asyncssh process
serving every host on its own loopback address with its own host key)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_hetero_gpu.collect.clients import paramiko_client_factory
from airflow_hetero_gpu.collect.gather import QUERY_COMMAND
from airflow_hetero_gpu.collect.ssh import collect_captures
from airflow_hetero_gpu.collect.targets import parse_hosts_file
from airflow_hetero_gpu.testing import nvsmi
from airflow_hetero_gpu.testing.demo import small_hosts
from airflow_hetero_gpu.testing.fleets import scale_hosts
from cluster_fixtures import embedded_cluster  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
FLEET = 200


def hetero_gpu_collect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", "collect", *args],
                          capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


@pytest.mark.slow
def test_collect_every_host_of_a_fleet_with_host_keys_verified(embedded_cluster, tmp_path):
    cluster = embedded_cluster(scale_hosts(FLEET))
    hosts = cluster.write_hosts_file(tmp_path / "hosts")
    out = tmp_path / "captures"
    done = hetero_gpu_collect("--hosts-file", str(hosts), "--identity-file", str(cluster.identity_file),
                              "--known-hosts", str(cluster.known_hosts_path), "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [h["host"] for h in report["hosts"]] == [h.name for h in cluster.hosts]
    assert [h["host"] for h in report["hosts"] if not h["ok"]] == []
    assert [(h["host"], h["attempts"], h["files"]) for h in report["hosts"] if h["attempts"] != 1 or h["files"] != [
        "apps.csv", "procs.txt", "query.csv", "topo.txt", "xid.log"]] == []
    fields = QUERY_COMMAND.split("=", 1)[1].split()[0]
    for host in (cluster.hosts[0], cluster.hosts[FLEET // 2], cluster.hosts[-1]):
        state = cluster.state(host.name)
        query = (out / "hosts" / host.name / "query.csv").read_text()
        assert query.startswith(nvsmi.query_gpu(state, fields, "csv")[0].splitlines()[0])  # header
        assert [line.split(", ")[1] for line in query.splitlines()[1:]] == [g["uuid"] for g in state["gpus"]]
        assert (out / "hosts" / host.name / "topo.txt").read_text() == nvsmi.topo_text(state)

    # The keys are checked: give one host another host's key and it alone is refused.
    lines = cluster.known_hosts_path.read_text().splitlines(keepends=True)
    victim = 57
    lines[victim] = lines[victim].split()[0] + " " + " ".join(lines[victim + 1].split()[1:]) + "\n"
    tampered = tmp_path / "known_hosts"
    tampered.write_text("".join(lines))
    again = hetero_gpu_collect("--hosts-file", str(hosts), "--identity-file", str(cluster.identity_file),
                               "--known-hosts", str(tampered), "--out", str(tmp_path / "again"), "--json")
    assert again.returncode == 0, again.stderr
    failed = [(h["host"], h["reason"]) for h in json.loads(again.stdout)["hosts"] if not h["ok"]]
    host = cluster.hosts[victim]
    assert [name for name, _ in failed] == [host.name]
    assert failed[0][1].startswith(f"host key mismatch for {host.address}:{host.port}: server offered ssh-ed25519 ")


def test_a_host_that_accepts_tcp_but_never_answers_fails_alone_within_the_connect_timeout(
        embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(30, gpus=1))
    cluster.inject_fault("node07", "hang")
    targets = parse_hosts_file(cluster.write_hosts_file(tmp_path / "hosts"))
    timeout = 3.0
    report = collect_captures(targets, tmp_path / "out",
                              paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path),
                              max_parallel=4, connect_timeout=timeout, retries=2)
    hung = report["node07"]
    assert hung.reason == f"timeout: no SSH handshake from 127.0.0.17:{cluster.host('node07').port} within 3s"
    assert hung.attempts == 1 and timeout <= hung.seconds < timeout + 3  # not retried
    others = [h for h in report.hosts if h.host != "node07"]
    assert all(h.ok for h in others)
    # none of the others waited for it: each took less than the hung host's timeout
    assert max(h.seconds for h in others) < timeout
