"""The operator plans from the ledger's inventory: a task touches only its own hosts, a stale
inventory is collected again, a setup mistake is not "no capacity" (real sshd, airflow dags test)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from airflow_hetero_gpu.cli.app import main
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from dag_run_helpers import airflow_home, run_dag  # noqa: F401

pytest.importorskip("torch", reason="torch (CPU build) is needed to train the example model")


def fill_ledger(cluster, url: str, capsys=None) -> None:
    """What the health watch does: collect the fleet into the ledger's inventory."""
    code = main(["collect", "--hosts", cluster.hosts_arg(), "--identity-file", str(cluster.identity_file),
                 "--known-hosts", str(cluster.known_hosts_path), "--ledger", url])
    assert code == 0


@pytest.mark.parametrize("n_hosts", [2, 8])
def test_a_task_opens_ssh_only_to_the_hosts_it_runs_on(airflow_home, emulated_cluster, tmp_path, n_hosts, capsys):
    cluster = emulated_cluster(small_hosts(n_hosts, gpus=2), sshd_log_level="VERBOSE")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    fill_ledger(cluster, url)
    # what `hetero-gpu plan --ledger` says the task will get, before it runs
    capsys.readouterr()
    assert main(["plan", "--ledger", url, "--gpus", "2", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    before = cluster.connections()
    assert all(c >= 1 for c in before.values())  # the collection reached every host
    r, out, cfg = run_dag(airflow_home, cluster, tmp_path, gpu_count=2, script_args=["--epochs", "1"],
                          inventory_max_age=3600)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-6000:]
    decision = json.loads(out.read_text())
    opened = {h: n - before[h] for h, n in cluster.connections().items()}
    assert len(decision["hosts"]) == 1
    used = decision["hosts"][0]
    assert opened[used] == 1, opened  # one connection for the sweep, the port probe and the launch
    assert {h: n for h, n in opened.items() if h != used} == {h: 0 for h in opened if h != used}, opened
    assert f"inventory from the ledger: {n_hosts} host(s), " in log and "collecting" not in log
    # the operator's decision is the plan the ledger gave for the same request
    pushed = json.loads(out.with_name(out.name + ".xcom").read_text())
    inventory = pushed.pop("inventory")
    assert pushed == planned
    assert inventory["source"] == "ledger" and inventory["collected_now"] == [] and inventory["max_age_s"] == 3600
    assert inventory["hosts"] == n_hosts and inventory["oldest_s"] >= 0
    with Ledger.from_url(url) as led:
        assert led.live_reservations() == [] and led.job_hosts(decision["job_id"]) == []


def test_a_stale_inventory_is_collected_again_and_one_that_cannot_be_refreshed_is_a_clear_reason(
        airflow_home, emulated_cluster, tmp_path):
    cluster = emulated_cluster(small_hosts(2, gpus=2), sshd_log_level="VERBOSE")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    fill_ledger(cluster, url)
    before = cluster.connections()
    r, out, _ = run_dag(airflow_home, cluster, tmp_path, gpu_count=2, script_args=["--epochs", "1"],
                        inventory_max_age=0)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-6000:]
    assert "inventory: collecting 2 host(s) whose inventory is missing or older than 0 s: node01, node02" in log
    assert all(n > before[h] for h, n in cluster.connections().items())
    inventory = json.loads(out.with_name(out.name + ".xcom").read_text())["inventory"]
    assert inventory["collected_now"] == ["node01", "node02"]
    # the hosts stop answering: the refresh fails, the stale hosts are not placed on, and the
    # task says why per host in one line (no traceback of ours, no "capacity" wording), retryable
    for host in ("node01", "node02"):
        cluster.inject_fault(host, "host_down")
    r, out, _ = run_dag(airflow_home, cluster, tmp_path, gpu_count=2, inventory_max_age=0)
    log = r.stdout + r.stderr
    assert r.returncode != 0
    assert "GPU host node01: collection failed: connection refused" in log
    assert re.search(r"AirflowException: no GPU host could be collected: node01: connection refused \(127\.0\.0\.11:\d+\); "
                     r"node02: connection refused", log), log[-4000:]
    assert "no pool can host" not in log and "AirflowFailException" not in log


def test_undefined_connections_fail_at_once_naming_each(airflow_home, emulated_cluster, tmp_path):
    cluster = emulated_cluster(small_hosts(1, gpus=2))
    r, out, _ = run_dag(airflow_home, cluster, tmp_path, gpu_count=2,
                        ssh_conn_ids={"node01": "gpu_typo_1", "node09": "gpu_typo_9"},
                        wait_for_capacity=True, capacity_timeout=3600)
    log = r.stdout + r.stderr
    assert r.returncode != 0
    assert ("no GPU host could be collected: node01: Airflow connection 'gpu_typo_1' cannot be used: " in log
            and "node09: Airflow connection 'gpu_typo_9' cannot be used: " in log), log[-4000:]
    assert "AirflowFailException" in log  # no retry, no wait for capacity
    assert "no pool can host" not in log and "deferring" not in log
