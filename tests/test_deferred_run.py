"""A deferred run phase (``deferrable=True``, durable) end to end with ``airflow dags test``: the
emulated cluster (real sshd), real torchrun. The task launches the job, hands it to the
trigger (which `dags test` runs in line, as the triggerer would), and resumes only to finish or
to relaunch on a replaced GPU."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from airflow_hetero_gpu.ledger import Ledger
from cluster_fixtures import emulated_cluster  # noqa: F401
from dag_run_helpers import airflow_home, finish, leftovers, losses, start_dag, two_hosts  # noqa: F401

pytest.importorskip("torch", reason="torch (CPU build) is needed to train the example model")

DEFERRED = {"durable": True, "deferrable": True, "unattended_timeout": 30, "preemption_grace": 5,
            "lease_seconds": 60, "host_timeout": 8}


def _epochs(text: str) -> list[int]:
    return [int(e) for e in re.findall(r"epoch (\d+) loss", text)]


def _between(log: str, start: str, end: str) -> str:
    """The part of ``log`` from the first ``start`` to the next ``end`` after it."""
    head = log.index(start)
    return log[head:log.index(end, head)]


def test_a_deferred_run_is_watched_by_the_trigger_and_ends_success(airflow_home, two_hosts, tmp_path):
    """The job holds after epoch 2 until the test has seen the trigger take it over, so the task
    cannot finish before it defers. Every later epoch is relayed by the trigger while the task is
    deferred, none twice; one launch; the task resumes once, returns the result and releases."""
    hold = tmp_path / "hold"

    def on_line(line: str) -> None:
        if "watched from the triggerer" in line:
            hold.touch()

    proc, pump, lines, out, cfg = start_dag(
        airflow_home, two_hosts, tmp_path, "deferred", on_line, gpu_count=4,
        script_args=["--epochs", "6", "--hold-after-epoch", "2", "--hold-file", str(hold)], **DEFERRED)
    finish(proc, pump, timeout=600)
    log = "".join(lines)
    (tmp_path / "dag-run.log").write_text(log)
    assert proc.returncode == 0, log[-6000:]
    decision = json.loads(out.read_text())
    job_id = decision["job_id"]
    assert log.count(f"job {job_id}: starting on") == 1, log[-6000:]          # one launch
    assert re.search(rf"job {re.escape(job_id)}: running on .*; deferring: the triggerer watches it", log)
    deferred = _between(log, "running trigger in line", "Trigger completed")
    # the training went on while the task was deferred: epochs 3 to 6 (at least) came through the trigger
    assert _epochs(deferred)[-4:] == [3, 4, 5, 6], deferred[-4000:]
    assert _epochs(log) == [1, 2, 3, 4, 5, 6], log[-6000:]       # no line lost, none twice
    assert f"job {job_id}: ended on every host; resuming in a worker" in log    # the trigger's event
    found = losses(log)
    assert found[-1] < found[0], found
    assert decision["run"]["exit_codes"] == {"node01": 0, "node02": 0}
    assert decision["hosts"] == ["node01", "node02"] and len(decision["gpus"]) == 4
    assert f"job {job_id}: reservation released" in log
    with Ledger.from_url(cfg["ledger_url"]) as ledger:
        assert ledger.live_reservations() == []
    assert leftovers(job_id) == ""
    assert not (Path.home() / ".hetero-gpu" / "run" / job_id).exists()


def test_an_evicted_gpu_under_a_deferred_run_is_replaced_and_the_job_resumes(airflow_home, two_hosts, tmp_path):
    """S12 under a deferred run: a GPU of the job is evicted while the trigger watches it; the
    trigger replaces it in the ledger and wakes the task, which reattaches, stops the workers,
    relaunches on the new set (resuming from the checkpoint) and defers again; success.

    No race: the job holds after epoch 3 (checkpoint written) until the test sees the restart."""
    from airflow_hetero_gpu.core.model import GpuKey

    release = tmp_path / "release"
    evicted: list[str] = []
    url_box: dict[str, str] = {}

    def on_line(line: str) -> None:
        if not evicted and re.search(r"epoch 3 loss", line):
            with Ledger.from_url(url_box["url"]) as ledger:
                (res,) = ledger.live_reservations()
                victim = res.gpus[-1]
                ledger.evict(GpuKey(victim.host, victim.index), victim.uuid, ["ecc"])
                evicted.append(f"{victim.host}:{victim.index}")
        if re.search(r"job \S+: restarting on ", line):  # the old workers are stopped by now
            release.touch()

    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    url_box["url"] = ledger_url
    proc, pump, lines, out, cfg = start_dag(
        airflow_home, two_hosts, tmp_path, "evict", on_line, gpu_count=2, ledger_url=ledger_url,
        script_args=["--epochs", "8", "--hold-after-epoch", "3", "--hold-file", str(release)],
        checkpoint_dir=str(tmp_path / "ckpt"), **DEFERRED)
    finish(proc, pump, timeout=600)
    log = "".join(lines)
    (tmp_path / "dag-run.log").write_text(log)
    assert proc.returncode == 0, log[-6000:]
    assert evicted == ["node01:1"]
    deferred = _between(log, "running trigger in line", "Trigger completed")
    assert re.search(r"GPU node01:1 replaced by node02:0", deferred), deferred[-4000:]   # in the trigger
    assert "its GPU set changed in the ledger; the task restarts it on the new set; resuming in a worker" in log
    assert re.search(r"rank 0 resumed from epoch 3", log), log[-4000:]
    assert len(re.findall(r"epoch 8 loss", log)) == 1
    assert log.count("deferring: the triggerer watches it") == 2, log[-6000:]   # deferred again after the restart
    decision = json.loads(out.read_text())
    assert decision["run"]["restarts"] == 1
    assert decision["run"]["gpus"] == [{"host": "node01", "index": 0}, {"host": "node02", "index": 0}]
    with Ledger.from_url(ledger_url) as ledger:
        assert ledger.live_reservations() == []
    assert leftovers(decision["job_id"]) == ""


def test_a_run_that_is_not_durable_stays_in_the_worker_when_deferrable(airflow_home, two_hosts, tmp_path):
    """``deferrable=True`` without durability: a trigger could not find the job again after a
    triggerer restart, so the run phase stays in the worker (only a queue wait would defer)."""
    proc, pump, lines, out, cfg = start_dag(
        airflow_home, two_hosts, tmp_path, "plain", lambda line: None, gpu_count=2,
        script_args=["--epochs", "2"], **{**DEFERRED, "durable": False, "lease_seconds": 30})
    finish(proc, pump, timeout=600)
    log = "".join(lines)
    assert proc.returncode == 0, log[-6000:]
    assert "deferring" not in log and "running trigger in line" not in log, log[-6000:]
    assert _epochs(log) == [1, 2]
    with Ledger.from_url(cfg["ledger_url"]) as ledger:
        assert ledger.live_reservations() == []
