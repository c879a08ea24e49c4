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
