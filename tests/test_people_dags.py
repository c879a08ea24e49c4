"""People on the fleet, as a DAG author sees them (real sshd per emulated host, ``airflow dags
test``): a GPU in use outside the scheduler keeps the operator off it; drained hosts send the
next run elsewhere, a run on a drained host finishes undisturbed."""

from __future__ import annotations

import json
import threading

import pytest

from airflow_hetero_gpu.cli.app import main
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from dag_run_helpers import airflow_home, finish, run_dag, start_dag  # noqa: F401
from people_fixtures import other_users_process  # noqa: F401

pytest.importorskip("torch", reason="torch (CPU build) is needed to train the example model")

EVENT_TIMEOUT_S = 300  # a safety net only: the tests wait on ledger rows and log lines


def fill_ledger(cluster, url: str, *extra: str) -> None:
    """What the health watch does: collect the fleet into the ledger's inventory."""
    assert main(["collect", "--hosts", cluster.hosts_arg(), "--identity-file", str(cluster.identity_file),
                 "--known-hosts", str(cluster.known_hosts_path), "--ledger", url, *extra]) == 0


def test_the_operator_keeps_off_a_gpu_in_use_outside_the_scheduler(airflow_home, emulated_cluster,
                                                                    other_users_process, tmp_path):
    pid, user = other_users_process
    cluster = emulated_cluster(small_hosts(2, gpus=2))
    cluster.update_gpu("node01", 1, utilization_gpu=0, memory_used_mib=1632,
                       processes=[{"pid": pid, "name": "python3", "memory_mib": 1632}])
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    fill_ledger(cluster, url)
    common = dict(ledger_url=url, inventory_max_age=3600, script_args=["--epochs", "1"])

    r, _, _ = run_dag(airflow_home, cluster, tmp_path, gpu_count=4, **common)
    log = r.stdout + r.stderr
    assert r.returncode != 0
    assert (f"1 in use outside the scheduler (node01 GPU1 in use outside the scheduler: {user}, pid {pid} "
            "python3, 1,632 MiB)") in log, log[-4000:]

    r, out, _ = run_dag(airflow_home, cluster, tmp_path, gpu_count=2, **common)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    assert json.loads(out.read_text())["hosts"] == ["node02"]

    config = tmp_path / "cluster.yaml"
    config.write_text("thresholds:\n  foreign_processes: ignore\n")
    fill_ledger(cluster, url, "--config", str(config))
    r, out, _ = run_dag(airflow_home, cluster, tmp_path, gpu_count=4, **common)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    assert sorted(json.loads(out.read_text())["hosts"]) == ["node01", "node02"]


def test_drain_sends_the_next_run_elsewhere_and_undrain_brings_the_host_back(airflow_home, emulated_cluster,
                                                                              tmp_path, capsys):
    cluster = emulated_cluster(small_hosts(2, gpus=2))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    fill_ledger(cluster, url)
    common = dict(ledger_url=url, inventory_max_age=3600, script_args=["--epochs", "1"], gpu_count=2)

    assert main(["drain", "node01", "--ledger", url, "--reason", "driver upgrade to 580"]) == 0
    r, out, _ = run_dag(airflow_home, cluster, tmp_path, **common)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    assert json.loads(out.read_text())["hosts"] == ["node02"]

    assert main(["drain", "node02", "--ledger", url, "--reason", "rack power work"]) == 0
    capsys.readouterr()
    assert main(["plan", "--ledger", url, "--gpus", "2"]) == 3
    said = capsys.readouterr().out
    assert "4 on drained hosts (node01 drained: driver upgrade to 580, node02 drained: rack power work)" in said
    r, _, _ = run_dag(airflow_home, cluster, tmp_path, **common)
    log = r.stdout + r.stderr
    assert r.returncode != 0
    assert "node01 drained: driver upgrade to 580, node02 drained: rack power work" in log, log[-4000:]

    assert main(["undrain", "node01", "node02", "--ledger", url]) == 0
    r, out, _ = run_dag(airflow_home, cluster, tmp_path, **common)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    assert len(json.loads(out.read_text())["hosts"]) == 1


