"""Preemption end to end: `airflow dags test` runs of the operator with real torchrun on the
emulated cluster (real sshd, four hosts of 2 GPUs, checkpoints on each host's own directory).

A low-priority training job holds all GPUs of two hosts (it waits after epoch 3, its checkpoint
written); a reservation nobody may preempt holds the two others. A high-priority job arrives:
the ledger marks the training job ``preempting``, its operator sends SIGTERM on both hosts, the
script keeps its checkpoint and exits, the preemptor is admitted on those hosts; the training
job waits in the queue, is admitted on the other two hosts once they are free, its checkpoint is
carried there, and it resumes from epoch 3 and finishes. Every wait is on a log line or a ledger row.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import pytest

from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing.airflow_env import airflow_env, migrate
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from dag_run_helpers import DAGS, airflow_home, finish, leftovers, start_dag  # noqa: F401

WAIT_S = 300
FAST = {"AIRFLOW__HETERO_GPU__PREEMPTION_MIN_RUNTIME": "2", "AIRFLOW__HETERO_GPU__PREEMPTION_DELAY": "1"}


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", *argv], capture_output=True, text=True,
                          timeout=120)


def _until(what: str, check, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return got


def _show(lines_lo: list[str], lines_hi: list[str]) -> None:
    """Both runs' operator lines and the victim's last lines (pytest shows them on a failure)."""
    ours = [line[:600] for line in lines_lo + lines_hi if "job lo" in line or "job hi" in line]
    print("".join(ours), "".join(lines_lo)[-4000:], sep="\n----- tail of lo -----\n")


class Log:
    """A DAG run's lines, with an event per awaited pattern."""

    def __init__(self, patterns: dict[str, str]):
        self.patterns = {k: re.compile(v) for k, v in patterns.items()}
        self.events = {k: threading.Event() for k in patterns}
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        for k, p in self.patterns.items():
            if p.search(line):
                self.events[k].set()

    def wait(self, what: str, lines: list[str]) -> None:
        assert self.events[what].wait(WAIT_S), f"no {what!r} line:\n" + "".join(lines)[-6000:]


DURABLE = {"durable": True, "unattended_timeout": 30, "lease_seconds": 30 + 60 + 15}


@pytest.mark.parametrize("durable", [{"lease_seconds": 15}, DURABLE, {**DURABLE, "deferrable": True}],
                         ids=["plain", "durable", "deferred"])
