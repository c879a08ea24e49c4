"""Faults during a health check of many hosts (``hetero-gpu check``'s code path: SshCollector and
HealthWatch, the ledger write included): a host that accepts TCP but never speaks SSH, and a host
whose kept connection went away between checks, fail (or reconnect) alone, without delaying the
others. Bounds are relative to a baseline check of the same fleet in the same test."""

from __future__ import annotations

import json
import time

import pytest

from airflow_hetero_gpu.collect.clients import paramiko_client_factory
from airflow_hetero_gpu.collect.fleet import SshCollector
from airflow_hetero_gpu.collect.persistent import KeptConnections
from airflow_hetero_gpu.collect.targets import SshTarget, parse_hosts_file
from airflow_hetero_gpu.healthcheck import HealthWatch, WatchSpec
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import embedded_cluster, emulated_cluster  # noqa: F401

TIMEOUT = 3.0  # the connect timeout of these checks


def _watch(cluster, targets, tmp_path, *, keep: bool):
    factory = paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)
    kept = KeptConnections(factory) if keep else None
    collector = SshCollector(targets, kept or factory, connect_timeout=TIMEOUT, retries=2, max_parallel=8)
    return HealthWatch(WatchSpec(stop_when_idle=False), collector, f"sqlite:///{tmp_path / 'ledger.db'}"), kept


@pytest.fixture
def fleet50(embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(50, gpus=1))
    return cluster, parse_hosts_file(cluster.write_hosts_file(tmp_path / "hosts"))


def _check(watch):
    """One check: (report, wall seconds, {host: HostResult})."""
    collected = {}
    collect = watch.hook.collect

    def spy(hosts=None, on_host=None):  # the check's own collection, kept for the per-host results
        result = collect(hosts, on_host=on_host)
        collected.update({h.host: h for h in result.hosts})
        return result

    watch.hook.collect = spy
    try:
        began = time.monotonic()
        report = watch.check()
        return report, time.monotonic() - began, collected
    finally:
        watch.hook.collect = collect


def test_a_host_that_never_speaks_ssh_fails_alone_within_the_connect_timeout(fleet50, tmp_path):
    cluster, targets = fleet50
    watch, _ = _watch(cluster, targets, tmp_path, keep=False)
    report, baseline, _ = _check(watch)
    assert (report.collected, report.failed) == (50, 0)
    cluster.inject_fault("node17", "hang")
    report, wall, hosts = _check(watch)
    assert (report.collected, report.failed) == (49, 1)
    hung = hosts["node17"]
    assert hung.reason.startswith("timeout: no SSH handshake from ") and hung.attempts == 1
    assert TIMEOUT <= hung.seconds < TIMEOUT + baseline + 2.0
    # the other 49 went on meanwhile: the check took the hung host's timeout, not more
    assert wall < TIMEOUT + 2 * baseline + 2.0, (wall, baseline)
    assert all(h.ok for name, h in hosts.items() if name != "node17")


def test_kept_connections_are_reused_and_a_dropped_one_is_reconnected_in_the_same_check(fleet50, tmp_path):
    cluster, targets = fleet50
    watch, kept = _watch(cluster, targets, tmp_path, keep=True)
    try:
        report, baseline, _ = _check(watch)
        assert report.collected == 50 and kept.opened == 50 and kept.kept() == 50
        before = cluster.connections_opened()
        assert cluster.drop_connections("node08") == 1
        report, wall, hosts = _check(watch)
        opened = {h: n - before[h] for h, n in cluster.connections_opened().items()}
        assert report.collected == 50 and hosts["node08"].ok
        assert opened == {h: 1 if h == "node08" else 0 for h in opened}  # the rest reused theirs
        assert kept.reused >= 49 and kept.kept() == 50
        assert wall < TIMEOUT + 2 * baseline + 2.0, (wall, baseline)

        # the host went away for good: refused at once, failed for this check, the others fine
        cluster.inject_fault("node09", "host_down")
        report, wall, hosts = _check(watch)
        assert (report.collected, report.failed) == (49, 1)
        assert hosts["node09"].reason.startswith("connection refused"), hosts["node09"].reason
        assert hosts["node09"].seconds < TIMEOUT + baseline + 2.0
        assert wall < TIMEOUT + 2 * baseline + 2.0, (wall, baseline)
        assert kept.kept() == 49
    finally:
        kept.close()
    assert kept.kept() == 0


def test_a_kept_connection_that_goes_silent_fails_its_host_within_the_connect_timeout(emulated_cluster, tmp_path):
    """Real sshd: every sshd process of node02 stopped, so its kept connection stays up but
    nothing answers; the session gives up after the connect timeout, the host fails for that
    check, the other hosts are read as usual."""
    cluster = emulated_cluster(small_hosts(4, gpus=1))
    targets = [SshTarget(h.name, h.address, h.port, cluster.user) for h in cluster.hosts]
    watch, kept = _watch(cluster, targets, tmp_path, keep=True)
    try:
        report, baseline, _ = _check(watch)
        assert report.collected == 4 and kept.kept() == 4
        cluster.inject_fault("node02", "network_silent")
        report, wall, hosts = _check(watch)
        assert (report.collected, report.failed) == (3, 1)
        silent = hosts["node02"]
        assert silent.reason == f"timeout: the SSH connection did not answer within {TIMEOUT:g}s", silent.reason
        assert TIMEOUT <= silent.seconds < TIMEOUT + baseline + 2.0
        assert wall < TIMEOUT + 2 * baseline + 2.0, (wall, baseline)
        assert kept.kept() == 3  # its connection was closed, not kept
        cluster.clear_fault("node02", "network_silent")
        report, _, hosts = _check(watch)
        assert report.collected == 4 and hosts["node02"].ok  # a new connection
    finally:
        kept.close()


def test_check_with_an_interval_keeps_its_connections_between_checks(embedded_cluster, tmp_path, capsys):
    from airflow_hetero_gpu.cli.app import main

    cluster = embedded_cluster(small_hosts(5, gpus=1))
    hosts = cluster.write_hosts_file(tmp_path / "hosts")
    before = cluster.connections_opened()
    code = main(["check", "--hosts-file", str(hosts), "--identity-file", str(cluster.identity_file),
                 "--known-hosts", str(cluster.known_hosts_path), "--ledger", f"sqlite:///{tmp_path / 'l.db'}",
                 "--interval", "0.1", "--count", "3", "--json"])
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["check"], r["collected"]) for r in lines] == [(1, 5), (2, 5), (3, 5)]
    assert {h: n - before[h] for h, n in cluster.connections_opened().items()} == {h.name: 1 for h in cluster.hosts}
    # one-shot checks open new connections each time
    for _ in range(2):
        assert main(["check", "--hosts-file", str(hosts), "--identity-file", str(cluster.identity_file),
                     "--known-hosts", str(cluster.known_hosts_path),
                     "--ledger", f"sqlite:///{tmp_path / 'l.db'}", "--json"]) == 0
    assert {h: n - before[h] for h, n in cluster.connections_opened().items()} == {h.name: 3 for h in cluster.hosts}
