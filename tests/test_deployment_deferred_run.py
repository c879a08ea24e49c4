"""A deferred run phase in a real deployment (api-server, scheduler with LocalExecutor,
dag-processor, triggerer as separate processes; real torchrun on two emulated hosts): the
triggerer is SIGKILLed while it watches a training, and started again. The new triggerer takes
the trigger over from the database and reattaches to the job: the same processes train on (one
launch), no line of the output is lost, and the task ends `success` on its first try."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.operators.hetero_train import default_job_id
from airflow_hetero_gpu.testing import EmulatedCluster
from airflow_hetero_gpu.testing.airflow_env import AirflowDeployment, connection_env
from airflow_hetero_gpu.testing.demo import small_hosts
from dag_run_helpers import DAGS, SCRIPT, leftovers
from ledger_files import new_ledger

pytest.importorskip("torch", reason="torch (CPU build) is needed to train the example model")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("deferred-run")
    with EmulatedCluster(root / "cluster", small_hosts(2, gpus=2)) as cluster:
        conns, ids = connection_env(cluster)
        cfg = {"ssh_conn_ids": ids, "script": SCRIPT, "ledger_url": new_ledger(root / "ledger.db"),
               "captures_dir": str(root / "captures"), "workdir": str(root), "gpu_count": 4}
        # the job holds after epoch 2 until the test has seen the new triggerer take it over
        durable = {"durable": True, "deferrable": True, "unattended_timeout": 60, "preemption_grace": 5,
                   "lease_seconds": 90, "host_timeout": 8,
                   "script_args": ["--epochs", "8", "--hold-after-epoch", "2", "--hold-file", str(root / "hold")]}
        with AirflowDeployment(root / "airflow", DAGS, {
            **conns, "HG_TEST_CONFIG": json.dumps(cfg), "HG_TEST_DURABLE_CONFIG": json.dumps(durable),
        }) as airflow:
            airflow.cfg, airflow.root = cfg, root
            yield airflow


def _trigger_logs(airflow, run_id: str) -> list[str]:
    """The trigger log files of the task's first try (one per trigger that ran it), oldest first."""
    out = []
    for home in airflow.log_homes().values():
        root = home / "logs" / "dag_id=hg_durable_test" / f"run_id={run_id}" / "task_id=train"
        out += sorted(root.rglob("attempt=1.log.trigger.*.log"), key=lambda p: p.stat().st_mtime)
    return [p.read_text(errors="replace") for p in out]


def test_triggerer_killed_while_it_watches_a_training(deployment):
    from airflow_hetero_gpu.launch.command import JOB_ENV
    from airflow_hetero_gpu.testing import procs

    airflow = deployment
    run_id = airflow.trigger("hg_durable_test")
    job_id = default_job_id("hg_durable_test", "train", run_id)
    log = lambda: airflow.task_log("hg_durable_test", run_id, "train")  # noqa: E731
    airflow.wait_for(lambda: "holding after epoch 2" in log(), timeout=300, what="the training relayed by the trigger")
    assert airflow.task_state("hg_durable_test", run_id, "train") == "deferred"   # no worker slot held
    owner = lambda: [r[0] for r in airflow.query("select triggerer_id from trigger")]  # noqa: E731
    (old,) = airflow.wait_for(lambda: owner() if owner() and owner()[0] else None, timeout=60,
                              what="the trigger assigned to the triggerer")
    before = set(procs.with_env(JOB_ENV, job_id))
    assert before
    time.sleep(5)  # heartbeats (every 2 s) record how far the output was relayed

    airflow.restart("triggerer", signal.SIGKILL)
    airflow.wait_for(lambda: owner() and owner()[0] not in (None, old), timeout=180,
                     what="the trigger taken over by the new triggerer")
    airflow.wait_for(lambda: len(_trigger_logs(airflow, run_id)) >= 2 and "watched from the triggerer"
                     in _trigger_logs(airflow, run_id)[-1], timeout=120, what="the new trigger reattached")
    assert before <= set(procs.with_env(JOB_ENV, job_id)), "the job's processes changed"
    assert airflow.task_state("hg_durable_test", run_id, "train") == "deferred"
    (Path(airflow.root) / "hold").touch()

    state = airflow.wait_for_state("hg_durable_test", run_id, None, {"success", "failed"}, timeout=420)
    text = log()
    assert state == "success", text[-6000:] + airflow.component_log("triggerer")[-3000:]
    assert airflow.query("select try_number from task_instance where dag_id = ? and run_id = ? and task_id = ?",
                         "hg_durable_test", run_id, "train") == [(1,)]
    assert text.count(f"job {job_id}: starting on") == 1, text[-6000:]                  # one launch
    assert "leftover process" not in text and "resumed from" not in text
    epochs = [int(e) for e in re.findall(r"epoch (\d+) loss", text)]
    assert epochs == list(range(1, 9)), epochs            # no line lost (none repeated: the output paused)
    first, second = _trigger_logs(airflow, run_id)[:2]
    assert "holding after epoch 2" in first and re.search(r"epoch [3-8] loss", second)
    assert f"job {job_id}: reservation released" in text
    with Ledger.from_url(airflow.cfg["ledger_url"]) as ledger:
        assert ledger.live_reservations() == []
    assert leftovers(job_id) == ""
    assert not (Path.home() / ".hetero-gpu" / "run" / job_id).exists()
