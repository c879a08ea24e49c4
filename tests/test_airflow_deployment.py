"""Faults that need Airflow's components as separate processes, as a real deployment runs them
(api-server, scheduler with LocalExecutor, dag-processor, triggerer; `airflow dags test` runs
everything in one process and cannot show these): the triggerer restarted while a task waits
deferred for capacity, and secrets in ``env`` masked in the task log file the task supervisor
writes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from airflow_hetero_gpu.core.inventory import load_cluster
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.operators.hetero_train import default_job_id
from airflow_hetero_gpu.testing import EmulatedCluster
from airflow_hetero_gpu.testing.airflow_env import AirflowDeployment, connection_env
from airflow_hetero_gpu.testing.demo import small_hosts
from dag_run_helpers import DAGS, SCRIPT, leftovers, losses
from ledger_files import new_ledger

pytest.importorskip("torch", reason="torch (CPU build) is needed to train the example model")

SECRET = f"s3cr3t-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    with EmulatedCluster(root / "cluster", small_hosts(2, gpus=2)) as cluster:
        yield cluster, root


@pytest.fixture(scope="module")
def airflow(fleet):
    cluster, root = fleet
    conns, ids = connection_env(cluster)
    cfg = {"ssh_conn_ids": ids, "script": SCRIPT, "ledger_url": new_ledger(root / 'ledger.db'),
           "captures_dir": str(root / "captures"), "workdir": str(root), "gpu_count": 4,
           "script_args": ["--epochs", "3"], "wait_for_capacity": True, "deferrable": True,
           "capacity_poll_interval": 1, "capacity_timeout": 600}
    command_cfg = {"script": None, "gpu_count": 2, "command": ["sh", "-c", 'echo "token=$API_TOKEN"'],
                   "env": {"API_TOKEN": SECRET}}
    # the first try holds after epoch 2 until the test has killed it (and touched the file), so
    # it cannot finish first; the retry finds the file and trains straight through
    retry_cfg = {"wait_for_capacity": False, "deferrable": False, "lease_seconds": 9,
                 "script_args": ["--epochs", "30", "--hold-after-epoch", "2",
                                 "--hold-file", str(root / "retry-released")]}
    # durable: the first try holds after epoch 3 until the test has seen the retry reattach
    durable_cfg = {"wait_for_capacity": False, "deferrable": False, "durable": True, "unattended_timeout": 60,
                   "preemption_grace": 5, "lease_seconds": 90, "host_timeout": 8,
                   "script_args": ["--epochs", "8", "--hold-after-epoch", "3",
                                   "--hold-file", str(root / "durable-released")]}
    with AirflowDeployment(root / "airflow", DAGS, {
        **conns, "HG_TEST_CONFIG": json.dumps(cfg), "HG_TEST_COMMAND_CONFIG": json.dumps(command_cfg),
        "HG_TEST_RETRY_CONFIG": json.dumps(retry_cfg), "HG_TEST_DURABLE_CONFIG": json.dumps(durable_cfg),
    }) as deployment:
        deployment.cfg = cfg
        yield deployment


def _block_every_gpu(cluster, cfg) -> None:
    """Another job holds all four GPUs (a reservation made straight in the ledger)."""
    captures = Path(cfg["captures_dir"]) / "blocker"
    subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", "collect", "--hosts", cluster.hosts_arg(),
                    "--identity-file", str(cluster.identity_file), "--known-hosts", str(cluster.known_hosts_path),
                    "--out", str(captures)], check=True, capture_output=True, timeout=120)
    with Ledger.from_url(cfg["ledger_url"]) as ledger:
        result = ledger.reserve("blocker", load_cluster(captures), PlanRequest(gpus=4), lease_seconds=900)
        assert result.decision is not None and len(result.decision.gpus) == 4


def test_triggerer_restarted_during_a_deferred_wait(airflow, fleet):
    """The task defers while another job holds every GPU; the triggerer is SIGKILLed and started
    again; the new triggerer takes the trigger over from the database and keeps watching the queue entry;
    when the GPUs are released the task resumes on a worker, trains and succeeds."""
    cluster, _ = fleet
    cfg = airflow.cfg
    _block_every_gpu(cluster, cfg)
    run_id = airflow.trigger("hg_train_test")
    airflow.wait_for_state("hg_train_test", run_id, "train", {"deferred"}, timeout=300)
    owner = lambda: [r[0] for r in airflow.query("select triggerer_id from trigger")]  # noqa: E731
    (old,) = airflow.wait_for(lambda: owner() if owner() and owner()[0] else None, timeout=120,
                              what="trigger assigned to the triggerer")

    airflow.restart("triggerer", signal.SIGKILL)
    # the new triggerer takes the trigger over once the dead one's heartbeat is stale (10 s here)
    airflow.wait_for(lambda: owner() and owner()[0] not in (None, old), timeout=180,
                     what="trigger taken over by the new triggerer")
    time.sleep(3)  # it looks at the queue entry there (every second) and is not admitted
    assert airflow.task_state("hg_train_test", run_id, "train") == "deferred"

    with Ledger.from_url(cfg["ledger_url"]) as ledger:
        assert ledger.release("blocker")
    state = airflow.wait_for_state("hg_train_test", run_id, None, {"success", "failed"}, timeout=420)
    log = airflow.task_log("hg_train_test", run_id, "train")
    assert state == "success", log[-6000:] + airflow.component_log("scheduler")[-3000:]
    assert "deferring until one can" in log
    found = losses(log)
    assert len(found) == 3 and found[-1] < found[0], log[-4000:]
    with Ledger.from_url(cfg["ledger_url"]) as ledger:
        assert ledger.live_reservations() == []
    # this run's job only: other tests on the machine may be running the same DAG
    assert leftovers(default_job_id("hg_train_test", "train", run_id)) == ""


def test_env_secrets_are_masked_in_the_task_log_file(airflow):
    """A worker prints an env value given to the operator; the task log file the supervisor
    writes has it masked."""
    run_id = airflow.trigger("hg_command_test")
    state = airflow.wait_for_state("hg_command_test", run_id, None, {"success", "failed"}, timeout=300)
    log = airflow.task_log("hg_command_test", run_id, "run")
    assert state == "success", log[-4000:]
    assert "token=***" in log, log[-4000:]
    assert SECRET not in log
    assert SECRET[:12] not in log


def test_task_process_sigkilled_then_airflow_retries_it(airflow, fleet):
    """The process running the training task is SIGKILLed mid-training (no on_kill, no release):
    the task supervisor reports the task failed, the hosts' watchdogs end the job when its SSH
    sessions drop, and Airflow's retry (same job id) gets the GPUs back and trains to the end."""
    cfg = airflow.cfg
    run_id = airflow.trigger("hg_retry_test")
    airflow.wait_for(lambda: "epoch 2 loss" in airflow.task_log("hg_retry_test", run_id, "train"), timeout=300,
                     what="first try training")
    (job_id,) = [r.job_id for r in _live(cfg["ledger_url"])]
    victim = _task_process(airflow)
    os.kill(victim, signal.SIGKILL)
    (Path(airflow.cfg["workdir"]) / "retry-released").touch()  # a try started from now does not hold
    state = airflow.wait_for_state("hg_retry_test", run_id, None, {"success", "failed"}, timeout=420)
    log = airflow.task_log("hg_retry_test", run_id, "train")
    assert state == "success", log[-6000:]
    tries = airflow.query("select try_number from task_instance where dag_id = ? and run_id = ? and task_id = ?",
                          "hg_retry_test", run_id, "train")
    assert tries == [(2,)]
    second = (airflow.home / "logs" / "dag_id=hg_retry_test" / f"run_id={run_id}" / "task_id=train"
              / "attempt=2.log").read_text()
    assert f"job {job_id}: reservation released" in second and len(losses(second)) == 30
    assert _live(cfg["ledger_url"]) == [] and leftovers(job_id) == ""


