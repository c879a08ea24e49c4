"""Remote jobs against the emulated cluster (real sshd per host), with real torchrun.

Every "host" is this machine, so a job's processes on all hosts are visible here: the tests
check that nothing is left with ``pgrep -f <job id>`` (torchrun and the launch shells carry the
job id on their command line) and by the ``HETERO_GPU_JOB_ID`` marker in ``/proc/*/environ``
(which torchrun's workers inherit).
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

from airflow_hetero_gpu.collect.ssh import paramiko_client_factory
from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.examples import script_path
from airflow_hetero_gpu.launch import (
    Command,
    JobFailure,
    JobKilled,
    JobStartError,
    LaunchSpec,
    RemoteJob,
    Torchrun,
    Worker,
    build_commands,
    find_orphans,
    kill_orphans,
    probe_free_port,
    torchrun_job,
)
from airflow_hetero_gpu.launch.command import JOB_ENV, WATCHDOG_GRACE_S, HostShare
from airflow_hetero_gpu.launch.orphans import KILL_WAIT_S
from airflow_hetero_gpu.testing import procs
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(script_path("train_tiny.py"))
LAUNCHER = (sys.executable, "-m", "torch.distributed.run")
EPOCH = re.compile(r"^epoch (\d+) loss ([0-9.]+)$")
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (pip install torch==2.13.0)")


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def new_job_id(tag: str) -> str:
    return f"t-{tag}-{uuid.uuid4().hex[:10]}"


def targets_of(cluster) -> list[SshTarget]:
    return [SshTarget(h.name, h.address, h.port, cluster.user) for h in cluster.hosts]


def factory_of(cluster):
    return paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)


class Lines:
    """A thread-safe ``on_line`` callback that records ``(host, rank, stream, line)``."""

    def __init__(self) -> None:
        self.items: list[tuple[str, int, str, str]] = []
        self._cond = threading.Condition()

    def __call__(self, host: str, rank: int, stream: str, line: str) -> None:
        with self._cond:
            self.items.append((host, rank, stream, line))
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = 60.0,
                 count: int = 1) -> tuple[str, int, str, str]:
        """The ``count``-th line matching ``predicate`` (waits for it up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                matching = [item for item in self.items if predicate(item[3])]
                if len(matching) >= count:
                    return matching[count - 1]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no matching line within {timeout} s; got: {self.text()[-2000:]}")
                self._cond.wait(left)

    def text(self) -> str:
        return "\n".join(f"[{h}/{r} {s}] {line}" for h, r, s, line in list(self.items))

    def lines(self) -> list[str]:
        return [item[3] for item in list(self.items)]


def marked_pids(job_id: str) -> list[int]:
    """Processes on this machine whose environment carries the job marker."""
    return procs.with_env(JOB_ENV, job_id)


def pgrep(job_id: str) -> list[int]:
    proc = subprocess.run(["pgrep", "-f", job_id], capture_output=True, text=True, check=False)
    return [int(p) for p in proc.stdout.split()]


def assert_nothing_left(job_id: str, timeout: float = 3.0) -> None:
    """No process of the job on any emulated host (polls briefly for the reaping to finish),
    and no pid file: the hosts' shared run directory of the job is gone."""
    run_dir = Path.home() / ".hetero-gpu" / "run" / job_id
    deadline = time.monotonic() + timeout
    while True:
        left = sorted(set(pgrep(job_id)) | set(marked_pids(job_id)))
        if (not left and not run_dir.exists()) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not run_dir.exists() or left, f"pid files left behind: {sorted(os.listdir(run_dir))}"
    details = []
    for pid in left:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200]
        except OSError:
            continue
        details.append(f"{pid}: {cmdline!r}")
    assert not left, "processes left behind: " + "; ".join(details)


def train_job(cluster, tmp_path: Path, job_id: str, args: list[str], lines: Lines, **options) -> RemoteJob:
    spec = LaunchSpec(job_id, Torchrun(TRAIN, tuple(args), launcher=LAUNCHER, nproc_per_node=2),
                      env={"OMP_NUM_THREADS": "1"}, workdir=str(tmp_path))
    placements = [(target, (0, 1)) for target in targets_of(cluster)]
    options.setdefault("kill_grace", 5.0)
    return torchrun_job(spec, placements, factory_of(cluster), on_line=lines, **options)


