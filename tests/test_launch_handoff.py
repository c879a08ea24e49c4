"""A task's start opens one SSH connection a host: the sweep's connection is the launch's
(ConnectionHandoff), counted at the embedded emulated server."""

from __future__ import annotations

import time

import paramiko
import pytest

from airflow_hetero_gpu.collect.clients import paramiko_client_factory
from airflow_hetero_gpu.collect.targets import parse_hosts_file
from airflow_hetero_gpu.launch.command import Command, LaunchSpec
from airflow_hetero_gpu.launch.handoff import ConnectionHandoff
from airflow_hetero_gpu.launch.orphans import kill_orphans
from airflow_hetero_gpu.launch.remote import torchrun_job
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import embedded_cluster  # noqa: F401


@pytest.fixture
def fleet(embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(3, gpus=2))
    targets = {t.host_name: t for t in parse_hosts_file(cluster.write_hosts_file(tmp_path / "hosts"))}
    return cluster, targets, paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)


def _opened(cluster, before):
    return {h: n - before[h] for h, n in cluster.connections_opened().items()}


def test_sweep_probe_and_launch_share_one_connection_a_host(fleet):
    cluster, targets, factory = fleet
    before = cluster.connections_opened()
    handoff = ConnectionHandoff(factory)
    swept = kill_orphans("job-a", [targets["node01"], targets["node02"], targets["node03"]], handoff)
    assert all(r.error is None for r in swept.values()), swept
    handoff.release({"node01", "node02"})  # node03 was swept (an earlier try's host), not launched on
    # released at once, not kept for the job's life: the server sees node03's connection close
    # before the job starts (it notes the close a moment after the client's, so wait for it)
    deadline = time.monotonic() + 30
    while cluster.connections()["node03"] != 0:
        assert time.monotonic() < deadline, cluster.connections()
        time.sleep(0.05)
    spec = LaunchSpec("job-a", Command(("sh", "-c", "echo started")))
    lines = []
    job = torchrun_job(spec, [(targets["node01"], (0, 1)), (targets["node02"], (0, 1))], handoff,
                       on_line=lambda host, rank, stream, line: lines.append((host, line)), rdzv_port="probe")
    job.start()
    handoff.settle()
    result = job.wait(timeout=120)
    assert result.failure is None and sorted(lines) == [("node01", "started"), ("node02", "started")]
    assert _opened(cluster, before) == {"node01": 1, "node02": 1, "node03": 1}
    assert handoff.opened == 3
    assert cluster.connections()["node03"] == 0  # released at once, not kept for the job's life


def test_a_connection_that_dropped_is_not_handed_on(fleet):
    cluster, targets, factory = fleet
    handoff = ConnectionHandoff(factory)
    first = handoff(targets["node01"])
    first.exec_command("true")[1].channel.recv_exit_status()
    cluster.drop_connections("node01")
    transport = first.get_transport()
    transport.join(30)  # its reader thread ends when it sees the close
    first.close()
    before = cluster.connections_opened()["node01"]
    second = handoff(targets["node01"])
    assert cluster.connections_opened()["node01"] == before + 1
    assert second.get_transport() is not transport and second.get_transport().is_active()
    second.close()
    handoff.settle()


def test_after_settle_a_close_is_a_close_and_nothing_is_kept(fleet):
    cluster, targets, factory = fleet
    handoff = ConnectionHandoff(factory)
    kept = handoff(targets["node02"])
    transport = kept.get_transport()
    kept.close()
    assert transport.is_active()  # kept for the next step
    handoff.settle()
    assert not transport.is_active()  # nobody took it: closed
    later = handoff(targets["node02"])
    assert isinstance(later, paramiko.SSHClient)  # after the start: a plain client, closed for real
    later.close()
    assert later.get_transport() is None or not later.get_transport().is_active()
