"""LedgerHook: the ledger named by an Airflow connection (from AIRFLOW_CONN_* variables)."""

from __future__ import annotations

import json

import pytest

from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.hooks.ledger import LedgerHook


@pytest.mark.parametrize(
    "conn, url",
    [
        ({"conn_type": "postgres", "host": "db.example", "port": 5433, "login": "sched", "password": "p@ss/w",
          "schema": "gpus"}, "postgresql+psycopg://sched:p%40ss%2Fw@db.example:5433/gpus"),
        ({"conn_type": "postgres", "host": "db.example"}, "postgresql+psycopg://db.example/postgres"),
        ({"conn_type": "sqlite", "host": "/var/lib/ledger.db"}, "sqlite:////var/lib/ledger.db"),
        ({"conn_type": "generic", "extra": {"url": "sqlite:///x.db"}}, "sqlite:///x.db"),
    ],
)
def test_url_from_connection(monkeypatch, conn, url):
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_T", json.dumps(conn))
    assert LedgerHook(ledger_conn_id="ledger_t").get_url() == url


def test_wrong_connection_type_is_one_line(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_T", json.dumps({"conn_type": "http", "host": "x"}))
    with pytest.raises(HeteroGpuError, match="^ledger connection 'ledger_t': conn_type 'http' is neither"):
        LedgerHook(ledger_conn_id="ledger_t").get_url()


def test_opens_a_sqlite_ledger(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_T", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "l.db")}))
    with LedgerHook(ledger_conn_id="ledger_t").get_ledger() as ledger:
        assert ledger.live_reservations() == []
    assert (tmp_path / "l.db").exists()


def test_both_is_an_error():
    with pytest.raises(HeteroGpuError, match="not both"):
        LedgerHook(ledger_conn_id="a", ledger_url="sqlite://")


@pytest.mark.parametrize(
    "hook_args, settings, conn_id",
    [
        ({"ledger_conn_id": "arg_conn"}, {"LEDGER_CONN_ID": "set_conn"}, "arg_conn"),
        ({}, {"LEDGER_CONN_ID": "set_conn"}, "set_conn"),
        ({"ledger_url": "sqlite:///x.db"}, {"LEDGER_CONN_ID": "set_conn"}, None),
        ({}, {"LEDGER_URL": "sqlite:///x.db"}, None),
        ({}, {}, None),
    ],
)
def test_conn_id_is_the_argument_else_the_setting(monkeypatch, hook_args, settings, conn_id):
    for name, value in settings.items():
        monkeypatch.setenv(f"AIRFLOW__HETERO_GPU__{name}", value)
    assert LedgerHook(**hook_args).conn_id() == conn_id


def test_a_deferred_capacity_wait_names_the_ledger_connection_not_its_password(monkeypatch):
    """With the ledger named by ``[hetero_gpu] ledger_conn_id``, the queue trigger gets the
    connection id (the triggerer resolves it), never the URL with the password: the trigger's
    arguments are stored in Airflow's metadata database."""
    import time

    from airflow.sdk.exceptions import TaskDeferred

    from airflow_hetero_gpu.core.model import PlanRequest
    from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator
    from airflow_hetero_gpu.operators.placement import Placement
    from airflow_hetero_gpu.operators.queue_wait import QueueWait

    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_T", json.dumps(
        {"conn_type": "postgres", "host": "db.example", "login": "sched", "password": "s3cret-pw", "schema": "gpus"}))
    monkeypatch.setenv("AIRFLOW__HETERO_GPU__LEDGER_CONN_ID", "ledger_t")
    op = HeteroTrainOperator(task_id="t", gpu_count=2, script="train.py", ssh_conn_ids=["a"],
                             wait_for_capacity=True, deferrable=True)
    request = PlanRequest(2)
    with pytest.raises(TaskDeferred) as deferred:
        QueueWait(Placement(op, {}, "job", request)).defer(time.time(), time.time() + 3600)
    classpath, kwargs = deferred.value.trigger.serialize()
    assert classpath == "airflow_hetero_gpu.triggers.queue.QueueTrigger" and kwargs["job_id"] == "job"
    assert (kwargs["ledger_conn_id"], kwargs["ledger_url"]) == ("ledger_t", None)
    assert "s3cret-pw" not in json.dumps(kwargs)