def command_job(cluster, job_id: str, argv: tuple[str, ...], lines: Lines | None = None, **options) -> RemoteJob:
    targets = targets_of(cluster)
    shares = [HostShare(t.host_name, t.address, (0, 1)) for t in targets]
    commands = build_commands(LaunchSpec(job_id, Command(argv)), shares, 29400)
    workers = [Worker(t, rank, c) for rank, (t, c) in enumerate(zip(targets, commands))]
    return RemoteJob(job_id, workers, factory_of(cluster), on_line=lines, **options)


@pytest.fixture
def two_hosts(emulated_cluster):
    return emulated_cluster(small_hosts(2))


# ---------------------------------------------------------------------------------------------
# Real torchrun across two emulated hosts
# ---------------------------------------------------------------------------------------------


@needs_torch
def test_trains_across_two_hosts_then_resumes_from_checkpoint(two_hosts, tmp_path):
    job_id = new_job_id("train")
    ckpt = tmp_path / "ckpt"
    lines = Lines()
    result = train_job(two_hosts, tmp_path, job_id, ["--epochs", "3", "--checkpoint-dir", str(ckpt)], lines).run()

    assert result.ok, lines.text()
    assert [(h.host, h.rank, h.exit_code) for h in result.hosts] == [("node01", 0, 0), ("node02", 1, 0)]
    assert all(isinstance(h.pgid, int) and h.pgid > 1 for h in result.hosts)
    # Every line comes with the host and node rank it was printed on.
    node_rank = {"node01": 0, "node02": 1}
    assert {(h, r) for h, r, _, _ in lines.items} == set(node_rank.items())
    ranks_by_host: dict[str, set[int]] = {"node01": set(), "node02": set()}
    for host, _, _, line in lines.items:
        joined = re.match(r"rank (\d) of 4 ", line)
        if joined:
            ranks_by_host[host].add(int(joined.group(1)))
    assert sorted(ranks_by_host["node01"] | ranks_by_host["node02"]) == [0, 1, 2, 3]
    assert len(ranks_by_host["node01"]) == len(ranks_by_host["node02"]) == 2
    losses = [float(m.group(2)) for m in map(EPOCH.match, lines.lines()) if m]
    assert len(losses) == 3, lines.text()
    assert losses[-1] < losses[0], f"loss did not fall: {losses}"
    assert (ckpt / "checkpoint.pt").is_file()
    assert_nothing_left(job_id)

    lines2 = Lines()
    result2 = train_job(two_hosts, tmp_path, job_id, ["--epochs", "5", "--checkpoint-dir", str(ckpt)], lines2).run()
    assert result2.ok, lines2.text()
    assert sum("resumed from epoch 3" in line for line in lines2.lines()) == 4, lines2.text()
    epochs = [int(m.group(1)) for m in map(EPOCH.match, lines2.lines()) if m]
    assert epochs == [4, 5]
    assert_nothing_left(job_id)


@needs_torch
def test_worker_crash_fails_the_job_on_that_host_and_leaves_nothing(two_hosts, tmp_path):
    job_id = new_job_id("crash")
    lines = Lines()
    job = train_job(two_hosts, tmp_path, job_id, ["--epochs", "50", "--fail-at-epoch", "2", "--fail-rank", "3"], lines)
    with pytest.raises(JobFailure) as caught:
        job.run(timeout=120)
    failure = caught.value
    crash_host = lines.wait_for(lambda line: "simulated crash at epoch 2" in line, timeout=0)[0]
    assert failure.exit_code == 1                      # torchrun's status when a worker failed
    assert failure.host in str(failure) and "\n" not in str(failure)
    result = job.wait()
    # Usually the crash host's torchrun reports first; under load the peer's may (its rank saw
    # the connection drop). Either way the crash host's own output names the crash.
    if failure.host == crash_host:
        assert failure.summary == "torchrun root cause: rank 3 exitcode 3"
    else:
        assert (failure.summary or "").startswith("torchrun root cause: rank ")
    assert any("simulated crash at epoch 2" in line for line in result[crash_host].tail)
    assert result.failure is failure and not result.ok and not result.killed
    assert {h.host for h in result.hosts if h.exit_code != 0} >= {crash_host}
    assert_nothing_left(job_id)


