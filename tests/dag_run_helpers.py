"""Running the operator's test DAG (tests/dags/hg_operator_test.py) with ``airflow dags test``
against an emulated cluster: in the foreground, or in the background with a callback per line.

The fixtures ``airflow_home`` (one migrated AIRFLOW_HOME per test module) and ``two_hosts`` (two
emulated hosts of two GPUs) are imported by the test modules that use them."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from pathlib import Path
from typing import Callable

import pytest

from airflow_hetero_gpu.examples import script_path
from airflow_hetero_gpu.testing.airflow_env import airflow_command, airflow_env, connection_env, dags_test, migrate
from airflow_hetero_gpu.testing.demo import small_hosts
from ledger_files import new_ledger

DAGS = Path(__file__).parent / "dags"
SCRIPT = str(script_path())  # found without importing torch: a module without it skips, not errors


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow")
    migrate(airflow_env(home, DAGS))
    return home


@pytest.fixture
def two_hosts(emulated_cluster):
    return emulated_cluster(small_hosts(2, gpus=2))


def _config(cluster, tmp_path: Path, name: str, config: dict) -> tuple[dict, Path, dict[str, str]]:
    env_conns, ids = connection_env(cluster)
    cfg = {"ssh_conn_ids": ids, "script": SCRIPT, "ledger_url": new_ledger(tmp_path / 'ledger.db'),
           "captures_dir": str(tmp_path / (f"captures-{name}" if name else "captures")),
           "workdir": str(tmp_path), **config}
    out = tmp_path / (f"decision-{name}.json" if name else "decision.json")
    return cfg, out, env_conns


def run_dag(home: Path, cluster, tmp_path: Path, **config):
    """``airflow dags test hg_train_test`` to the end: (completed process, decision file, config)."""
    cfg, out, env_conns = _config(cluster, tmp_path, "", config)
    env = airflow_env(home, DAGS, {**env_conns, "HG_TEST_CONFIG": json.dumps(cfg), "HG_TEST_OUT": str(out)})
    r = dags_test("hg_train_test", env, timeout=600)
    return r, out, cfg


def start_dag(home: Path, cluster, tmp_path: Path, name: str, on_line: Callable[[str], None], *,
              airflow_extra: dict[str, str] | None = None, dag_id: str = "hg_train_test", **config):
    """Run the DAG in the background, calling ``on_line(line)`` for each output line:
    (process, pump thread, lines so far, decision file, config). ``airflow_extra``: more
    environment for Airflow (``AIRFLOW__HETERO_GPU__...`` settings, ``HG_TEST_DURABLE_CONFIG``);
    ``dag_id``: another DAG of tests/dags/hg_operator_test.py (``hg_durable_test``: with a retry)."""
    cfg, out, env_conns = _config(cluster, tmp_path, name, config)
    env = airflow_env(home, DAGS, {**env_conns, "HG_TEST_CONFIG": json.dumps(cfg), "HG_TEST_OUT": str(out),
                                   **(airflow_extra or {})})
    proc = subprocess.Popen([*airflow_command(), "dags", "test", dag_id], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def pump():
        for line in proc.stdout:
            lines.append(line)
            on_line(line)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return proc, thread, lines, out, cfg


def finish(proc, pump, timeout: float = 600) -> None:
    """Wait for a :func:`start_dag` run and its output pump; kill the run if it overstays."""
    try:
        proc.wait(timeout=timeout)
        pump.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()


def losses(text: str) -> list[float]:
    return [float(m) for m in re.findall(r"epoch \d+ loss ([0-9.]+(?:e-?\d+)?)", text)]


def leftovers(job_marker: str) -> str:
    """Processes on this machine (every emulated host) whose command line names ``job_marker``."""
    r = subprocess.run(["pgrep", "-af", job_marker], capture_output=True, text=True)
    return "\n".join(line for line in r.stdout.splitlines() if "pgrep" not in line)


def run_leftovers(log: str, dag_task: str = "hg_train_test.train") -> str:
    """:func:`leftovers` of the jobs ``log`` names (``<dag>.<task>.<hash>``): this run's own, not
    those of other tests running beside it on the machine. A log naming no job is an error."""
    jobs = sorted(set(re.findall(re.escape(dag_task) + r"\.[0-9a-f]{12}\b", log)))
    assert jobs, f"the log names no job {dag_task}.*"
    return "\n".join(found for found in (leftovers(job) for job in jobs) if found)