def test_a_low_priority_job_is_preempted_checkpoints_and_resumes_on_other_hosts(
        airflow_home, emulated_cluster, tmp_path, tmp_path_factory, durable):  # noqa: F811
    """Durable or not: the victim is signalled, checkpoints, goes back to the queue and resumes
    (a durable victim's relaunch is a new launch with a new handle). ``deferred``: the victim's
    run phase is watched from the trigger (``airflow dags test`` runs it in line); the trigger
    sees the preemption mark and fires ``preempted``; the task resumes in a worker, reattaches,
    stops the job (signal, checkpoint, grace), waits in the queue (deferred again), relaunches
    and defers its run again until the job ends."""
    deferred = bool(durable.get("deferrable"))
    tag = "deferred" if deferred else "durable" if durable.get("durable") else "plain"
    LO, HI = f"lo-{tag}", f"hi-{tag}"  # each test its own job ids: the run directories share one home
    cluster = emulated_cluster(small_hosts(4, gpus=2))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    r = _cli("collect", "--hosts", cluster.hosts_arg(), "--identity-file", str(cluster.identity_file),
             "--known-hosts", str(cluster.known_hosts_path), "--ledger", url)
    assert r.returncode == 0, r.stderr
    ckpt = str(tmp_path / "ckpt" / "$HETERO_GPU_HOST")  # each host's own directory
    never, go_hi = tmp_path / "never", tmp_path / "hi-may-end"

    lo_log = Log({"holding": r"holding after epoch 3", "back": rf"job {LO}: preempted by job {HI} .*back in the queue",
                  "resumed": r"resumed from epoch 3"})
    lo, pump_lo, lines_lo, out_lo, _ = start_dag(
        airflow_home, cluster, tmp_path, "lo", lo_log, gpu_count=4, job_id=LO, ledger_url=url, priority=1,
        script_args=["--epochs", "6", "--hold-after-epoch", "3", "--hold-file", str(never)],
        checkpoint_dir=ckpt, checkpoint_storage="host", preemption_grace=60, **durable,
        wait_for_capacity=True, capacity_poll_interval=1, capacity_timeout=900, airflow_extra=FAST)
    hi = pump_hi = None
    lines_hi: list[str] = []
    try:
        lo_log.wait("holding", lines_lo)
        with Ledger.open_existing(url) as led:
            led.preemption = None
            lo_hosts = set(led.get(LO).hosts)
            assert len(lo_hosts) == 2
            # the other two hosts: held by a reservation nobody may preempt
            assert led.enqueue("hold", PlanRequest(4), lease_seconds=3600).admitted
            hold_hosts = set(led.take_admission("hold").hosts)
            assert hold_hosts.isdisjoint(lo_hosts)

        home_b = tmp_path_factory.mktemp("airflow-hi")
        migrate(airflow_env(home_b, DAGS))
        hi_log = Log({"admitted": rf"job {HI}: admitted from the queue"})
        wait_cmd = ["sh", "-c", f'while [ ! -e "{go_hi}" ]; do sleep 0.2; done; echo hi-done']
        hi, pump_hi, lines_hi, _, _ = start_dag(
            home_b, cluster, tmp_path, "hi", hi_log, gpu_count=4, command=wait_cmd, job_id=HI, ledger_url=url,
            priority=5, wait_for_capacity=True, capacity_poll_interval=1, capacity_timeout=900, airflow_extra=FAST)
        lo_log.wait("back", lines_lo)
        hi_log.wait("admitted", lines_hi)
        with Ledger.open_existing(url) as led:
            assert set(led.get(HI).hosts) == lo_hosts  # the preemptor runs where the victim ran
            entry = led.queue_entry(LO)
            assert entry is not None and entry.state == "waiting" and entry.priority == 1
            [record] = led.preemptions()
            assert record["victim"] == LO and record["preemptor"] == HI and record["state"] == "exited"
            assert record["checkpoint"] == "epoch 3" and record["reason"] == "priority 5 > 1"
            # `hetero-gpu queue` shows the last day's preemptions
            q = _cli("queue", "--ledger", url)
            assert q.returncode == 0 and "preemptions (last 24 h)" in q.stdout and LO in q.stdout, q.stdout
            assert led.release("hold")  # the other hosts free up: the victim is admitted there
        lo_log.wait("resumed", lines_lo)
        finish(lo, pump_lo)
        go_hi.touch()
        finish(hi, pump_hi)
    finally:
        _show(lines_lo, lines_hi)
        go_hi.touch()
        never.touch()
        for proc in (lo, hi):
            if proc is not None and proc.poll() is None:
                proc.kill()
    text_lo, text_hi = "".join(lines_lo), "".join(lines_hi)
    (tmp_path / "lo.log").write_text(text_lo)
    assert lo.returncode == 0, text_lo[-6000:]
    assert hi.returncode == 0, text_hi[-6000:]
    explained = re.search(rf"job {LO}: preempted by job {HI} \(priority 5 > 1\): signalled at \d\d:\d\d:\d\d UTC, "
                          r"the script exited after (\d+(?:\.\d)?) s, torchrun after (\d+(?:\.\d)?) s, "
                          r"checkpoint of epoch 3 kept, about \d+ GPU-seconds of work lost", text_lo)
    assert explained, text_lo[-6000:]
    script_s, torchrun_s = float(explained.group(1)), float(explained.group(2))
    assert script_s <= torchrun_s, explained.group(0)
    # torchrun's traceback of its stop is left out of the victim's log, one line standing for it a host
    # (each process is signalled once: an agent signalled twice logs "--- Logging error ---" and
    # "During handling of the above exception" around tracebacks raised in its own handler)
    for word in ("Traceback", "SignalException", "Logging error", "During handling"):
        at = text_lo.find(word)
        assert at < 0, text_lo[max(0, at - 3000):at + 3000]  # what printed it, and around it
    stopped = re.findall(r"torchrun on (node0\d) stopped by signal 15 \(SIGTERM; its traceback left out\)", text_lo)
    assert sorted(stopped) == sorted(lo_hosts), text_lo[-6000:]  # one line a host
    carried = re.search(rf"job {LO}: carried its checkpoint \(checkpoint\.pt, \d+ bytes\) from (node0\d) to "
                        r"(node0\d), (node0\d), its new hosts", text_lo)
    assert carried and carried.group(1) in lo_hosts and set(carried.group(2, 3)) == hold_hosts, text_lo[-6000:]
    assert "training done" in text_lo and "hi-done" in text_hi
    assert f"preempting {LO} for it" in text_hi  # the preemptor's log says whom it preempts
    with Ledger.open_existing(url) as led:
        assert led.queue() == [] and led.live_reservations() == []
        [record] = led.preemptions()
        assert record["lost_gpu_s"] is not None and record["lost_gpu_s"] >= 0
        assert abs(record["exited_after_s"] - script_s) <= 0.051 + (script_s >= 10) * 0.5  # the script's, as logged
    assert leftovers(f"hetero-gpu-{LO}") == "" and leftovers(f"hetero-gpu-{HI}") == ""
    if deferred:  # the trigger saw the mark; the worker stopped the job and deferred again after the relaunch
        first_watch = _between(text_lo, "running trigger in line", "Trigger completed")
        assert "holding after epoch 3" in first_watch, first_watch[-4000:]   # the trigger relayed the training
        assert f"job {LO}: preempted; the task stops it and waits in the queue; resuming in a worker" in text_lo
        assert text_lo.count(f"job {LO}: starting on") == 2, text_lo[-6000:]   # the launch and the relaunch
        assert text_lo.count("deferring: the triggerer watches it") == 2, text_lo[-6000:]
        assert text_lo.index("resuming in a worker") < text_lo.index(f"job {LO}: preempted by job {HI}")


