"""HeteroTrainOperator end to end: `airflow dags test` against the emulated cluster (real sshd),
real torchrun (CPU, gloo) training the tiny example model across two hosts."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing.airflow_env import airflow_env, migrate
from cluster_fixtures import emulated_cluster  # noqa: F401
from dag_run_helpers import DAGS, airflow_home, finish, leftovers, run_leftovers, losses, run_dag, start_dag, two_hosts  # noqa: F401

pytest.importorskip("torch", reason="torch (CPU build) is needed to train the example model")

def test_trains_across_two_hosts_and_releases(airflow_home, two_hosts, tmp_path):
    r, out, cfg = run_dag(airflow_home, two_hosts, tmp_path, gpu_count=4, script_args=["--epochs", "6"])
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-6000:]
    found = losses(log)
    assert len(found) == 6 and found[-1] < found[0], found
    # every line of the workers reached the task log, prefixed by host and rank
    assert re.search(r"\[node01 rank 0\] ", log) and re.search(r"\[node02 rank 1\] ", log)
    decision = json.loads(out.read_text())
    assert decision["pool"] == "NVIDIA A100-SXM4-80GB"
    assert decision["hosts"] == ["node01", "node02"] and len(decision["gpus"]) == 4
    assert decision["run"]["exit_codes"] == {"node01": 0, "node02": 0}
    with Ledger.from_url(cfg["ledger_url"]) as ledger:
        assert ledger.live_reservations() == []
    assert leftovers(decision["job_id"]) == ""


def test_a_crashing_worker_fails_the_task_and_cleans_up(airflow_home, two_hosts, tmp_path):
    r, out, cfg = run_dag(airflow_home, two_hosts, tmp_path, gpu_count=4,
                       script_args=["--epochs", "50", "--fail-at-epoch", "2", "--fail-host", "node02"])
    log = r.stdout + r.stderr
    assert r.returncode != 0
    # the crash happened on node02 (exit 3 in its torchrun's root cause); whichever host noticed
    # first, the failure names node02 with that root cause
    assert re.search(r"job \S+: worker on node0[12] \(node rank [01]\) exited with \d+ first", log), log[-4000:]
    assert re.search(r"node02[^\n]*exitcode 3", log), log[-4000:]
    assert not out.exists()
    with Ledger.from_url(cfg["ledger_url"]) as ledger:
        assert ledger.live_reservations() == []
    assert run_leftovers(log) == ""


def test_shell_metacharacters_stay_literal(airflow_home, two_hosts, tmp_path):
    target = Path(f"/tmp/pwned-{uuid.uuid4().hex}")
    r, out, cfg = run_dag(airflow_home, two_hosts, tmp_path, gpu_count=2,
                       script_args=["--epochs", "1", "--tag", f"; touch {target}"])
    # the training script rejects the unknown argument: the point is that no shell ran it
    assert not target.exists()
    log = r.stdout + r.stderr
    assert f"; touch {target}" in log  # it arrived as one literal argument


DURABLE = {"durable": True, "unattended_timeout": 30, "preemption_grace": 5, "lease_seconds": 60}


@pytest.mark.parametrize("durable", [{}, DURABLE], ids=["plain", "durable"])
def test_killing_the_task_stops_every_process_and_releases(airflow_home, two_hosts, tmp_path, durable):
    """on_kill (the task cleared or marked failed in the UI) stops the job on every host and
    releases, whether the job runs beside its SSH sessions or detached under supervisors. A
    durable job is stopped only when the task was: a SIGTERM while the task is still `running`
    (a worker's machine shutting down, the api-server unreachable) leaves it training."""
    import signal
    import sqlite3
    import threading

    seen: dict[int, threading.Event] = {n: threading.Event() for n in (2, 4)}

    def on_line(line: str) -> None:
        found = re.search(r"epoch (\d+) loss", line)
        if found and int(found.group(1)) in seen:
            seen[int(found.group(1))].set()

    proc, pump, lines, out, cfg = start_dag(airflow_home, two_hosts, tmp_path, "kill", on_line,
                                            gpu_count=4, script_args=["--epochs", "100000", "--sleep", "0.2"],
                                            **durable)
    try:
        assert seen[2].wait(240), "".join(lines)[-4000:]
        with Ledger.from_url(cfg["ledger_url"]) as ledger:
            (res,) = ledger.live_reservations()
        job_id = res.job_id
        assert leftovers(job_id) != ""  # the workers run, under the job's marker
        if durable:  # not stopped by anyone: the job trains on
            proc.send_signal(signal.SIGTERM)
            assert seen[4].wait(240), "".join(lines)[-4000:]
            assert "nobody stopped the task (the task is still running)" in "".join(lines)
            assert proc.poll() is None and leftovers(job_id) != ""
        # what a person's "mark failed" does: the state first, then Airflow's SIGTERM
        with sqlite3.connect(airflow_home / "airflow.db", timeout=30) as db:
            db.execute("update task_instance set state = 'failed' where dag_id = 'hg_train_test' "
                       "and state = 'running'")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        pump.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = "".join(lines)
    assert "task killed: stopping job" in log, log[-4000:]
    if durable:
        assert f"task killed: stopping job {job_id} on every host (the task is failed)" in log, log[-4000:]
    assert leftovers(job_id) == ""
    with Ledger.from_url(cfg["ledger_url"]) as ledger:
        assert ledger.live_reservations() == []


@pytest.mark.parametrize("durable", [{}, DURABLE], ids=["plain", "durable"])
def test_an_evicted_gpu_is_replaced_and_the_job_resumes(airflow_home, two_hosts, tmp_path, durable):
    """A GPU of the running job is evicted (as the health sensor does): the operator swaps it for
    a healthy GPU of the pool in the ledger (SPEC §8), restarts the workers on the new set, and
    they resume from the checkpoint.

    No race between clocks: the job holds after epoch 3 (its checkpoint written) until the
    operator has replaced the GPU and stopped the workers (the hold ends only when the test sees
    the restart); the restarted job resumes past epoch 3 and does not hold again."""
    from airflow_hetero_gpu.core.model import GpuKey

    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    release = tmp_path / "release"
    evicted: list[str] = []

    def on_line(line: str) -> None:
        if not evicted and re.search(r"epoch 3 loss", line):
            with Ledger.from_url(ledger_url) as ledger:
                (res,) = ledger.live_reservations()
                victim = res.gpus[-1]
                ledger.evict(GpuKey(victim.host, victim.index), victim.uuid, ["ecc"])
                evicted.append(f"{victim.host}:{victim.index}")
        if re.search(r"job \S+: restarting on ", line):  # the old workers are stopped by now
            release.touch()

    proc, pump, lines, out, cfg = start_dag(
        airflow_home, two_hosts, tmp_path, "evict", on_line, gpu_count=2, ledger_url=ledger_url,
        script_args=["--epochs", "8", "--hold-after-epoch", "3", "--hold-file", str(release)],
        checkpoint_dir=str(tmp_path / "ckpt"), **durable)
    finish(proc, pump, timeout=600)
    log = "".join(lines)
    (tmp_path / "dag-run.log").write_text(log)
    assert proc.returncode == 0, log[-6000:]
    assert evicted == ["node01:1"]  # both GPUs of node01 were chosen (best fit on one host)
    assert re.search(r"GPU node01:1 replaced by node02:0", log), log[-4000:]
    assert re.search(r"rank 0 resumed from epoch 3", log), log[-4000:]
    assert losses(log)[-1] < losses(log)[0] and len(re.findall(r"epoch 8 loss", log)) == 1
    decision = json.loads(out.read_text())
    assert decision["run"]["restarts"] == 1
    assert decision["run"]["gpus"] == [{"host": "node01", "index": 0}, {"host": "node02", "index": 0}]
    with Ledger.from_url(ledger_url) as ledger:
        assert ledger.live_reservations() == []
        assert GpuKey("node01", 1) in ledger.evicted_map()


def test_a_second_run_waits_deferred_until_the_first_releases(airflow_home, two_hosts, tmp_path, tmp_path_factory):
    """Two DAG runs (two Airflow deployments sharing the ledger) want all four GPUs: the second
    defers, its trigger re-plans until the first releases, then it trains."""
    import threading
    import time

    home_b = tmp_path_factory.mktemp("airflow-b")
    migrate(airflow_env(home_b, DAGS))
    a_training = threading.Event()
    marks: dict[str, float] = {}

    def on_a(line):
        if "epoch 1 loss" in line:
            a_training.set()
        if "reservation released" in line:
            marks.setdefault("a_released", time.monotonic())

    stop_a = tmp_path / "stop-a"

    def on_b(line):
        if "deferring until one can" in line:
            marks.setdefault("b_deferred", time.monotonic())
            stop_a.touch()  # only now may the first run finish (and release)
        if "epoch 1 loss" in line:
            marks.setdefault("b_training", time.monotonic())

    proc_a, pump_a, lines_a, out_a, _ = start_dag(airflow_home, two_hosts, tmp_path, "a", on_a, gpu_count=4,
                                               script_args=["--epochs", "100000", "--sleep", "0.2",
                                                            "--stop-file", str(tmp_path / "stop-a")])
    try:
        assert a_training.wait(240), "".join(lines_a)[-3000:]
        proc_b, pump_b, lines_b, out_b, _ = start_dag(
            home_b, two_hosts, tmp_path, "b", on_b, gpu_count=4, script_args=["--epochs", "2"],
            wait_for_capacity=True, deferrable=True, capacity_poll_interval=1)
        try:
            proc_a.wait(timeout=600)
            proc_b.wait(timeout=600)
            pump_a.join(10)
            pump_b.join(10)
        finally:
            if proc_b.poll() is None:
                proc_b.kill()
    finally:
        if proc_a.poll() is None:
            proc_a.kill()
    log_b = "".join(lines_b)
    assert proc_a.returncode == 0, "".join(lines_a)[-3000:]
    assert proc_b.returncode == 0, log_b[-4000:]
    assert marks["b_deferred"] < marks["a_released"] < marks["b_training"], marks
    assert json.loads(out_b.read_text())["hosts"] == ["node01", "node02"]


def test_a_card_type_the_fleet_does_not_have_fails_at_once_naming_the_types(airflow_home, two_hosts, tmp_path):
    """gpu_type names a card no host has: a mistake, not a shortage. Even with wait_for_capacity
    the task fails at once and without retries (AirflowFailException), naming the card types
    the fleet has; nothing is reserved."""
    r, out, cfg = run_dag(airflow_home, two_hosts, tmp_path, gpu_count=2, gpu_type="H100",
                          wait_for_capacity=True, capacity_timeout=3600, script_args=["--epochs", "1"])
    log = r.stdout + r.stderr
    assert r.returncode != 0
    assert re.search(r"AirflowFailException: gpu_type 'H100': the fleet has no GPU of that card type; "
                     r"its card types: NVIDIA A100-SXM4-80GB", log), log[-4000:]
    assert "no pool can host" not in log and "re-planning" not in log
    assert not out.exists()
    with Ledger.from_url(cfg["ledger_url"]) as ledger:
        assert ledger.live_reservations() == []
