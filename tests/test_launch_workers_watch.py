"""The workers watch run by a real /bin/sh against real processes carrying the job's markers.

An "agent" (the job's markers only) and a "worker" (the markers and TORCHELASTIC_RUN_ID, as
torchrun gives its workers): the watch counts the worker only, and says ``gone`` once the
worker ended, while the agent still runs; a worker that is a zombie (ended, not yet reaped by its
parent, as torchrun's may be for a moment) counts as ended.
"""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from airflow_hetero_gpu.launch.workers_watch import workers_command


def _proc(job: str, worker: bool) -> subprocess.Popen:
    env = {"PATH": os.environ["PATH"], "HETERO_GPU_JOB_ID": job, "HETERO_GPU_HOST": "node01"}
    if worker:
        env["TORCHELASTIC_RUN_ID"] = job
    return subprocess.Popen(["sleep", "120"], env=env)


@pytest.fixture
def job():
    job = f"watch-{uuid.uuid4().hex[:8]}"
    procs: list[subprocess.Popen] = []
    yield job, procs
    for p in procs:
        p.kill()
        p.wait()


def _watch(job: str, seconds: float) -> subprocess.Popen:
    return subprocess.Popen(["sh", "-c", workers_command(job, "node01", seconds)], stdout=subprocess.PIPE, text=True)


def test_the_watch_counts_the_workers_not_the_agent_and_says_when_they_are_gone(job):
    job_id, procs = job
    agent, worker = _proc(job_id, False), _proc(job_id, True)
    procs += [agent, worker]
    watch = _watch(job_id, 60)
    assert watch.stdout.readline() == "workers 1\n"
    worker.kill()  # not reaped: a zombie until the fixture waits for it
    assert watch.stdout.readline() == "gone\n"
    assert watch.wait(10) == 0
    assert agent.poll() is None  # the agent was neither counted nor touched


def test_a_job_without_torchrun_workers_says_so_at_once(job):
    job_id, procs = job
    procs.append(_proc(job_id, False))
    watch = _watch(job_id, 60)
    out, _ = watch.communicate(timeout=10)
    assert out == "workers 0\n"


def test_workers_still_running_after_the_watch_s_time(job):
    job_id, procs = job
    procs.append(_proc(job_id, True))
    out, _ = _watch(job_id, 0.3).communicate(timeout=10)
    assert out == "workers 1\nstill running\n"


def test_the_command_quotes_its_arguments_and_checks_them():
    with pytest.raises(ValueError):
        workers_command("bad id; rm -rf /", "node01", 1)
    with pytest.raises(ValueError):
        workers_command("job", "node 01", 1)
