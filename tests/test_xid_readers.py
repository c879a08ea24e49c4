"""An Xid line is an event for every reader of the ledger: after the eviction it caused, uncordon
makes the GPU placeable again for the command line, the capacity trigger, the cluster page and the operator
while the same old line is still in the kernel log; a new line evicts it again."""

from __future__ import annotations

import json

import pytest

from airflow_hetero_gpu.cli.app import main
from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from airflow_hetero_gpu.triggers.capacity import CapacityTrigger
from dag_run_helpers import airflow_home, run_dag  # noqa: F401


def collect(cluster, url: str) -> None:
    assert main(["collect", "--hosts", cluster.hosts_arg(), "--identity-file", str(cluster.identity_file),
                 "--known-hosts", str(cluster.known_hosts_path), "--ledger", url]) == 0


def page_available(url: str) -> set[str]:
    """The GPUs the cluster page shows as available (its own sources and model, no server)."""
    from airflow_hetero_gpu.plugins.model import gpu_statuses
    from airflow_hetero_gpu.plugins.sources import PageSettings, read_inputs

    inputs = read_inputs(None, PageSettings(ledger_url=url))
    assert inputs.cluster is not None, inputs.sources
    reserved = {g.key: r.job_id for r in inputs.reservations for g in r.gpus}
    evicted = {e.key: e.reasons for e in inputs.evictions}
    return {f"{k[0]}:{k[1]}" for k, st in gpu_statuses(inputs.cluster, reserved, evicted).items() if st.available}


def trigger_places(url: str, gpus: int) -> bool:
    trigger = CapacityTrigger(request={"gpus": gpus}, hosts=["node01", "node02"], ledger_url=url)
    placed, _reasons = trigger.check(url)
    return placed


def test_an_old_xid_line_keeps_no_reader_from_the_gpu(emulated_cluster, airflow_home, tmp_path, capsys):
    pytest.importorskip("torch", reason="torch (CPU build) is needed to train the example model")
    cluster = emulated_cluster(small_hosts(2, gpus=2))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    cluster.add_xid("node01", 1, 79)
    collect(cluster, url)
    assert "evicted node01:1 (xid-79): a new Xid line in its kernel log" in capsys.readouterr().out
    with Ledger.from_url(url) as led:
        assert led.evicted_map() == {GpuKey("node01", 1): ("xid-79",)}
    # evicted: no reader can place 4 GPUs
    assert main(["plan", "--ledger", url, "--gpus", "4", "--json"]) == 3
    assert not trigger_places(url, 4)
    assert "node01:1" not in page_available(url)
    # uncordon; the line is still in the log, a collection stores it again, nothing is new
    assert main(["uncordon", "node01:1", "--ledger", url]) == 0
    collect(cluster, url)
    capsys.readouterr()
    assert main(["plan", "--ledger", url, "--gpus", "4", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert {(g["host"], g["index"]) for g in planned["decision"]["gpus"]} >= {("node01", 1)}
    assert trigger_places(url, 4)
    assert page_available(url) == {"node01:0", "node01:1", "node02:0", "node02:1"}
    # the operator plans from the same inventory and trains on all four GPUs
    r, out, _ = run_dag(airflow_home, cluster, tmp_path, gpu_count=4, script_args=["--epochs", "1"],
                        ledger_url=url, inventory_max_age=0)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-6000:]
    assert len(json.loads(out.read_text())["gpus"]) == 4
    assert "evicted" not in log.split("inventory: collecting", 1)[-1].split("placement for job", 1)[0]
    # a new line evicts it again, for every reader
    cluster.add_xid("node01", 1, 48)
    collect(cluster, url)
    assert main(["plan", "--ledger", url, "--gpus", "4", "--json"]) == 3
    assert not trigger_places(url, 4)
    assert "node01:1" not in page_available(url)