def test_a_run_on_a_drained_host_finishes_undisturbed(airflow_home, emulated_cluster, tmp_path):
    cluster = emulated_cluster(small_hosts(2, gpus=2))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    fill_ledger(cluster, url)
    release = tmp_path / "release"
    holding = threading.Event()

    def on_line(line: str) -> None:
        if "holding after epoch 1" in line:
            holding.set()

    proc, pump, lines, out, _ = start_dag(
        airflow_home, cluster, tmp_path, "drained", on_line, gpu_count=2, ledger_url=url, inventory_max_age=3600,
        lease_seconds=6, script_args=["--epochs", "3", "--hold-after-epoch", "1", "--hold-file", str(release)])
    try:
        assert holding.wait(EVENT_TIMEOUT_S), "".join(lines)[-4000:]
        with Ledger.from_url(url) as led:
            (res,) = led.live_reservations()
            (host,) = res.hosts
            led.drain([host], "maintenance after this run")
            drained_at = led.now()
        fill_ledger(cluster, url)  # the health watch keeps collecting meanwhile
        # the job renews its lease on the drained host (every 2 s with a 6 s lease): wait for one
        with Ledger.from_url(url) as led:
            waited = 0.0
            while led.get(res.job_id).renewed_at <= drained_at and waited < EVENT_TIMEOUT_S:
                threading.Event().wait(0.2)
                waited += 0.2
            assert led.get(res.job_id).renewed_at > drained_at
    finally:
        release.touch()
        finish(proc, pump, timeout=600)
    log = "".join(lines)
    assert proc.returncode == 0, log[-6000:]
    assert "training done" in log and "epoch 3 loss" in log
    assert json.loads(out.read_text())["hosts"] == [host]
    with Ledger.from_url(url) as led:
        assert led.live_reservations() == [] and [d.host for d in led.drains()] == [host]


def _processes_of(job_id: str) -> list[int]:
    """The processes on this machine (every emulated host) whose environment marks the job."""
    import os

    marker = f"HETERO_GPU_JOB_ID={job_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_a_process_outside_the_scheduler_on_a_running_jobs_gpu_is_a_warning(airflow_home, emulated_cluster,
                                                                            other_users_process, tmp_path):
    from airflow_hetero_gpu.collect.freshness import FreshInventory
    from airflow_hetero_gpu.plugins import model as page_model

    pid, user = other_users_process
    cluster = emulated_cluster(small_hosts(1, gpus=2))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    fill_ledger(cluster, url)
    release = tmp_path / "release"
    holding, warned = threading.Event(), threading.Event()

    def on_line(line: str) -> None:
        if "holding after epoch 1" in line:
            holding.set()
        if "is also in use outside the scheduler" in line:
            warned.set()

    proc, pump, lines, out, _ = start_dag(
        airflow_home, cluster, tmp_path, "intruder", on_line, gpu_count=2, ledger_url=url, inventory_max_age=3600,
        script_args=["--epochs", "2", "--hold-after-epoch", "1", "--hold-file", str(release)])
    try:
        assert holding.wait(EVENT_TIMEOUT_S), "".join(lines)[-4000:]
        with Ledger.from_url(url) as led:
            (res,) = led.live_reservations()
        own = _processes_of(res.job_id)
        assert own, "the job's processes carry its marker"
        # GPU 0 lists one of the job's own processes and someone else's notebook
        cluster.update_gpu("node01", 0, processes=[{"pid": own[-1], "name": "python", "memory_mib": 900},
                                                   {"pid": pid, "name": "python3", "memory_mib": 1632}])
        fill_ledger(cluster, url)
        assert warned.wait(EVENT_TIMEOUT_S), "".join(lines)[-4000:]
        with Ledger.from_url(url) as led:  # the page shows it on the reserved GPU
            page = page_model.build(FreshInventory(led.inventory(), float("inf")).cluster(), led.live_reservations(),
                                    led.evictions())
        (gpu0,) = [g for g in page.gpus if (g["host"], g["index"]) == ("node01", 0)]
        assert gpu0["state"] == "reserved"
        assert gpu0["held"] == [f"in use outside the scheduler beside job {res.job_id}: {user}, pid {pid} python3, "
                                "1,632 MiB"]
    finally:
        release.touch()
        finish(proc, pump, timeout=600)
    log = "".join(lines)
    assert proc.returncode == 0, log[-6000:]
    warnings = [line for line in log.splitlines() if "is also in use outside the scheduler" in line]
    assert len(warnings) == 1 and f"GPU node01:0 is also in use outside the scheduler: {user}, pid {pid} " \
        "python3, 1,632 MiB (the job runs on; the GPU is not evicted)" in warnings[0], warnings
    assert "training done" in log
