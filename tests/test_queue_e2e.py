"""The queue end to end: `airflow dags test` runs of the operator on the emulated cluster (real
sshd, one host of 8 GPUs). An 8-GPU task waits behind 1-GPU jobs holding 7 of the GPUs; the one
free GPU is claimed for it, so a 1-GPU task enqueued after it waits too, and `hetero-gpu queue`
shows the claim; when the 1-GPU jobs end, the 8-GPU task is admitted first and the later 1-GPU
task only after it. Every wait is on a log line or a ledger row."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing.airflow_env import airflow_env, migrate
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from dag_run_helpers import DAGS, airflow_home, finish, start_dag  # noqa: F401
from ledger_files import new_ledger

WAIT_S = 300


def _until(what: str, check, timeout: float = WAIT_S):
    """Poll ``check`` (a ledger read) until it returns something true."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", *argv], capture_output=True, text=True,
                          timeout=120)


def test_an_8_gpu_task_is_admitted_before_1_gpu_tasks_enqueued_after_it(airflow_home, emulated_cluster,  # noqa: F811
                                                                        tmp_path, tmp_path_factory):
    cluster = emulated_cluster(small_hosts(1, gpus=8))
    url = new_ledger(tmp_path / 'ledger.db')
    r = _cli("collect", "--hosts", cluster.hosts_arg(), "--identity-file", str(cluster.identity_file),
             "--known-hosts", str(cluster.known_hosts_path), "--ledger", url)
    assert r.returncode == 0, r.stderr
    with Ledger.from_url(url) as led:  # seven 1-GPU jobs hold 7 of the 8 GPUs
        for i in range(7):
            assert led.enqueue(f"small-{i}", PlanRequest(1), lease_seconds=3600).admitted
            led.take_admission(f"small-{i}")

    marks: dict[str, float] = {}
    events = {name: threading.Event() for name in ("big_head", "late_waits")}
    go_big = tmp_path / "big-may-end"

    def on_big(line: str) -> None:
        if "job big-8: head of the queue: claims node01 GPU 0-7" in line:
            events["big_head"].set()
        if "job big-8: admitted from the queue" in line:
            marks.setdefault("big_admitted", time.monotonic())

    def on_late(line: str) -> None:
        if "job late-1: 2nd in the queue" in line and "behind big-8" in line:
            events["late_waits"].set()
        if "job late-1: admitted from the queue" in line:
            marks.setdefault("late_admitted", time.monotonic())

    wait_cmd = ["sh", "-c", f'while [ ! -e "{go_big}" ]; do sleep 0.2; done; echo big-done']
    big, pump_big, lines_big, _, _ = start_dag(
        airflow_home, cluster, tmp_path, "big", on_big, gpu_count=8, command=wait_cmd, job_id="big-8",
        ledger_url=url, wait_for_capacity=True, deferrable=False, capacity_poll_interval=1, capacity_timeout=900)
    late = pump_late = None
    try:
        assert events["big_head"].wait(WAIT_S), "".join(lines_big)[-4000:]
        # `hetero-gpu queue` shows the claim while the 8-GPU task waits
        r = _cli("queue", "--ledger", url)
        assert r.returncode == 0, r.stderr
        head = next(line for line in r.stdout.splitlines() if " big-8 " in line)
        assert head.split()[:3] == ["1", "big-8", "head"] and "node01 GPU 0-7 (7 held)" in head, r.stdout

        home_b = tmp_path_factory.mktemp("airflow-late")
        migrate(airflow_env(home_b, DAGS))
        late, pump_late, lines_late, _, _ = start_dag(
            home_b, cluster, tmp_path, "late", on_late, gpu_count=1, command=["sh", "-c", "echo late-done"],
            job_id="late-1", ledger_url=url, wait_for_capacity=True, deferrable=False, capacity_poll_interval=1,
            capacity_timeout=900)
        assert events["late_waits"].wait(WAIT_S), "".join(lines_late)[-4000:]
        with Ledger.open_existing(url) as led:
            free = {k for k in led.queue_entry("big-8").claimed_gpus} - set(led.reserved_map())
            assert len(free) == 1  # the free GPU is kept for the 8-GPU task: the later one waits
            for i in range(7):
                assert led.release(f"small-{i}")
            # the release of the last 1-GPU job admitted the 8-GPU task in the same transaction
            big_entry = led.queue_entry("big-8")
            assert big_entry is None or big_entry.admitted  # taken already, or about to be
            assert led.queue_entry("late-1").state == "waiting"
        _until("the 8-GPU task to run", lambda: "big_admitted" in marks)
        with Ledger.open_existing(url) as led:
            assert len(led.get("big-8").gpus) == 8 and led.queue_entry("late-1").state == "waiting"
        go_big.touch()
        finish(big, pump_big)
        finish(late, pump_late)
    finally:
        go_big.touch()
        for proc in (big, late):
            if proc is not None and proc.poll() is None:
                proc.kill()
    log_big, log_late = "".join(lines_big), "".join(lines_late)
    assert big.returncode == 0, log_big[-4000:]
    assert late.returncode == 0, log_late[-4000:]
    assert "big-done" in log_big and "late-done" in log_late
    assert marks["big_admitted"] < marks["late_admitted"]
    with Ledger.open_existing(url) as led:
        assert led.queue() == [] and led.live_reservations() == []
