"""A DAG author's mistakes, through `airflow dags test` on the emulated cluster (real sshd, real
torchrun on CPU): each one fails at once with one line that names the cause, is not retried,
and leaves nothing behind; a shortage that may pass waits and keeps saying why.

- a task's own ``ledger_url`` naming a SQLite file that does not exist (operator, decorator);
- hosts whose host key is unknown (nothing could be collected: every host's reason);
- more GPUs than every matching pool has at all (operator, decorator; also when waiting), and
  more than only the healthy ones (waits, warning again and again);
- a training script or workdir missing on the hosts (checked before torchrun starts);
- a worker's own error line in the task's exception.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing.airflow_env import airflow_env, connection_env, dags_test
from cluster_fixtures import emulated_cluster  # noqa: F401
from dag_run_helpers import DAGS, SCRIPT, airflow_home, leftovers, run_dag, two_hosts  # noqa: F401
from ledger_files import new_ledger

pytest.importorskip("torch", reason="torch (CPU build) is needed to run torchrun")

CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


def ti_states(home: Path, dag_id: str) -> dict[str, tuple[str, int]]:
    """``{task_id: (state, try_number)}`` of the latest run of ``dag_id``."""
    with sqlite3.connect(home / "airflow.db") as db:
        (run_id,) = db.execute("SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1",
                               (dag_id,)).fetchone()
        rows = db.execute("SELECT task_id, state, try_number FROM task_instance WHERE dag_id = ? AND run_id = ?",
                          (dag_id, run_id)).fetchall()
    return {task: (state, tries) for task, state, tries in rows}


def run_retry_dag(home: Path, cluster, tmp_path: Path, conns: dict | None = None, **config):
    """``hg_retry_test`` (the training task with ``retries=1``): (completed process, log, config)."""
    env_conns, ids = connection_env(cluster)
    cfg = {"ssh_conn_ids": ids, "script": SCRIPT, "captures_dir": str(tmp_path / "captures"),
           "workdir": str(tmp_path), **config}
    env = airflow_env(home, DAGS, {**env_conns, **(conns or {}), "HG_TEST_CONFIG": json.dumps(cfg),
                                   "HG_TEST_RETRY_CONFIG": json.dumps({"retry_delay_s": 1})})
    r = dags_test("hg_retry_test", env, timeout=600)
    return r, r.stdout + r.stderr, cfg


def run_decorated(home: Path, cluster, tmp_path: Path, **config):
    env_conns, ids = connection_env(cluster)
    cfg = {"ssh_conn_ids": ids, "captures_dir": str(tmp_path / "captures"), **config}
    env = airflow_env(home, DAGS, {**env_conns, "HG_TEST_CONFIG": json.dumps(cfg)})
    r = dags_test("hg_decorator_test", env, timeout=420)
    return r, r.stdout + r.stderr


def failed_once(home: Path, dag_id: str, task_id: str, log: str, message: str) -> None:
    """The task failed on its first try, not retried, and its failure is the one-line ``message``
    without chained internals."""
    assert ti_states(home, dag_id)[task_id] == ("failed", 1), log[-4000:]
    assert re.search(r"AirflowFailException: " + re.escape(message), log), log[-4000:]
    assert not any(c in log for c in CHAINED), log[-4000:]


# --- 1. a typo in a SQLite ledger_url ---------------------------------------------------------------------
def test_a_missing_sqlite_ledger_is_refused_by_the_operator_not_created(airflow_home, two_hosts, tmp_path):
    typo = tmp_path / "does-not-exist-dir" / "ledger.db"
    r, log, _ = run_retry_dag(airflow_home, two_hosts, tmp_path, gpu_count=2, ledger_url=f"sqlite:///{typo}")
    assert r.returncode != 0
    failed_once(airflow_home, "hg_retry_test", "train", log,
                f"no ledger at sqlite:///{typo} (no such file): create it with `hetero-gpu ledger init URL`")
    assert not typo.parent.exists()   # no second ledger, not even its directory
    assert "[node0" not in log         # nothing ran on the hosts


def test_a_missing_sqlite_ledger_is_refused_by_the_decorator(airflow_home, two_hosts, tmp_path):
    typo = tmp_path / "typo" / "ledger.db"
    r, log = run_decorated(airflow_home, two_hosts, tmp_path, ledger_url=f"sqlite:///{typo}", gpu_count=2)
    assert r.returncode != 0
    failed_once(airflow_home, "hg_decorator_test", "train", log, f"no ledger at sqlite:///{typo} (no such file)")
    assert not typo.parent.exists()


# --- 3. a request that can never fit, and one short of healthy GPUs ---------------------------------------
def test_more_gpus_than_the_pool_has_fails_at_once_even_when_waiting(airflow_home, two_hosts, tmp_path):
    url = new_ledger(tmp_path / "ledger.db")
    r, log, _ = run_retry_dag(airflow_home, two_hosts, tmp_path, gpu_count=5, gpu_type="A100*", ledger_url=url,
                              wait_for_capacity=True, capacity_timeout=3600)
    assert r.returncode != 0
    failed_once(airflow_home, "hg_retry_test", "train", log,
                "gpu_count 5: more GPUs than any matching pool has at all, healthy or not, so it can never start: "
                "NVIDIA A100-SXM4-80GB has 4")
    assert f"ledger: {url}" in log    # the task names the ledger it uses
    with Ledger.from_url(url) as ledger:
        assert ledger.queue() == [] and ledger.live_reservations() == []


def test_more_gpus_than_the_pool_has_fails_the_decorated_task_at_once(airflow_home, two_hosts, tmp_path):
    r, log = run_decorated(airflow_home, two_hosts, tmp_path, ledger_url=new_ledger(tmp_path / "ledger.db"),
                           gpu_count=5)
    assert r.returncode != 0
    failed_once(airflow_home, "hg_decorator_test", "train", log,
                "gpu_count 5: more GPUs than any matching pool has at all")


def test_short_only_of_healthy_gpus_waits_and_keeps_warning(airflow_home, two_hosts, tmp_path):
    two_hosts.update_gpu("node02", 1, ecc_uncorrected_volatile=2)   # 3 healthy of the pool's 4
    url = new_ledger(tmp_path / "ledger.db")
    r, _, _ = run_dag(airflow_home, two_hosts, tmp_path, gpu_count=4, ledger_url=url, wait_for_capacity=True,
                      capacity_timeout=14, capacity_poll_interval=1)
    log = r.stdout + r.stderr
    assert r.returncode != 0
    warnings = re.findall(r"\[warning\s*\] job \S+: waits until hosts or GPUs come back \(its pools lack that many "
                          r"healthy GPUs\): .*needs 4 GPUs, has 3 healthy of 4", log)
    assert len(warnings) >= 2, log[-6000:]   # said at once, and again while it waits
    assert "not admitted within 14 s" in log and "more GPUs than any matching pool" not in log
    with Ledger.from_url(url) as ledger:
        assert ledger.queue() == []


# --- 2. unknown host keys ---------------------------------------------------------------------------------
def test_unknown_host_keys_fail_once_naming_every_host(airflow_home, two_hosts, tmp_path):
    env_conns, _ = connection_env(two_hosts)
    unpinned = {}
    for name, value in env_conns.items():
        conn = json.loads(value)
        conn["extra"].pop("host_key")   # and the worker's known_hosts does not list the emulated hosts
        unpinned[name] = json.dumps(conn)
    r, log, _ = run_retry_dag(airflow_home, two_hosts, tmp_path, conns=unpinned, gpu_count=2,
                              ledger_url=new_ledger(tmp_path / "ledger.db"))
    assert r.returncode != 0
    ports = [h.port for h in two_hosts.hosts]
    failed_once(airflow_home, "hg_retry_test", "train", log,
                f"no GPU host could be collected: node01: unknown host key for 127.0.0.11:{ports[0]}: not in "
                f"known_hosts (host keys are verified); node02: unknown host key for 127.0.0.12:{ports[1]}")
    assert "no pool can host" not in log
    # one attempt a host: no reconnects on the used socket, no paramiko noise about it
    assert "Sleeping before retry attempt" not in log and "Socket exception" not in log, log[-6000:]


# --- 4. a missing script; a worker's error line ------------------------------------------------------------
def test_a_missing_script_fails_before_torchrun_naming_hosts_and_path(airflow_home, two_hosts, tmp_path):
    missing = tmp_path / "dags" / "train_missing.py"
    url = new_ledger(tmp_path / "ledger.db")
    r, log, _ = run_retry_dag(airflow_home, two_hosts, tmp_path, gpu_count=4, script=str(missing), ledger_url=url)
    assert r.returncode != 0
    failed_once(airflow_home, "hg_retry_test", "train", log,
                f"script {missing}: no such file on node01, node02: nothing was started")
    assert "job hg_retry_test.train" in log and "starting on" not in log and "[node01 rank" not in log
    with Ledger.from_url(url) as ledger:
        assert ledger.live_reservations() == []


def test_a_missing_workdir_fails_the_decorated_task_before_torchrun(airflow_home, two_hosts, tmp_path):
    url = new_ledger(tmp_path / "ledger.db")
    r, log = run_decorated(airflow_home, two_hosts, tmp_path, ledger_url=url, gpu_count=2,
                           workdir=str(tmp_path / "no-such-workdir"))
    assert r.returncode != 0
    failed_once(airflow_home, "hg_decorator_test", "train", log,
                f"workdir {tmp_path / 'no-such-workdir'}: no such directory on node0")
    assert "starting on" not in log
    with Ledger.from_url(url) as ledger:
        assert ledger.live_reservations() == []


def test_a_failed_job_names_the_first_error_line_the_workers_printed(airflow_home, two_hosts, tmp_path):
    r, _, _ = run_dag(airflow_home, two_hosts, tmp_path, gpu_count=2, script_args=["--no-such-option"])
    log = r.stdout + r.stderr
    assert r.returncode != 0
    line = re.search(r"AirflowException: (job (hg_train_test\.train\.\S+): worker on node0[12] \(node rank 0\) exited "
                     r"with \d+ first: .*error: unrecognized arguments: --no-such-option.*)", log)
    assert line, log[-6000:]
    assert line.group(1).endswith("The other hosts were stopped; their output is in the task log above.")
    assert not any(c in log for c in CHAINED)
    assert leftovers(line.group(2)) == ""  # this run's job (other tests' jobs may run beside it)