def _between(log: str, start: str, end: str) -> str:
    """The part of ``log`` from the first ``start`` to the next ``end`` after it."""
    head = log.index(start)
    return log[head:log.index(end, head)]


def test_a_victim_that_ignores_the_signal_is_killed_after_the_grace_and_resumes_deferred(
        airflow_home, emulated_cluster, tmp_path, tmp_path_factory):  # noqa: F811
    LO, HI = "lo-stubborn", "hi-stubborn"
    cluster = emulated_cluster(small_hosts(2, gpus=2))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    r = _cli("collect", "--hosts", cluster.hosts_arg(), "--identity-file", str(cluster.identity_file),
             "--known-hosts", str(cluster.known_hosts_path), "--ledger", url)
    assert r.returncode == 0, r.stderr
    may_end = tmp_path / "lo-may-end"
    starts: list[float] = []
    second = threading.Event()

    def on_lo(line: str) -> None:
        lo_log(line)
        if f"job {LO}: starting on" in line:
            starts.append(time.monotonic())
            if len(starts) == 2:
                second.set()

    lo_log = Log({"started": rf"job {LO}: starting on", "killed": rf"job {LO}: preempted by job {HI} .*killed after"})
    ignore = ["sh", "-c", f"trap '' TERM; while [ ! -e '{may_end}' ]; do sleep 0.2; done; echo lo-done"]
    lo, pump_lo, lines_lo, _, _ = start_dag(
        airflow_home, cluster, tmp_path, "lo", on_lo, gpu_count=4, command=ignore, job_id=LO, ledger_url=url,
        priority=1, preemption_grace=2, lease_seconds=6, wait_for_capacity=True, capacity_poll_interval=1,
        capacity_timeout=900, deferrable=True, airflow_extra=FAST)  # preempted, it waits in the triggerer
    hi = pump_hi = None
    lines_hi: list[str] = []
    try:
        lo_log.wait("started", lines_lo)
        home_b = tmp_path_factory.mktemp("airflow-hi")
        migrate(airflow_env(home_b, DAGS))
        hi, pump_hi, lines_hi, _, _ = start_dag(
            home_b, cluster, tmp_path, "hi", lambda line: None, gpu_count=4, command=["sh", "-c", "echo hi-done"],
            job_id=HI, ledger_url=url, priority=5, wait_for_capacity=True, capacity_poll_interval=1,
            capacity_timeout=900, airflow_extra=FAST)
        lo_log.wait("killed", lines_lo)
        with Ledger.open_existing(url) as led:
            [record] = led.preemptions()
            assert record["state"] == "killed" and record["exited_after_s"] >= 2
            assert record["lost_gpu_s"] > 0 and record["checkpoint"] is None  # no checkpoint: all since its start
        finish(hi, pump_hi)  # the preemptor ran on the victim's GPUs and ended
        assert second.wait(WAIT_S), "".join(lines_lo)[-6000:]  # the victim was admitted again and relaunched
        may_end.touch()
        finish(lo, pump_lo)
    finally:
        _show(lines_lo, lines_hi)
        may_end.touch()
        for proc in (lo, hi):
            if proc is not None and proc.poll() is None:
                proc.kill()
    text_lo, text_hi = "".join(lines_lo), "".join(lines_hi)
    assert hi.returncode == 0 and "hi-done" in text_hi, text_hi[-6000:]
    assert lo.returncode == 0 and "lo-done" in text_lo, text_lo[-6000:]
    assert f"job {LO}: still running 2 s after SIGTERM; ending it" in text_lo
    assert re.search(rf"job {LO}: preempted by job {HI} \(priority 5 > 1\): signalled at .*, killed after \d+(?:\.\d)? s \(it did "
                     r"not exit within the grace\), no checkpoint seen, about \d+ GPU-seconds of work lost", text_lo)
    with Ledger.open_existing(url) as led:
        assert led.queue() == [] and led.live_reservations() == []
    assert leftovers(f"hetero-gpu-{LO}") == "" and leftovers(f"hetero-gpu-{HI}") == ""