@needs_torch
def test_kill_mid_training_leaves_nothing(two_hosts, tmp_path):
    job_id = new_job_id("kill")
    lines = Lines()
    job = train_job(two_hosts, tmp_path, job_id, ["--epochs", "100000", "--log-every", "5"], lines)
    job.start()
    lines.wait_for(lambda line: line.startswith("epoch 10 "), timeout=180)
    assert all(p is not None for p in job.pgids.values())
    killers = [threading.Thread(target=job.kill) for _ in range(2)]   # idempotent, any thread
    for thread in killers:
        thread.start()
    result = job.wait(timeout=60)
    for thread in killers:
        thread.join(timeout=30)
    assert result.killed and result.failure is None and not result.ok
    with pytest.raises(JobKilled):
        result.raise_for_failure()
    assert all(r.clean for r in result.cleanup.values()), result.cleanup
    assert_nothing_left(job_id)
    job.kill()                                                         # after the end: no-op


LAUNCHER_SCRIPT = """
import json, sys
sys.path.insert(0, {repo!r})
from airflow_hetero_gpu.collect.ssh import paramiko_client_factory
from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.launch import LaunchSpec, Torchrun, torchrun_job

cfg = json.load(open(sys.argv[1]))
summary = json.load(open(cfg["cluster"]))
targets = [SshTarget(h["name"], h["address"], h["port"], summary["user"]) for h in summary["hosts"]]
factory = paramiko_client_factory(summary["identity_file"], summary["known_hosts"])
spec = LaunchSpec(cfg["job_id"], Torchrun(cfg["script"], tuple(cfg["args"]), launcher=tuple(cfg["launcher"]),
                  nproc_per_node=2), env={{"OMP_NUM_THREADS": "1"}}, workdir=cfg["workdir"])

def on_line(host, rank, stream, line):
    print(host, rank, stream, line, flush=True)

torchrun_job(spec, [(t, (0, 1)) for t in targets], factory, on_line=on_line).run()
"""


@needs_torch
def _sigkilled_launcher(cluster, tmp_path, job_id, before_kill=None) -> None:
    """Start a training job from a separate launcher process, wait until every rank trains,
    call ``before_kill()``, then SIGKILL the launcher (its SSH connections drop with it)."""
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER_SCRIPT.format(repo=str(REPO)))
    config = tmp_path / "launch.json"
    config.write_text(json.dumps({
        "cluster": str(cluster.root / "cluster.json"), "job_id": job_id, "script": TRAIN,
        "args": ["--epochs", "100000", "--log-every", "100000"], "launcher": list(LAUNCHER),
        "workdir": str(tmp_path),
    }))
    launcher = subprocess.Popen([sys.executable, str(script), str(config)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    seen: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [seen.put(line) for line in launcher.stdout], daemon=True).start()
    try:
        deadline = time.monotonic() + 180
        joined, training = 0, False
        while joined < 4 or not training:   # every rank joined; rank 0 trains (silently from now)
            line = seen.get(timeout=max(0.1, deadline - time.monotonic()))
            joined += bool(re.search(r"rank \d of 4 ", line))
            training = training or " training: " in line
        if before_kill is not None:
            before_kill()
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)


def test_the_watchdog_ends_the_job_of_a_sigkilled_launcher(two_hosts, tmp_path):
    """The launcher dies without a word (SIGKILL): each host's watchdog sees its SSH session end
    and stops that host's share of the job, with no sweep from outside."""
    job_id = new_job_id("orphan")
    _sigkilled_launcher(two_hosts, tmp_path, job_id)
    # SIGTERM from the watchdog at once; torchrun passes it on to its workers
    assert_nothing_left(job_id, timeout=WATCHDOG_GRACE_S + KILL_WAIT_S + 5)


