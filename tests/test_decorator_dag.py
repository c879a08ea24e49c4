"""@task.hetero_train end to end: `airflow dags test` against the emulated cluster (real sshd, two
hosts), real torchrun (CPU, gloo) running the decorated function on four ranks.

The training run is the example DAG of dags/ as a user would deploy it (the fleet from the
[hetero_gpu] settings); the failure runs use tests/dags/hg_decorator_test.py."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing.airflow_env import airflow_env, connection_env, dags_test
from cluster_fixtures import emulated_cluster  # noqa: F401
from dag_run_helpers import DAGS, airflow_home, leftovers, losses, two_hosts  # noqa: F401
from ledger_files import new_ledger

pytest.importorskip("torch", reason="torch (CPU build) is needed to run the function under torchrun")

EXAMPLE_DAGS = Path(__file__).resolve().parents[1] / "dags"


def xcoms(home: Path, dag_id: str, task_id: str) -> dict[str, object]:
    """The XComs of the latest run's task, read from Airflow's metadata database."""
    with sqlite3.connect(home / "airflow.db") as db:
        (run_id,) = db.execute("SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1",
                               (dag_id,)).fetchone()
        rows = db.execute("SELECT key, value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = ?",
                          (dag_id, run_id, task_id)).fetchall()
    # a JSON column: text, which SQLite hands back as a number where the text is one
    return {key: json.loads(value) if isinstance(value, (str, bytes)) else value for key, value in rows}


def test_the_example_dag_trains_and_rank_0s_value_is_the_xcom(airflow_home, two_hosts, tmp_path):
    env_conns, ids = connection_env(two_hosts)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    env = airflow_env(airflow_home, EXAMPLE_DAGS, {
        **env_conns,
        "AIRFLOW__HETERO_GPU__SSH_CONN_IDS": ",".join(f"{h}={c}" for h, c in ids.items()),
        "AIRFLOW__HETERO_GPU__LEDGER_URL": ledger_url,
        "AIRFLOW__HETERO_GPU__CAPTURES_DIR": str(tmp_path / "captures"),
        "HETERO_GPU_CHECKPOINT_ROOT": str(tmp_path / "ckpt"),
    })
    r = dags_test("hetero_gpu_train_decorated", env, conf={"gpu_count": 4, "epochs": 6, "lr": 0.05}, timeout=420)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-6000:]
    # every rank ran the function: rank 0's epochs are in the log, prefixed by host and rank
    assert len(losses(log)) == 6, log[-4000:]
    assert re.search(r"\[node0[12] rank [01]\] epoch 6 loss ", log)
    assert "HETERO_GPU_RESULT" not in log  # the value's lines are taken, not logged

    train = xcoms(airflow_home, "hetero_gpu_train_decorated", "train")
    value = train["return_value"]
    assert (value["rank"], value["world_size"], value["hosts"]) == (0, 4, ["node01", "node02"])
    assert (value["lr"], value["epochs"]) == (0.05, 6)              # the upstream task's XComArgs
    assert len(value["losses"]) == 6 and value["losses"][-1] < value["losses"][0]
    assert value["losses"] == losses(log)                            # what rank 0 printed is what came back
    assert train["decision"]["decision"]["hosts"] == ["node01", "node02"]
    assert train["run"]["run"]["exit_codes"] == {"node01": 0, "node02": 0}
    report = xcoms(airflow_home, "hetero_gpu_train_decorated", "report")["return_value"]
    assert report == {"final_loss": value["losses"][-1], "hosts": ["node01", "node02"]}
    # the checkpoint rank 0 kept, under the templated checkpoint_dir
    assert len(list((tmp_path / "ckpt" / "hetero_gpu_train_decorated").glob("*/checkpoint.pt"))) == 1
    with Ledger.from_url(ledger_url) as ledger:
        assert ledger.live_reservations() == []
    assert leftovers(train["run"]["job_id"]) == ""


def run_failing(home: Path, cluster, tmp_path: Path, **config):
    env_conns, ids = connection_env(cluster)
    cfg = {"ssh_conn_ids": ids, "ledger_url": new_ledger(tmp_path / 'ledger.db'),
           "captures_dir": str(tmp_path / "captures"), **config}
    env = airflow_env(home, DAGS, {**env_conns, "HG_TEST_CONFIG": json.dumps(cfg)})
    r = dags_test("hg_decorator_test", env, timeout=420)
    return r, r.stdout + r.stderr, cfg


def test_a_failing_function_fails_the_task_with_host_rank_and_traceback_line(airflow_home, two_hosts, tmp_path):
    r, log, cfg = run_failing(airflow_home, two_hosts, tmp_path, mode="fail", fail_host="node02")
    assert r.returncode != 0
    found = re.search(r"function 'train' failed on node02, rank (\d): ValueError: loss diverged at global rank (\d) "
                      r"\(at (\S+):(\d+) in train\)", log)
    assert found, log[-6000:]
    assert found.group(1) == found.group(2)                           # the rank the function saw
    dag_file = (DAGS / "hg_decorator_test.py").resolve()
    assert Path(found.group(3)) == dag_file
    assert "raise ValueError" in dag_file.read_text().splitlines()[int(found.group(4)) - 1]
    assert "Traceback (most recent call last)" in log                 # the rank's traceback is in the task log
    with Ledger.from_url(cfg["ledger_url"]) as ledger:
        assert ledger.live_reservations() == []
    assert leftovers("hg_decorator_test.train") == ""


def test_an_import_the_hosts_cannot_satisfy_is_reported_clearly(airflow_home, two_hosts, tmp_path):
    r, log, cfg = run_failing(airflow_home, two_hosts, tmp_path, mode="import")
    assert r.returncode != 0
    assert re.search(r"function 'train' failed on node0[12], rank \d: ModuleNotFoundError: No module named "
                     r"'hetero_gpu_module_the_hosts_lack' \(at \S+hg_decorator_test.py:\d+ in train\)\. "
                     r"The hosts' Python \(\S+ on node0[12]\) has no module 'hetero_gpu_module_the_hosts_lack': "
                     r"install it on every host of the pool", log), log[-6000:]
    with Ledger.from_url(cfg["ledger_url"]) as ledger:
        assert ledger.live_reservations() == []
    assert leftovers("hg_decorator_test.train") == ""
