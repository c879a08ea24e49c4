"""[hetero_gpu] settings: the deployment's defaults for hooks, operator and sensor."""

from __future__ import annotations

import json

import pytest

from airflow_hetero_gpu.errors import ConfigError
from airflow_hetero_gpu.hooks.hetero_gpu import HeteroGpuHook
from airflow_hetero_gpu.hooks.ledger import LedgerHook


def test_hosts_come_from_the_setting(monkeypatch):
    monkeypatch.setenv("AIRFLOW__HETERO_GPU__SSH_CONN_IDS", "dgx-a1=ssh_a1, rtx-box=ssh_rtx")
    assert HeteroGpuHook().hosts == {"dgx-a1": "ssh_a1", "rtx-box": "ssh_rtx"}
    assert HeteroGpuHook(["x"]).hosts == {"x": "x"}  # an argument wins


def test_no_hosts_anywhere_is_one_line(monkeypatch):
    monkeypatch.delenv("AIRFLOW__HETERO_GPU__SSH_CONN_IDS", raising=False)
    with pytest.raises(ConfigError, match=r"^no GPU hosts: give ssh_conn_ids, or set \[hetero_gpu\] ssh_conn_ids"):
        HeteroGpuHook().hosts


def test_captures_dir_comes_from_the_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW__HETERO_GPU__CAPTURES_DIR", str(tmp_path / "caps"))
    assert HeteroGpuHook(["x"]).captures_path == tmp_path / "caps"
    assert (tmp_path / "caps").is_dir()


def test_ledger_comes_from_the_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW__HETERO_GPU__LEDGER_URL", f"sqlite:///{tmp_path}/l.db")
    assert LedgerHook().get_url() == f"sqlite:///{tmp_path}/l.db"
    monkeypatch.setenv("AIRFLOW_CONN_MY_LEDGER", json.dumps({"conn_type": "sqlite", "host": "/x.db"}))
    monkeypatch.setenv("AIRFLOW__HETERO_GPU__LEDGER_CONN_ID", "my_ledger")
    assert LedgerHook().get_url() == "sqlite:////x.db"  # the connection wins over the URL setting
    assert LedgerHook(ledger_url="sqlite:///arg.db").get_url() == "sqlite:///arg.db"  # an argument wins


@pytest.mark.parametrize("value", ["inf", "1e300", "nan", "-1"])
def test_a_seconds_setting_is_finite_and_bounded(monkeypatch, value):
    from airflow_hetero_gpu.settings import preemption_settings

    monkeypatch.setenv("AIRFLOW__HETERO_GPU__PREEMPTION_DELAY", value)
    with pytest.raises(ConfigError, match=r"^\[hetero_gpu\] preemption_delay: expected (seconds >= 0|at most "
                                          r"315360000 seconds \(ten years\)), got '"):
        preemption_settings()
