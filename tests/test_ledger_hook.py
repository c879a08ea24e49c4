"""LedgerHook: the ledger named by an Airflow connection (from AIRFLOW_CONN_* variables)."""

from __future__ import annotations

import json

import pytest

from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.hooks.ledger import LedgerHook
from airflow_hetero_gpu.ledger import Ledger, MissingLedger


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
    Ledger.from_url(str(tmp_path / "l.db")).close()  # `hetero-gpu ledger init`
    with LedgerHook(ledger_conn_id="ledger_t").get_ledger() as ledger:
        assert ledger.live_reservations() == []


@pytest.mark.parametrize("named", ["url", "conn"])
def test_a_missing_sqlite_ledger_named_by_the_task_is_refused_not_created(monkeypatch, tmp_path, named):
    path = tmp_path / "typo-dir" / "ledger.db"
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_T", json.dumps({"conn_type": "sqlite", "host": str(path)}))
    hook = LedgerHook(ledger_url=f"sqlite:///{path}") if named == "url" else LedgerHook(ledger_conn_id="ledger_t")
    with pytest.raises(MissingLedger, match=rf"^no ledger at sqlite:///{path} \(no such file\): create it with "
                                            r"`hetero-gpu ledger init URL`"):
        hook.get_ledger()
    assert not path.parent.exists()  # neither the file nor its directory was made


def test_the_deployments_own_ledger_is_created_on_first_use_and_named_in_the_log(monkeypatch, tmp_path, capsys):
    # the [hetero_gpu] setting's ledger, whether or not the task repeats it, is created
    path = tmp_path / "deployment" / "ledger.db"
    path.parent.mkdir()
    monkeypatch.setenv("AIRFLOW__HETERO_GPU__LEDGER_URL", f"sqlite:///{path}")
    LedgerHook().get_ledger().close()
    assert path.is_file()
    assert f"ledger: sqlite:///{path}" in capsys.readouterr().out  # the task log's line
    path.unlink()
    LedgerHook(ledger_url=f"sqlite:///{path}").get_ledger().close()
    assert path.is_file()
    # with no setting, the default file under $AIRFLOW_HOME
    monkeypatch.delenv("AIRFLOW__HETERO_GPU__LEDGER_URL")
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    LedgerHook().get_ledger().close()
    assert (tmp_path / "home" / "hetero_gpu_ledger.db").is_file()


def test_the_log_masks_the_ledgers_password(monkeypatch, capsys):
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_PG", json.dumps(
        {"conn_type": "postgres", "host": "db.example", "login": "sched", "password": "s3cret", "schema": "gpus"}))
    assert "s3cret" in LedgerHook(ledger_conn_id="ledger_pg").checked_url()
    out = capsys.readouterr().out
    assert "ledger: postgresql+psycopg://sched:***@db.example/gpus" in out and "s3cret" not in out


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

    from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator
    from airflow_hetero_gpu.operators.placement import Placement
    from airflow_hetero_gpu.operators.queue_wait import QueueWait

    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_T", json.dumps(
        {"conn_type": "postgres", "host": "db.example", "login": "sched", "password": "s3cret-pw", "schema": "gpus"}))
    monkeypatch.setenv("AIRFLOW__HETERO_GPU__LEDGER_CONN_ID", "ledger_t")
    op = HeteroTrainOperator(task_id="t", gpu_count=2, script="train.py", ssh_conn_ids=["a"],
                             wait_for_capacity=True, deferrable=True)
    specs = op._validate()  # as execute() does first (a durable task's lease follows unattended_timeout)
    with pytest.raises(TaskDeferred) as deferred:
        QueueWait(Placement(specs, op.runtime, {}, "job")).defer(time.time(), time.time() + 3600)
    classpath, kwargs = deferred.value.trigger.serialize()
    assert classpath == "airflow_hetero_gpu.triggers.queue.QueueTrigger" and kwargs["job_id"] == "job"
    assert (kwargs["ledger_conn_id"], kwargs["ledger_url"]) == ("ledger_t", None)
    assert "s3cret-pw" not in json.dumps(kwargs)