def test_orphans_without_a_watchdog_are_found_and_killed(two_hosts, tmp_path):
    """Where a host's watchdog is gone too (killed with its shell), the job's processes run on
    as orphans: the sweep finds them by their markers and ends them."""
    job_id = new_job_id("orphan")

    def kill_watchdogs():
        # the job's outer shells and their watchdogs: the only unmarked processes naming the job
        shells = [p for p in pgrep(job_id) if p not in marked_pids(job_id)]
        assert shells, "no launch shell found"
        for pid in shells:
            os.kill(pid, signal.SIGKILL)

    _sigkilled_launcher(two_hosts, tmp_path, job_id, kill_watchdogs)
    time.sleep(2)
    targets, factory = targets_of(two_hosts), factory_of(two_hosts)
    found = find_orphans(job_id, targets, factory)
    for host in ("node01", "node02"):
        assert found[host].error is None
        commands = [p.command for p in found[host].found]
        assert any("torch.distributed.run" in c for c in commands), commands
        assert sum("train_tiny.py" in c and "torch.distributed.run" not in c for c in commands) == 2, commands
    assert pgrep(job_id) and marked_pids(job_id)

    killed = kill_orphans(job_id, targets, factory, grace=5.0)
    assert {h: (bool(r.found), r.left, r.error) for h, r in killed.items()} == {
        "node01": (True, [], None), "node02": (True, [], None)}
    assert all(not r.found for r in find_orphans(job_id, targets, factory).values())
    # the processes are gone; the pid files stay (their shells were killed before removing them)
    left = sorted(set(pgrep(job_id)) | set(marked_pids(job_id)))
    assert not left, left
    shutil.rmtree(Path.home() / ".hetero-gpu" / "run" / job_id, ignore_errors=True)


def test_a_sweep_reaches_only_its_own_hosts_processes_where_hosts_share_a_process_table(emulated_cluster):  # noqa: F811
    """Two fleets whose hosts have the same names (node01, node02) on one machine, the same job id
    running on the first: the second fleet's sweep and job list see nothing of it (its hosts'
    HETERO_GPU_SCOPE differs), the first fleet's sweep finds and ends it."""
    from airflow_hetero_gpu.launch.orphans import jobs_on_host

    first, second = emulated_cluster(small_hosts(2)), emulated_cluster(small_hosts(2))
    job_id = new_job_id("scope")
    lines = Lines()
    job = command_job(first, job_id, ("sh", "-c", "echo ready; sleep 120 & wait"), lines)
    job.start()
    try:
        lines.wait_for(lambda line: line == "ready", timeout=30, count=2)
        other, factory = targets_of(second), factory_of(second)
        assert all(not r.found and r.error is None for r in find_orphans(job_id, other, factory).values())
        killed = kill_orphans(job_id, other, factory, grace=1.0)
        assert all(not r.found for r in killed.values()), killed
        with factory(other[0]) as client:
            assert job_id not in jobs_on_host(client, "node01")
        with factory_of(first)(targets_of(first)[0]) as client:
            assert job_id in jobs_on_host(client, "node01")
        assert len(marked_pids(job_id)) >= 2  # still running
        found = find_orphans(job_id, targets_of(first), factory_of(first))
        assert all(r.found for r in found.values()), found
    finally:
        job.kill()
        job.wait(timeout=60)
    assert_nothing_left(job_id)


# ---------------------------------------------------------------------------------------------
# Generic commands: quick checks of streaming, failures, kill and start errors (no torch)
# ---------------------------------------------------------------------------------------------


def test_command_mode_keeps_arguments_literal_on_every_host(two_hosts):
    pwned = Path("/tmp") / f"pwned-{uuid.uuid4().hex}"
    args = (f"; touch {pwned}", f"$(touch {pwned})", "`id`", "a'b\"c", "*")
    lines = Lines()
    job_id = new_job_id("cmd")
    result = command_job(two_hosts, job_id, ("sh", "-c", 'printf "%s\\n" "$HETERO_GPU_HOST" "$@"', "sh", *args),
                         lines).run(timeout=30)
    assert result.ok
    for rank, host in enumerate(("node01", "node02")):
        assert [line for h, r, s, line in lines.items if h == host and s == "stdout"] == [host, *args]
        assert result[host].rank == rank and result[host].tail[-len(args) - 1:] == [host, *args]
    assert not pwned.exists()
    assert_nothing_left(job_id)


