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


def test_a_bad_preemption_setting_stops_no_write(monkeypatch, tmp_path):
    """The pass's settings are read before a write takes the ledger's lock; one that does not
    parse is the pass's to report (on the waiting entry), and the writes go on."""
    from airflow_hetero_gpu.core.model import PlanRequest
    from airflow_hetero_gpu.ledger import Ledger
    from airflow_hetero_gpu.ledger.inventory import HostRecord
    from airflow_hetero_gpu.testing.captures import host_files
    from airflow_hetero_gpu.testing.demo import small_hosts

    monkeypatch.setenv("AIRFLOW__HETERO_GPU__PREEMPTION_DELAY", "nan")
    with Ledger.from_url(f"sqlite:///{tmp_path}/l.db") as led:
        led.store_collection([HostRecord(s.name, True, host_files(s)) for s in small_hosts(1, gpus=2)],
                             collector="test")
        entry = led.enqueue("j", PlanRequest(2), lease_seconds=600)
        assert not entry.admitted
        assert "admission could not run: [hetero_gpu] preemption_delay" in led.queue_entry("j").reason
        assert led.leave_queue("j")
