"""The real launcher (torchrun over SSH, gloo, the example training) across hosts of the embedded
emulated fleet, and its watchdog: a launcher that dies ends the job through stdin end-of-file.

The same launch tests as ``test_launch_remote.py`` run against real sshd; these show that the
embedded server runs the launcher's scripts as real processes, pipes their output back, keeps
the sessions alive (keepalives), and closes a session's stdin when its client goes away.
"""

from __future__ import annotations

import re

import pytest
from test_launch_remote import (
    EPOCH,
    Lines,
    _sigkilled_launcher,
    assert_nothing_left,
    command_job,
    marked_pids,
    needs_torch,
    new_job_id,
    train_job,
)

from airflow_hetero_gpu.launch import JobFailure
from airflow_hetero_gpu.launch.command import WATCHDOG_GRACE_S
from airflow_hetero_gpu.launch.orphans import KILL_WAIT_S
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import embedded_cluster  # noqa: F401


@pytest.fixture
def two_hosts(embedded_cluster):
    return embedded_cluster(small_hosts(2))


@needs_torch
def test_trains_across_two_embedded_hosts(two_hosts, tmp_path):
    job_id = new_job_id("emb-train")
    lines = Lines()
    result = train_job(two_hosts, tmp_path, job_id, ["--epochs", "3", "--checkpoint-dir", str(tmp_path / "ckpt")],
                       lines).run(timeout=300)
    assert result.ok, lines.text()
    assert [(h.host, h.rank, h.exit_code) for h in result.hosts] == [("node01", 0, 0), ("node02", 1, 0)]
    ranks = {int(m.group(1)) for m in (re.match(r"rank (\d) of 4 ", line) for line in lines.lines()) if m}
    assert ranks == {0, 1, 2, 3}
    losses = [float(m.group(2)) for m in map(EPOCH.match, lines.lines()) if m]
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    assert (tmp_path / "ckpt" / "checkpoint.pt").is_file()
    assert_nothing_left(job_id)


@needs_torch
def test_a_killed_launcher_ends_the_job_through_stdin_eof(two_hosts, tmp_path):
    """SIGKILL the launcher mid-training: its connections vanish, the server closes each
    session's stdin, and each host's watchdog ends its share of the job."""
    job_id = new_job_id("emb-orphan")
    _sigkilled_launcher(two_hosts, tmp_path, job_id)
    assert_nothing_left(job_id, timeout=WATCHDOG_GRACE_S + KILL_WAIT_S + 5)


def test_a_failing_host_ends_the_other(two_hosts, tmp_path):
    job_id = new_job_id("emb-fail")
    lines = Lines()
    # node02 fails once node01's share runs (both "hosts" are this machine: a file says so)
    script = ('if [ "$HETERO_GPU_NODE_RANK" = 1 ]; then while [ ! -e "$1" ]; do sleep 0.05; done; '
              'echo boom >&2; exit 4; fi; touch "$1"; exec sleep 60')
    job = command_job(two_hosts, job_id, ("sh", "-c", script, "sh", str(tmp_path / "running")), lines,
                      kill_grace=2.0)
    with pytest.raises(JobFailure) as caught:
        job.run(timeout=60)
    assert (caught.value.host, caught.value.exit_code, caught.value.tail[-1]) == ("node02", 4, "boom")
    result = job.wait()
    assert result.cleanup["node01"].found and result.cleanup["node01"].clean
    assert_nothing_left(job_id)


def test_sshd_killed_mid_job_fails_that_host_and_its_watchdog_ends_the_rest(two_hosts):
    job_id = new_job_id("emb-sshd")
    lines = Lines()
    job = command_job(two_hosts, job_id, ("sh", "-c", "echo ready; exec sleep 300"), lines, kill_grace=2.0)
    job.start()
    lines.wait_for(lambda line: line == "ready", timeout=30, count=2)
    assert len(marked_pids(job_id)) == 2
    two_hosts.inject_fault("node02", "sshd_killed")
    result = job.wait(timeout=60)
    assert result.failure is not None and result.failure.host == "node02"
    assert result.failure.exit_code is None
    assert result.cleanup["node01"].found and result.cleanup["node01"].clean
    assert_nothing_left(job_id, timeout=WATCHDOG_GRACE_S + KILL_WAIT_S + 5)