def test_output_is_streamed_and_tail_is_bounded(two_hosts):
    lines = Lines()
    job_id = new_job_id("tail")
    script = ("head -c 2500 /dev/zero | tr '\\0' x; echo; i=0; while [ $i -lt 2000 ]; do echo line-$i; "
              "i=$((i + 1)); done; echo to-stderr >&2")
    job = command_job(two_hosts, job_id, ("sh", "-c", script), lines, tail_lines=50, max_line_bytes=1000)
    result = job.run(timeout=60)
    for host in ("node01", "node02"):
        out = [line for h, r, s, line in lines.items if h == host and s == "stdout"]
        err = [line for h, r, s, line in lines.items if h == host and s == "stderr"]
        assert out == ["x" * 1000, "x" * 1000, "x" * 500] + [f"line-{i}" for i in range(2000)]
        assert err[-1:] == ["to-stderr"]     # the login shell's rc files may print before
        # The last 50 lines; stdout and stderr are read by separate threads, so where the one
        # stderr line falls among them is up to timing.
        tail = result[host].tail
        from_stdout = [line for line in tail if line != "to-stderr"]
        assert len(tail) == 50 and len(from_stdout) >= 49
        assert from_stdout == [f"line-{i}" for i in range(2000 - len(from_stdout), 2000)]


def test_a_failing_host_ends_the_others(two_hosts):
    job_id = new_job_id("fail")
    script = 'if [ "$HETERO_GPU_NODE_RANK" = 1 ]; then sleep 0.5; echo boom >&2; exit 4; fi; exec sleep 60'
    job = command_job(two_hosts, job_id, ("sh", "-c", script), kill_grace=2.0)
    started = time.monotonic()
    with pytest.raises(JobFailure) as caught:
        job.run(timeout=60)
    assert (caught.value.host, caught.value.rank, caught.value.exit_code) == ("node02", 1, 4)
    assert caught.value.tail[-1] == "boom" and str(caught.value) == (
        "worker on node02 (node rank 1) exited with status 4; boom")
    assert time.monotonic() - started < 20
    result = job.wait()
    assert result["node01"].exit_code != 0 and result.cleanup["node01"].found
    assert_nothing_left(job_id)


def test_sshd_killed_on_a_host_mid_job_fails_it_there_and_the_watchdog_ends_the_rest(two_hosts):
    """`pkill sshd` on node02 while the job runs: its session drops without an exit status,
    the job fails naming node02, node01 is swept, and node02's processes (unreachable: sshd is
    down) are ended by that host's watchdog."""
    job_id = new_job_id("sshd")
    lines = Lines()
    job = command_job(two_hosts, job_id, ("sh", "-c", "echo ready; exec sleep 300"), lines, kill_grace=2.0)
    job.start()
    lines.wait_for(lambda line: line == "ready", timeout=20, count=2)
    assert len(marked_pids(job_id)) == 2
    two_hosts.inject_fault("node02", "sshd_killed")
    result = job.wait(timeout=60)
    assert result.failure is not None and result.failure.host == "node02"
    assert result.failure.exit_code is None
    assert "ended without an exit status" in str(result.failure) or "no exit status" in str(result.failure)
    assert result.cleanup["node01"].found and result.cleanup["node01"].clean
    assert "cannot reconnect" in (result.cleanup["node02"].error or "")
    assert_nothing_left(job_id, timeout=WATCHDOG_GRACE_S + KILL_WAIT_S + 5)


def test_a_host_gone_silent_mid_job_is_given_up_after_host_timeout(two_hosts):
    """node02's sshd and sessions are SIGSTOPped (the network goes quiet, nothing is closed):
    the job prints nothing either way, so only the missing keepalive answers tell. The job
    fails naming node02 within host_timeout (plus a check), node01 is swept, and once node02
    speaks again its watchdog sees the dropped session and ends the job there."""
    job_id = new_job_id("silent")
    lines = Lines()
    job = command_job(two_hosts, job_id, ("sh", "-c", "echo ready; exec sleep 300"), lines, kill_grace=2.0,
                      keepalive_interval=0.5, host_timeout=4.0)
    job.start()
    lines.wait_for(lambda line: line == "ready", timeout=20, count=2)
    time.sleep(2)  # quiet but healthy: nobody is given up on
    assert job.pgids and not any(r.done.is_set() for r in job._runs)
    two_hosts.inject_fault("node02", "network_silent")
    silenced = time.monotonic()
    try:
        result = job.wait(timeout=60)
        given_up = time.monotonic() - silenced
    finally:
        two_hosts.clear_fault("node02", "network_silent")
    assert result.failure is not None and result.failure.host == "node02", result.failure
    assert "no answer from node02" in str(result.failure) and "SSH keepalive" in str(result.failure)
    assert 3.0 <= given_up < 4.0 + 1.0 + 2.0 + 30, given_up  # timeout, check period, the sweeps
    assert result.cleanup["node01"].found and result.cleanup["node01"].clean
    assert result.cleanup["node02"].error  # the sweep could not reach node02 while it was silent
    assert_nothing_left(job_id, timeout=WATCHDOG_GRACE_S + KILL_WAIT_S + 5)