def test_task_process_sigkilled_then_the_retry_reattaches_to_the_running_job(airflow, fleet):
    """Durable: the process running the training task is SIGKILLed mid-training. The job keeps
    running on the hosts (the same processes), Airflow's retry reads the job's handle from the
    task state store and reattaches (no second launch, no new reservation, no resume from a
    checkpoint: the epochs go on where they were), relays the output from where the first try
    stopped, and ends success with nothing left on the hosts or in the ledger."""
    from airflow_hetero_gpu.launch.command import JOB_ENV
    from airflow_hetero_gpu.testing import procs

    cfg = airflow.cfg
    run_id = airflow.trigger("hg_durable_test")
    job_id = default_job_id("hg_durable_test", "train", run_id)
    logs = lambda: _attempt_logs(airflow, "hg_durable_test", run_id, "train")  # noqa: E731
    airflow.wait_for(lambda: "holding after epoch 3" in airflow.task_log("hg_durable_test", run_id, "train"),
                     timeout=300, what="first try holding after epoch 3")
    time.sleep(4)  # two heartbeats: the hosts know how far the output was relayed
    (held,) = [r for r in _live(cfg["ledger_url"]) if r.job_id == job_id]
    before = set(procs.with_env(JOB_ENV, job_id))
    assert before
    os.kill(_task_process(airflow), signal.SIGKILL)
    airflow.wait_for(lambda: "reattaching" in logs().get("2", ""), timeout=240, what="the retry reattaching")
    assert before <= set(procs.with_env(JOB_ENV, job_id)), "the job's processes changed"   # the same processes
    (Path(cfg["workdir"]) / "durable-released").touch()
    state = airflow.wait_for_state("hg_durable_test", run_id, None, {"success", "failed"}, timeout=300)
    first, second = logs().get("1", ""), logs().get("2", "")
    assert state == "success", second[-6000:] + first[-3000:]
    assert first.count(f"job {job_id}: starting on") == 1 and "starting on" not in second, second[-4000:]
    assert f"job {job_id}: reattached on" in second
    epochs = lambda text: [int(e) for e in re.findall(r"epoch (\d+) loss", text)]  # noqa: E731
    assert epochs(first) == [1, 2, 3] and epochs(second) == [4, 5, 6, 7, 8], (epochs(first), epochs(second))
    assert "resumed" not in second and "leftover process" not in second
    assert f"job {job_id}: reservation released" in second
    with Ledger.from_url(cfg["ledger_url"]) as ledger:
        assert ledger.live_reservations() == [] and ledger.get(job_id) is None
    assert held.gpus and leftovers(job_id) == ""
    assert not (Path.home() / ".hetero-gpu" / "run" / job_id).exists()


def _attempt_logs(airflow, dag_id: str, run_id: str, task_id: str) -> dict[str, str]:
    """Each try's task log file, by try number (as text), from every log home."""
    out: dict[str, str] = {}
    for home in airflow.log_homes().values():
        root = home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        for path in sorted(root.rglob("attempt=*.log")):
            key = path.stem.split("=", 1)[1]
            out[key] = out.get(key, "") + path.read_text(errors="replace")
    return out


def _live(url: str) -> list:
    with Ledger.from_url(url) as ledger:
        return ledger.live_reservations()


def _task_process(airflow) -> int:
    """The pid of the process that runs the task's code: the deepest Airflow process under the
    scheduler (scheduler -> LocalExecutor worker -> task supervisor -> task)."""
    from airflow_hetero_gpu.testing import procs

    tree = procs.descendants(airflow.procs["scheduler"].pid)
    python = {pid: depth for pid, depth in tree.items() if b"python" in procs.command_line(pid)
              or b"airflow" in procs.command_line(pid)}
    assert python, "no task process under the scheduler"
    return max(python, key=lambda pid: python[pid])
