"""GpuHealthSensor in real DAG runs (``airflow dags test``): poke mode and deferrable mode agree.

The emulated hosts are reached through Airflow ``ssh`` connections given as ``AIRFLOW_CONN_<ID>``
JSON (host key verified through the ``host_key`` extra); the trigger of the deferrable run
runs inline in ``airflow dags test``. Each DAG hands the sensor's XCom to a task that writes it
to a file, and the two files must hold the same evictions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from ledger_files import new_ledger
from test_sensor import connection_env

REPO = Path(__file__).resolve().parents[1]

DAG_FILE = '''
import json, os
from datetime import datetime
from pathlib import Path

from airflow.sdk import dag, task
from airflow_hetero_gpu.sensors.gpu_health import GpuHealthSensor

HOSTS = json.loads(os.environ["HETERO_GPU_TEST_HOSTS"])
OUT = Path(os.environ["HETERO_GPU_TEST_OUT"])


def make(dag_id, deferrable, ledger_url):
    @dag(dag_id=dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
    def health():
        watch = GpuHealthSensor(
            task_id="gpu_health", ssh_conn_ids=HOSTS, mode_kind="watch", watch_duration=0,
            ledger_url=ledger_url, poke_interval=1, timeout=300, deferrable=deferrable,
            connect_timeout=5, command_timeout=20, retries=1,
        )

        @task
        def keep(result):
            (OUT / f"{dag_id}.json").write_text(json.dumps(result, sort_keys=True))

        keep(watch.output)

    return health()


make("gpu_health_poke", False, os.environ["HETERO_GPU_TEST_LEDGER_POKE"])
make("gpu_health_deferred", True, os.environ["HETERO_GPU_TEST_LEDGER_DEFERRED"])
'''


def airflow_cli() -> Path:
    exe = Path(sys.executable).with_name("airflow")
    if not exe.exists():
        pytest.skip(f"the airflow command is not installed beside {sys.executable}")
    return exe


def test_deferrable_and_poke_runs_give_the_same_evictions(emulated_cluster, tmp_path):  # noqa: F811
    airflow = airflow_cli()
    hosts = small_hosts(2, gpus=2)
    hosts[0].gpus[1].ecc_uncorrected_volatile = 2
    hosts[1].xid.append({"time": 421.25, "gpu": 0, "xid": 48})
    hosts[1].gpus[1].temperature_c = 97  # soft: unhealthy now, not yet evicted
    cluster = emulated_cluster(hosts)
    conn_env, ids = connection_env(cluster)
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "gpu_health_dags.py").write_text(DAG_FILE)
    out = tmp_path / "out"
    out.mkdir()
    env = {
        **os.environ, **conn_env,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "HETERO_GPU_TEST_HOSTS": json.dumps(ids),
        "HETERO_GPU_TEST_OUT": str(out),
        "HETERO_GPU_TEST_LEDGER_POKE": new_ledger(tmp_path / 'poke.db'),
        "HETERO_GPU_TEST_LEDGER_DEFERRED": new_ledger(tmp_path / 'deferred.db'),
    }
    migrate = subprocess.run([str(airflow), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    results = {}
    for dag_id in ("gpu_health_poke", "gpu_health_deferred"):
        run = subprocess.run([str(airflow), "dags", "test", dag_id], env=env, capture_output=True, text=True,
                             timeout=300)
        log = run.stdout + run.stderr
        assert run.returncode == 0, log[-4000:]
        assert (out / f"{dag_id}.json").exists(), log[-4000:]
        results[dag_id] = json.loads((out / f"{dag_id}.json").read_text())
        assert "GPU evicted: node01:1" in log, log[-4000:]
        if dag_id == "gpu_health_deferred":  # it really deferred, and the trigger made the check
            assert "Pausing task as DEFERRED" in log and "running trigger in line" in log, log[-4000:]
            assert "GpuHealthTrigger" in log[log.index("GPU evicted: node01:1"):][:400]
    poke, deferred = results["gpu_health_poke"], results["gpu_health_deferred"]
    assert [(e["host"], e["index"], e["reasons"]) for e in poke["evictions"]] == [
        ("node01", 1, ["ecc"]), ("node02", 0, ["xid-48"])]
    assert all(e["uuid"].startswith("GPU-") for e in poke["evictions"])
    assert deferred == poke
    assert {(u["host"], u["index"]): u["reasons"] for u in poke["unhealthy"]} == {
        ("node01", 1): ["ecc"], ("node02", 0): ["xid-48"], ("node02", 1): ["temperature"]}