def test_kill_ends_processes_that_ignore_sigterm(two_hosts):
    job_id = new_job_id("stubborn")
    lines = Lines()
    job = command_job(two_hosts, job_id, ("sh", "-c", "trap '' TERM; echo ready; sleep 60 & wait"), lines,
                      kill_grace=0.5)
    job.start()
    lines.wait_for(lambda line: line == "ready", timeout=20, count=2)
    job.kill()
    result = job.wait(timeout=30)
    assert result.killed
    assert all(r.clean and r.found for r in result.cleanup.values()), result.cleanup
    assert_nothing_left(job_id)


def test_kill_before_start_runs_nothing(two_hosts):
    job_id = new_job_id("early")
    job = command_job(two_hosts, job_id, ("sleep", "60"))
    job.kill()
    job.start()
    result = job.wait(timeout=10)
    assert result.killed and all(h.exit_code is None for h in result.hosts)
    assert_nothing_left(job_id)


def test_start_fails_before_running_anything_when_a_host_is_down(two_hosts):
    two_hosts.inject_fault("node02", "host_down")
    job_id = new_job_id("down")
    job = command_job(two_hosts, job_id, ("sleep", "60"))
    with pytest.raises(JobStartError) as caught:
        job.start()
    assert caught.value.host == "node02" and "\n" not in str(caught.value)
    assert_nothing_left(job_id)


def test_pgid_is_found_after_output_of_the_login_shell(two_hosts):
    job_id = new_job_id("rc")
    target = targets_of(two_hosts)[0]
    command = build_commands(LaunchSpec(job_id, Command(("echo", "program"))),
                             [HostShare(target.host_name, target.address)], 29400)[0]
    lines = Lines()
    job = RemoteJob(job_id, [Worker(target, 0, "echo from-bashrc; " + command)], factory_of(two_hosts),
                    on_line=lines)
    result = job.run(timeout=30)
    assert isinstance(job.pgids[target.host_name], int)
    assert [line for _, _, s, line in lines.items if s == "stdout"] == ["from-bashrc", "program"]
    assert result.ok


def test_a_broken_callback_does_not_stop_the_job(two_hosts):
    def on_line(host, rank, stream, line):
        raise RuntimeError("callback bug")

    result = command_job(two_hosts, new_job_id("cb"), ("sh", "-c", "echo one; echo two"), on_line).run(timeout=30)
    assert result.ok and result["node01"].tail[-2:] == ["one", "two"]


def test_probe_free_port_on_a_host(two_hosts):
    client = factory_of(two_hosts)(targets_of(two_hosts)[0])
    try:
        port = probe_free_port(client)
    finally:
        client.close()
    assert 1024 <= port <= 65535


def test_placements_from_a_planner_decision():
    from airflow_hetero_gpu.core.model import Decision, Gpu, Score
    from airflow_hetero_gpu.launch import placements_from_decision

    gpus = [Gpu("b", 5, "u5", "A100"), Gpu("b", 4, "u4", "A100"), Gpu("a", 0, "u0", "A100")]
    decision = Decision("A100", gpus, Score({}, 0.0), 1.0)
    targets = {"a": SshTarget("a", "10.0.0.1"), "b": SshTarget("b", "10.0.0.2")}
    assert placements_from_decision(decision, targets) == [(targets["b"], (4, 5)), (targets["a"], (0,))]
    with pytest.raises(ValueError, match="no SSH target for host"):
        placements_from_decision(decision, {"a": targets["a"]})
