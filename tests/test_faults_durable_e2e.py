"""Faults during a durable run, end to end: `airflow dags test` of the durable test DAG (one
retry) on the emulated cluster (real sshd per host), the job under each host's supervisor.

A host the try cannot reach may still run its share of the job under its dead-man switch: its
GPUs stay reserved until the switch has stopped it (docs/durability.md). A host that reboots
loses its share: the retry finds the job failed and launches afresh from the checkpoint."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from pathlib import Path

import pytest

from airflow_hetero_gpu.launch.command import HOST_ENV, JOB_ENV
from airflow_hetero_gpu.launch.orphans import KILL_WAIT_S
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing import procs
from cluster_fixtures import emulated_cluster  # noqa: F401
from dag_run_helpers import airflow_home, finish, leftovers, start_dag, two_hosts  # noqa: F401
from ledger_files import new_ledger

pytest.importorskip("torch", reason="torch (CPU build) is needed to train the example model")


def _when(pattern: str):
    """An on_line callback and the event it sets at the first line matching ``pattern``."""
    seen = threading.Event()
    return (lambda line: seen.set() if re.search(pattern, line) else None), seen


def _live(url: str) -> list[str]:
    with Ledger.from_url(url) as ledger:
        return [r.job_id for r in ledger.live_reservations()]


def _on(job_id: str, host: str) -> bool:
    """A process of the job runs on the emulated ``host``."""
    return bool(set(procs.with_env(JOB_ENV, job_id)) & set(procs.with_env(HOST_ENV, host)))


def _durable(tmp_path: Path, unattended: float, grace: float, host_timeout: float, **more) -> dict:
    """A durable task's arguments, the lease at its shortest. ``host_timeout`` leaves a loaded
    machine room (its keepalives and heartbeats come every quarter of it, or of the switch's time)."""
    return {"durable": True, "unattended_timeout": unattended, "preemption_grace": grace,
            "host_timeout": host_timeout, "lease_seconds": unattended + grace + 15,
            "ledger_url": new_ledger(tmp_path / "ledger.db"), **more}


def _reboot(cluster, host: str, job_id: str) -> None:
    """``host`` goes down: its sshd and its sessions die first (the job's connection is lost, and
    nothing can reach the host), then every process of the job there and its supervisor
    (SIGKILL). Its run files stay, as a home directory does. (Not the ``host_down`` fault: it
    SIGKILLs whatever the host's sessions started, a login shell's start-up files included, and
    an interrupted start-up may leave a lock behind for every emulated host of this machine.)"""
    cluster.inject_fault(host, "sshd_killed")
    supervisor = int((Path.home() / ".hetero-gpu" / "run" / job_id / f"{host}.sup").read_text())
    share = set(procs.with_env(JOB_ENV, job_id)) & set(procs.with_env(HOST_ENV, host))
    assert share and procs.alive(supervisor)
    assert procs.kill_all({pid: 0 for pid in share | {supervisor}}) == []


def _retry_delay(seconds: float) -> dict[str, str]:
    return {"HG_TEST_DURABLE_CONFIG": json.dumps({"retry_delay_s": seconds})}


def test_durable_sshd_killed_on_a_host_its_gpus_stay_reserved_until_the_switch_there_stopped_the_job(
        airflow_home, two_hosts, tmp_path):
    """node02's sshd dies (`pkill sshd`) while a durable job runs on both hosts: the try fails, node01
    is swept, but node02 cannot be reached, and its share runs on there under its supervisor. So
    the try keeps the job's reservation and its handle; the retry cannot ask node02 and launches
    and releases nothing. Sampled every 0.2 s: while a process of the job runs (node02's, until
    its dead-man switch stops it, `unattended_timeout` 20 s after the last heartbeat), its
    reservation is live, so no other job can be placed on its GPUs; the lease frees them only
    after. (A command that runs on each host by itself, so node02's share cannot end early with
    its peers.)"""
    job_id = f"durable-sshd-{uuid.uuid4().hex[:8]}"
    unattended, grace = 20, 3
    cfg = _durable(tmp_path, unattended, grace, 12, job_id=job_id, gpu_count=4,
                   command=["sh", "-c", 'while :; do echo "tick on $HETERO_GPU_HOST"; sleep 0.5; done'])
    ticks = {"node01": threading.Event(), "node02": threading.Event()}

    def on_line(line: str) -> None:
        if m := re.search(r"tick on (node0[12])", line):
            ticks[m.group(1)].set()

    proc, pump, lines, _, cfg = start_dag(airflow_home, two_hosts, tmp_path, "durable-sshd", on_line,
                                          dag_id="hg_durable_test", airflow_extra=_retry_delay(1), **cfg)
    url = cfg["ledger_url"]
    samples = []  # (seconds after the fault, node01 runs it, node02 runs it, reservation live, task running)
    try:
        assert all(tick.wait(240) for tick in ticks.values()), "".join(lines)[-4000:]
        assert _on(job_id, "node01") and _on(job_id, "node02") and _live(url) == [job_id]
        two_hosts.inject_fault("node02", "sshd_killed")
        fault = time.monotonic()
        while time.monotonic() - fault < 150:
            on1, on2, live = _on(job_id, "node01"), _on(job_id, "node02"), job_id in _live(url)
            samples.append((time.monotonic() - fault, on1, on2, live, proc.poll() is None))
            if not (on1 or on2 or live) and proc.poll() is not None:
                break
            time.sleep(0.2)
    finally:
        finish(proc, pump, timeout=120)
    log = "".join(lines)
    (tmp_path / "dags-test.log").write_text(log)
    assert all(live for _, on1, on2, live, _ in samples if on1 or on2), samples  # never running without its lease
    # node02's share ran on after both tries had ended, then its switch stopped it
    after_task = [s for s in samples if not s[4]]
    assert any(on2 for _, _, on2, _, _ in after_task), samples
    assert not any(on1 for t, on1, *_ in samples if t > 30), samples   # node01 was swept by the try
    stopped_at = next(t for t, on1, on2, *_ in samples if not (on1 or on2))
    freed_at = next(t for t, _, _, live, _ in samples if not live)
    assert freed_at >= stopped_at, (stopped_at, freed_at)
    assert stopped_at <= unattended + 1 + grace + KILL_WAIT_S + 5, samples
    assert proc.returncode != 0, log[-5000:]
    assert re.search(rf"job {job_id}: could not stop its share on node02 \(unreachable\): its reservation is kept",
                     log), log[-6000:]
    # the retry: node02 cannot be asked, so nothing is launched or released
    assert re.search(rf"job {job_id}: cannot tell whether the earlier try's job still runs \(node01: gone[^;]*; "
                     r"node02: unknown", log), log[-6000:]
    assert f"job {job_id}: reservation released" not in log
    assert log.count(f"job {job_id}: starting on") == 1
    assert (Path.home() / ".hetero-gpu" / "run" / job_id / "node02.deadman").exists()
    assert leftovers(job_id) == "" and _live(url) == []
    print(f"after the fault: node02's share stopped by its switch at {stopped_at:.1f} s, "
          f"the lease freed the GPUs at {freed_at:.1f} s")


def test_durable_a_host_reboots_mid_training_the_retry_launches_afresh_from_the_checkpoint(
        airflow_home, two_hosts, tmp_path):
    """node02 reboots while the job holds after epoch 3 (its checkpoint saved): its sshd, the
    job's share and its supervisor die (:func:`_reboot`), and once the first try has ended its
    sshd comes back; its run files stay on disk, as a home directory does. The try fails (node02's connection is lost and it cannot
    be swept while it is down: the reservation and the handle stay); the retry asks both hosts,
    finds the job failed (node01 swept, node02's supervisor gone without an exit status), stops
    what is left, releases, and launches afresh: resumed from epoch 3, it ends `success`."""
    job_id = f"durable-reboot-{uuid.uuid4().hex[:8]}"
    ckpt = tmp_path / "ckpt"
    cfg = _durable(tmp_path, 60, 3, 30, job_id=job_id, gpu_count=4, checkpoint_dir=str(ckpt),
                   script_args=["--epochs", "6", "--hold-after-epoch", "3", "--hold-file", str(tmp_path / "never")])
    on_hold, holding = _when(r"holding after epoch 3")
    on_fail, first_failed = _when(r"\[DAG TEST\] end task task_id=train ")

    def on_line(line: str) -> None:
        on_hold(line)
        on_fail(line)

    # the retry comes 15 s after the first try failed; node02's sshd is back within its start timeout (10 s)
    proc, pump, lines, _, cfg = start_dag(airflow_home, two_hosts, tmp_path, "durable-reboot", on_line,
                                          dag_id="hg_durable_test", airflow_extra=_retry_delay(15), **cfg)
    try:
        assert holding.wait(240), "".join(lines)[-4000:]
        assert _on(job_id, "node02")
        _reboot(two_hosts, "node02", job_id)               # the machine goes down ...
        assert not _on(job_id, "node02")
        assert first_failed.wait(120), "".join(lines)[-5000:]
        two_hosts.clear_fault("node02", "sshd_killed")    # ... and comes back
        finish(proc, pump)
    finally:
        finish(proc, pump, timeout=30)
        (tmp_path / "dags-test.log").write_text("".join(lines))
    log = "".join(lines)
    (tmp_path / "dags-test.log").write_text(log)
    assert proc.returncode == 0, log[-6000:]
    first, _, second = log.partition("[DAG TEST] end task task_id=train ")
    assert re.search(rf"job {job_id}: could not stop its share on node02 \(unreachable\)", first), first[-5000:]
    assert f"job {job_id}: reservation released" not in first
    assert re.search(rf"job {job_id}: the earlier try's job cannot be reattached \(node01: gone[^;]*; node02: "
                     r"failed \(its supervisor is gone without an exit status\)\)", second), second[-6000:]
    assert re.search(r"rank \d resumed from epoch 3", second), second[-5000:]
    assert re.findall(r"epoch (\d) loss", second) == ["4", "5", "6"], second[-5000:]
    assert leftovers(job_id) == "" and _live(cfg["ledger_url"]) == []
