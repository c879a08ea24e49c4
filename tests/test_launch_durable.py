"""Supervised (detached) jobs against the emulated cluster (real sshd per host): the job outlives
the SSH sessions that started it, a new watcher reattaches and relays its output from where the
last one stopped, and the dead-man switch stops a job nobody watches."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from airflow_hetero_gpu.launch import Command, LaunchSpec, RemoteJob, Worker, build_commands
from airflow_hetero_gpu.launch.command import HostShare
from airflow_hetero_gpu.launch.remote import attach_job
from airflow_hetero_gpu.launch.supervisor import (
    SUPERVISOR_LOST_EXIT, Supervision, parse_status, quick_exec, status_command,
)
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from test_launch_remote import Lines, assert_nothing_left, factory_of, marked_pids, targets_of

COUNT = "i=0; while [ $i -lt {n} ]; do echo \"line $i\"; echo \"err $i\" >&2; i=$((i+1)); sleep {pause}; done"


@pytest.fixture
def two_hosts(emulated_cluster):
    return emulated_cluster(small_hosts(2))


def supervised_job(cluster, job_id: str, argv, lines, sup: Supervision, **options) -> RemoteJob:
    targets = targets_of(cluster)
    shares = [HostShare(t.host_name, t.address, (0, 1)) for t in targets]
    commands = build_commands(LaunchSpec(job_id, Command(tuple(argv))), shares, 29400, sup)
    workers = [Worker(t, rank, c) for rank, (t, c) in enumerate(zip(targets, commands))]
    options.setdefault("keepalive_interval", 0.5)
    return RemoteJob(job_id, workers, factory_of(cluster), on_line=lines, supervision=sup, **options)


def statuses(cluster, job_id: str, launch: str) -> dict:
    factory = factory_of(cluster)
    out = {}
    for target in targets_of(cluster):
        client = factory(target)
        try:
            _, stdout, _ = client.exec_command(status_command(job_id, target.host_name), timeout=30)
            out[target.host_name] = parse_status(target.host_name, launch, stdout.read().decode())
        finally:
            client.close()
    return out


def drop_watcher(job: RemoteJob) -> None:
    """The watcher is gone without a word: every SSH connection of the job closes at once."""
    for run in job._runs:
        run.client.close()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return value


def test_a_supervised_job_outlives_its_watcher_and_a_reattach_relays_the_rest(two_hosts):
    job_id = f"t-detach-{uuid.uuid4().hex[:8]}"
    launch = uuid.uuid4().hex[:12]
    sup = Supervision(60, "TERM", 2, launch)
    first = Lines()
    job = supervised_job(two_hosts, job_id, ["sh", "-c", COUNT.format(n=40, pause=0.1)], first, sup)
    job.start()
    first.wait_for(lambda line: line == "line 8", count=2, timeout=60)
    time.sleep(1.2)  # a heartbeat or two with the offsets
    leaders = set(job.pgids.values())
    assert None not in leaders and leaders <= set(marked_pids(job_id))
    drop_watcher(job)
    time.sleep(1.0)
    assert leaders <= set(marked_pids(job_id))  # the same processes run on
    running = statuses(two_hosts, job_id, launch)
    assert {s.state for s in running.values()} == {"running"}, running

    second = Lines()
    again = attach_job(job_id, targets_of(two_hosts), factory_of(two_hosts), sup,
                       relayed={h: s.relayed for h, s in running.items()}, on_line=second, keepalive_interval=0.5)
    again.start()
    result = again.wait(timeout=120)
    assert result.ok, result
    assert set(again.pgids.values()) == leaders
    for host in ("node01", "node02"):
        for stream, word in (("stdout", "line"), ("stderr", "err")):
            got = [int(line.split()[1]) for lines in (first, second) for h, _, s, line in lines.items
                   if h == host and s == stream and re.fullmatch(rf"{word} \d+", line)]
            assert sorted(set(got)) == list(range(40)), (host, stream, got)   # no line lost
            assert len(got) - 40 <= 10, (host, stream, got)    # repeats: the last beat's lines at most
            later = [int(line.split()[1]) for h, _, s, line in second.items if h == host and s == stream]
            assert later and later[-1] == 39 and later[0] > 0, later   # the reattach did not start over
    assert_nothing_left(job_id, timeout=10)


def test_the_dead_man_switch_stops_a_job_nobody_watches(two_hosts, tmp_path):
    job_id = f"t-deadman-{uuid.uuid4().hex[:8]}"
    launch = uuid.uuid4().hex[:12]
    sup = Supervision(3, "TERM", 1, launch)
    lines = Lines()
    trap = tmp_path / "signalled"
    argv = ["sh", "-c", f"trap 'touch {trap}; exit 7' TERM; while :; do sleep 0.1; done"]
    job = supervised_job(two_hosts, job_id, argv, lines, sup)
    job.start()
    wait_for(lambda: len(marked_pids(job_id)) >= 2, 30, "the job on both hosts")
    time.sleep(4)  # heartbeats keep it alive past unattended_timeout
    assert marked_pids(job_id)
    dropped = time.monotonic()
    drop_watcher(job)
    wait_for(lambda: not marked_pids(job_id), 3 + 1 + 5 + 10, "the switch to stop the job")
    took = time.monotonic() - dropped
    assert took <= 3 + 1 + 2 * 1 + 5, took
    assert trap.exists()  # the preemption signal came first
    # the supervisor notes the end at its next look (a second)
    ended = wait_for(lambda: (st := statuses(two_hosts, job_id, launch)) and
                     all(s.state != "running" for s in st.values()) and st, 10, "the supervisors' exit files")
    assert {(s.state, s.exit_code, s.deadman) for s in ended.values()} == {("failed", 7, True)}, ended
    # a reattach now finds the end and reports it
    again = attach_job(job_id, targets_of(two_hosts), factory_of(two_hosts), sup, keepalive_interval=0.5)
    again.start()
    result = again.wait(timeout=60)
    assert result.failure is not None and result.failure.exit_code == 7
    assert_nothing_left(job_id, timeout=10)


def test_a_killed_supervisor_is_a_failure_not_a_hang(two_hosts):
    import os
    import signal

    job_id = f"t-suplost-{uuid.uuid4().hex[:8]}"
    sup = Supervision(60, "TERM", 1, uuid.uuid4().hex[:12])
    lines = Lines()
    job = supervised_job(two_hosts, job_id, ["sh", "-c", "sleep 600"], lines, sup)
    job.start()
    wait_for(lambda: len(marked_pids(job_id)) >= 2, 30, "the job")
    sup = Path.home() / ".hetero-gpu" / "run" / job_id / "node02.sup"
    wait_for(lambda: sup.exists() and sup.read_text().strip(), 30, "the supervisor's pid file")
    os.kill(int(sup.read_text()), signal.SIGKILL)
    result = job.wait(timeout=60)
    assert result.failure is not None and result.failure.host == "node02"
    assert result.failure.exit_code == SUPERVISOR_LOST_EXIT
    assert_nothing_left(job_id, timeout=10)


def test_quick_exec_reports_the_status(two_hosts):
    client = factory_of(two_hosts)(targets_of(two_hosts)[0])
    try:
        assert quick_exec(client.get_transport(), "sh -c 'exit 4'") == 4
    finally:
        client.close()


def test_unstopped_names_the_host_whose_share_could_not_be_stopped(two_hosts):
    """node02's sshd dies under a supervised job: the job fails there, node01 is swept, and node02
    cannot be reached, so its share runs on under its supervisor: ``unstopped()`` names it (the
    operator keeps the reservation for it). Once node02 is reachable again a sweep ends it; a job
    stopped everywhere leaves ``unstopped()`` empty."""
    import shutil

    from airflow_hetero_gpu.launch.orphans import kill_orphans

    job_id = f"t-unstopped-{uuid.uuid4().hex[:8]}"
    sup = Supervision(60, "TERM", 1, uuid.uuid4().hex[:12])
    job = supervised_job(two_hosts, job_id, ["sh", "-c", "sleep 600"], Lines(), sup)
    job.start()
    wait_for(lambda: len(marked_pids(job_id)) >= 2, 30, "the job on both hosts")
    two_hosts.inject_fault("node02", "sshd_killed")
    try:
        result = job.wait(timeout=60)
        assert result.failure is not None and result.failure.host == "node02"
        assert job.unstopped() == ["node02"], result.cleanup
        assert result.cleanup["node01"].clean and result.cleanup["node02"].error
        assert marked_pids(job_id)   # node02's share runs on
    finally:
        two_hosts.clear_fault("node02", "sshd_killed")
    assert all(s.clean for s in kill_orphans(job_id, targets_of(two_hosts), factory_of(two_hosts), grace=1).values())
    wait_for(lambda: not marked_pids(job_id), 10, "node02's share to end")
    shutil.rmtree(Path.home() / ".hetero-gpu" / "run" / job_id)  # node02's files: no watcher came back for them

    other = f"{job_id}-b"
    job = supervised_job(two_hosts, other, ["sh", "-c", "sleep 600"], Lines(), sup)
    job.start()
    wait_for(lambda: len(marked_pids(other)) >= 2, 30, "the second job on both hosts")
    job.kill()
    assert job.wait(timeout=60).killed and job.unstopped() == []
    assert_nothing_left(other, timeout=10)


def test_a_supervisor_ending_while_its_status_is_read_is_seen_with_its_exit_status(tmp_path):
    """The status looks at the supervisor before its exit file: the supervisor writes the file
    before it ends, so one that ends between the two looks is read with its status. Here it ends
    during the look at its process (a ``grep`` of ours writes its exit file, stops it and answers
    "gone"); read in the other order, the host would be "gone without an exit status"."""
    job_id, host, launch = "t-status-race", "node01", "l1"
    run = tmp_path / ".hetero-gpu" / "run" / job_id
    run.mkdir(parents=True)
    sup = subprocess.Popen(["sh", "-c", "sleep 60; :", "hetero-gpu-supervisor"])
    try:
        (run / f"{host}.launch").write_text(f"{launch}\n")
        (run / f"{host}.sup").write_text(f"{sup.pid}\n")
        shims = tmp_path / "bin"
        shims.mkdir()
        (shims / "grep").write_text(f"#!/bin/sh\necho 0 > {shlex.quote(str(run / (host + '.exit')))}\n"
                                    f"kill {sup.pid}\nexit 1\n")
        (shims / "grep").chmod(0o755)
        env = {**os.environ, "HOME": str(tmp_path), "PATH": f"{shims}:{os.environ['PATH']}"}
        out = subprocess.run(status_command(job_id, host), shell=True, env=env, capture_output=True, text=True,
                             timeout=60, check=True).stdout
        sup.wait(timeout=60)
        assert parse_status(host, launch, out) == parse_status(host, launch, f"launch {launch}\nexit 0\n"), out
        assert parse_status(host, launch, out).state == "succeeded", out
        # a supervisor that lives and has no exit file is running (the real grep)
        sup2 = subprocess.Popen(["sh", "-c", "sleep 60; :", "hetero-gpu-supervisor"])
        try:
            (run / f"{host}.exit").unlink()
            (run / f"{host}.sup").write_text(f"{sup2.pid}\n")
            env["PATH"] = os.environ["PATH"]
            out = subprocess.run(status_command(job_id, host), shell=True, env=env, capture_output=True,
                                 text=True, timeout=60, check=True).stdout
            assert parse_status(host, launch, out).state == "running", out
        finally:
            sup2.kill()
            sup2.wait()
    finally:
        sup.kill()
        sup.wait()
