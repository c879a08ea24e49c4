"""A preemption victim that cannot be stopped on one of its hosts (unreachable) may still run
there: its GPUs stay reserved, still marked, until its lease runs out, which it does only after
the dead-man switch there has stopped it; that expiry closes the record and admits the preemptor.
The victim's retry cannot ask that host: before the expiry it launches and releases nothing (and
says until when), after it launches afresh. Real sshd per host (the emulated cluster), a real
SQLite ledger, the supervised launch, the operator's preemption and retry code; no Airflow
process."""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_hetero_gpu.core.admission import PreemptionRules
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.launch.command import HOST_ENV, JOB_ENV
from airflow_hetero_gpu.launch.orphans import kill_orphans
from airflow_hetero_gpu.launch.supervisor import Supervision
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.operators import preempt
from airflow_hetero_gpu.operators.durable import HANDLE_KEY, HANDLE_VERSION, DurableJob
from airflow_hetero_gpu.operators.runtime import Runtime
from airflow_hetero_gpu.operators.specs import LifecycleSpec
from airflow_hetero_gpu.testing import procs
from airflow_hetero_gpu.watching.checkpoints import CheckpointSeen
from airflow_hetero_gpu.watching.lease import LeaseKeeper
from cluster_fixtures import emulated_cluster  # noqa: F401
from ledger_files import new_ledger
from test_launch_durable import supervised_job, two_hosts, wait_for  # noqa: F401
from test_launch_remote import Lines, factory_of, targets_of
from test_ledger_queue import LONG, fill
from test_operator_durable import Store, _context

UNATTENDED, GRACE = 4.0, 1.0
LEASE = UNATTENDED + GRACE + 15  # the shortest lease the operator accepts for them


class ClusterHook:
    """What the retry asks of the operator's hook: the hosts' SSH targets and clients."""

    def __init__(self, cluster):
        self._targets = {t.host_name: t for t in targets_of(cluster)}
        self._factory = factory_of(cluster)

    def ssh_targets(self, hosts):
        return {h: self._targets[h] for h in hosts}

    def client_factory(self, hosts):
        return self._factory


def _share_runs(job_id: str, host: str) -> bool:
    return bool(set(procs.with_env(JOB_ENV, job_id)) & set(procs.with_env(HOST_ENV, host)))


def test_a_victim_unreachable_on_a_host_keeps_its_gpus_until_its_lease_frees_them(two_hosts, tmp_path, caplog):
    tag = uuid.uuid4().hex[:8]
    victim, keeper, preemptor = f"victim-{tag}", f"keep-{tag}", f"hi-{tag}"
    log = logging.getLogger("test.preempt_unreachable")
    led = Ledger.from_url(new_ledger(tmp_path / "ledger.db"))
    led.preemption = PreemptionRules(min_runtime_s=0, delay_s=0)
    fill(led)  # node01 and node02, 8 GPUs each: the victim holds one host, the keeper the other
    assert led.enqueue(victim, PlanRequest(8), priority=1, lease_seconds=LEASE, preemptible=True).admitted
    led.take_admission(victim)
    assert led.enqueue(keeper, PlanRequest(8), priority=1, lease_seconds=LONG, preemptible=False).admitted
    led.take_admission(keeper)

    token = uuid.uuid4().hex[:12]
    job = supervised_job(two_hosts, victim, ["sh", "-c", "sleep 600"], Lines(),
                         Supervision(UNATTENDED, "TERM", GRACE, token))
    lifecycle = LifecycleSpec(durable=True, unattended_timeout=UNATTENDED, preemption_grace=GRACE,
                              lease_seconds=LEASE, host_timeout=10)
    runtime = Runtime(open_ledger=lambda: led, open_hook=lambda: ClusterHook(two_hosts),
                      open_ledger_hook=lambda: None, log=log, defer=None)
    store = Store({"version": HANDLE_VERSION, "job_id": victim, "launch": token, "hosts": ["node01", "node02"]})
    held_while_running: list[str] = []
    stop_sampling = threading.Event()

    def sample() -> None:  # while node02's share runs, the victim's GPUs are never free
        while not stop_sampling.is_set():
            running = _share_runs(victim, "node02")
            if running and led.get(victim) is None:
                held_while_running.append(time.strftime("%H:%M:%S"))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        job.start()
        wait_for(lambda: _share_runs(victim, "node01") and _share_runs(victim, "node02"), 30, "the job on both hosts")
        entry = led.enqueue(preemptor, PlanRequest(8), priority=5, lease_seconds=LONG, preemptible=True)
        assert not entry.admitted and f"preempting {victim}" in entry.reason, entry.reason
        mark = led.get(victim).preempting
        assert mark["by"] == preemptor
        sampler.start()
        two_hosts.inject_fault("node02", "sshd_killed")

        lease = LeaseKeeper(lambda: led, victim, LEASE, log=log, kill=job.kill, renew_every=2)
        with pytest.raises(AirflowException) as raised:
            preempt.stop(lifecycle, runtime, None, job, victim, mark, lease, CheckpointSeen())
        said = str(raised.value)
        assert f"job {victim}: preempted by job {preemptor}, but its share on node02 could not be stopped" in said
        assert "its GPUs stay reserved until its lease runs out" in said
        # not finished: still reserved and marked, the record open, the preemptor not admitted
        held = led.get(victim)
        assert held is not None and held.preempting["by"] == preemptor
        assert [r["state"] for r in led.preemptions() if r["victim"] == victim] == ["in progress"]
        assert not led.renew_queue_entry(preemptor).admitted
        assert led.queue_entry(victim) is None   # not queued again while it may run

        # a retry now cannot ask node02: nothing launched, nothing released, the handle kept
        retry = DurableJob(lifecycle, runtime, _context(store), victim)
        with pytest.raises(AirflowException, match=r"cannot tell whether the earlier try's job still runs .*"
                                                   r"node02: unknown.* at the latest until \d\d:\d\d:\d\d UTC"):
            retry.resume()
        assert store.values[HANDLE_KEY]["launch"] == token and led.get(victim) is not None

        # node02's supervisor stops its share (nobody heartbeats); only the lease's end frees the GPUs
        wait_for(lambda: not _share_runs(victim, "node02"), 60, "node02's dead-man switch to stop its share")
        admitted = wait_for(lambda: led.renew_queue_entry(preemptor).admitted, LEASE + 60,
                            "the victim's lease to run out and the preemptor to be admitted")
        assert admitted and led.get(victim) is None
        [record] = [r for r in led.preemptions() if r["victim"] == victim]
        assert record["state"] == "lease expired"
        assert held_while_running == []

        # a retry after the lease's end launches afresh though node02 still cannot be asked
        caplog.set_level(logging.WARNING, logger=log.name)
        resumed = retry.resume()
        assert resumed.handle is None and resumed.result is None
        assert HANDLE_KEY not in store.values
        assert any("its reservation is gone" in r.getMessage() for r in caplog.records)
    finally:
        stop_sampling.set()
        if sampler.is_alive():
            sampler.join(5)
        two_hosts.clear_fault("node02", "sshd_killed")
        kill_orphans(victim, targets_of(two_hosts), factory_of(two_hosts), grace=1)
        shutil.rmtree(Path.home() / ".hetero-gpu" / "run" / victim, ignore_errors=True)
        led.close()
