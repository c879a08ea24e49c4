"""Run files that outlived their job (airflow_hetero_gpu/launch/run_files.py): a launch on a host
removes that host's files of other jobs that ended unwatched longer ago than the retention, and
nothing else, over a real sshd."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from airflow_hetero_gpu.collect.ssh import paramiko_client_factory
from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.launch import Command, LaunchSpec, RemoteJob, Worker, build_commands
from airflow_hetero_gpu.launch.command import HostShare
from airflow_hetero_gpu.launch.run_files import RETENTION_DAYS, RUN_FILE_NAMES, sweep_line
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401

RUN_ROOT = Path.home() / ".hetero-gpu" / "run"
DAY = 86400.0


def _files(job: str, host: str, names: tuple[str, ...], age_days: float, text: str = "x\n") -> list[Path]:
    directory = RUN_ROOT / job
    directory.mkdir(parents=True, exist_ok=True)
    at = time.time() - age_days * DAY
    paths = []
    for name in names:
        path = directory / f"{host}.{name}"
        path.write_text(text, encoding="utf-8")
        os.utime(path, (at, at))
        paths.append(path)
    return paths


def _remote(cluster, command: str) -> str:
    host = cluster.hosts[0]
    factory = paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)
    with factory(SshTarget(host.name, host.address, host.port, cluster.user)) as client:
        _, out, _ = client.exec_command(command, timeout=30)
        return out.read().decode()


def _launch(cluster, job_id: str) -> None:
    host = cluster.hosts[0]
    target = SshTarget(host.name, host.address, host.port, cluster.user)
    [command] = build_commands(LaunchSpec(job_id, Command(("true",))), [HostShare(host.name, host.address, (0,))],
                               29400)
    factory = paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)
    result = RemoteJob(job_id, [Worker(target, 0, command)], factory).run(timeout=60)
    assert result.ok, result.as_dict()


def test_a_launch_removes_its_hosts_stale_run_files_of_jobs_that_ended_and_nothing_else(emulated_cluster):  # noqa: F811
    cluster = emulated_cluster(small_hosts(1, gpus=1))
    host = cluster.hosts[0].name
    scope = _remote(cluster, 'printf %s "$HETERO_GPU_SCOPE"')
    assert scope, "the emulated host exports no HETERO_GPU_SCOPE"
    tag = uuid.uuid4().hex[:10]
    ids = {name: f"t-runfiles-{name}-{tag}" for name in ("stale", "shared", "recent", "live", "sup", "notes", "self")}
    other_host = f"elsewhere-{tag}"  # a host this launch does not run on (a shared home)
    old = RETENTION_DAYS + 1.0
    stale = _files(ids["stale"], host, ("out", "err", "exit", "deadman", "relayed", "heartbeat", "launch", "sup"), old,
                   text="999999999\n")
    shared_mine = _files(ids["shared"], host, ("out", "exit"), old)
    shared_other = _files(ids["shared"], other_host, ("out", "exit"), old)
    recent = _files(ids["recent"], host, ("out", "deadman"), RETENTION_DAYS - 1.0)
    notes_mine = _files(ids["notes"], host, ("out",), old)
    notes_person = _files(ids["notes"], host, ("notes",), old)  # not a run file: a person's
    own = _files(ids["self"], host, ("out",), old)  # the launching job's own files (a retry reads them)
    # a job started long ago without supervision: only its old pid file, its processes still running
    live_env = {**os.environ, "HETERO_GPU_JOB_ID": ids["live"], "HETERO_GPU_HOST": host, "HETERO_GPU_SCOPE": scope}
    live_proc = subprocess.Popen(["sleep", "600"], env=live_env, start_new_session=True)
    # a supervisor still running (its job between two processes): its old .sup names it
    sup_proc = subprocess.Popen(["sh", "-c", "sleep 600", "hetero-gpu-supervisor"], start_new_session=True)
    try:
        live = _files(ids["live"], host, ("pgid",), old, text=f"{live_proc.pid}\n")
        sup = _files(ids["sup"], host, ("sup", "out"), old, text=f"{sup_proc.pid}\n")

        _launch(cluster, ids["self"])

        assert not any(p.exists() for p in stale) and not (RUN_ROOT / ids["stale"]).exists()
        assert not any(p.exists() for p in shared_mine)
        assert all(p.exists() for p in shared_other), "another host's files were touched"
        assert all(p.exists() for p in recent), "files younger than the retention were removed"
        assert all(p.exists() for p in live), "a running job's pid file was removed"
        assert all(p.exists() for p in sup), "a running supervisor's files were removed"
        assert not any(p.exists() for p in notes_mine) and all(p.exists() for p in notes_person)
        assert all(p.exists() for p in own), "the launching job's own files were removed"
    finally:
        for proc in (live_proc, sup_proc):
            proc.kill()
            proc.wait(timeout=30)
        for job in ids.values():
            for path in (RUN_ROOT / job).glob("*"):
                path.unlink()
            if (RUN_ROOT / job).exists():
                (RUN_ROOT / job).rmdir()


def test_the_sweep_line_takes_only_a_whole_number_of_days():
    line = sweep_line("job-1", "node01", "exit 0", ".hetero-gpu/run", days=3)
    assert line.startswith("sh -c ") and " hetero-gpu-stale node01 3 job-1 " in line
    assert line.endswith("</dev/null >/dev/null 2>&1 || :")
    for bad in (0, -1, 1.5, True, "7"):
        with pytest.raises(ValueError, match="run file retention"):
            sweep_line("job-1", "node01", "exit 0", ".hetero-gpu/run", days=bad)
    assert {"pgid", "sup", "heartbeat", "relayed", "exit", "deadman", "payload"} <= set(RUN_FILE_NAMES)
