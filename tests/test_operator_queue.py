"""The operator's side of the queue against a real SQLite ledger: a timed-out wait and a killed
task leave the queue at once (the next job is admitted in the same transaction), and a bad
priority is refused before anything is enqueued."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator
from airflow_hetero_gpu.operators.placement import Placement
from airflow_hetero_gpu.operators.queue_wait import QueueWait
from ledger_files import new_ledger
from test_ledger_queue import fill


@pytest.fixture
def url(tmp_path):
    url = new_ledger(tmp_path / 'ledger.db')
    with Ledger.from_url(url) as led:
        fill(led)
        assert led.enqueue("hold", PlanRequest(15), lease_seconds=3600).admitted
        led.take_admission("hold")
    return url


def _waiting(url: str, **kwargs) -> tuple[HeteroTrainOperator, QueueWait]:
    op = HeteroTrainOperator(task_id="t", gpu_count=8, script="train.py", ssh_conn_ids=["node01", "node02"],
                             ledger_url=url, wait_for_capacity=True, **kwargs)
    specs = op._validate()  # as execute() does first: the lease is resolved there
    wait = QueueWait(Placement(specs, op.runtime, {}, "gang"))
    entry = op.ledger.enqueue("gang", PlanRequest(8), priority=op.priority, lease_seconds=specs.lifecycle.lease_seconds)
    op.runtime.waiting_job, op._placement = "gang", wait.placement
    assert entry.standing == "head"
    with Ledger.from_url(url) as led:
        assert led.enqueue("small", PlanRequest(1), lease_seconds=3600).state == "waiting"  # behind the claim
    return op, wait


def test_a_wait_that_times_out_leaves_the_queue(url, caplog):
    op, wait = _waiting(url, capacity_timeout=1.0, capacity_poll_interval=0.2, priority=2)
    with pytest.raises(AirflowException, match=r"job gang: not admitted within 1 s: head of the queue: claims"):
        wait.wait(op.ledger.queue_entry("gang"))
    assert op.runtime.waiting_job is None
    with Ledger.open_existing(url) as led:
        assert led.queue_entry("gang") is None
        assert led.queue_entry("small").admitted  # the claimed free GPU went on at once


def test_a_task_killed_while_waiting_leaves_the_queue(url):
    op, _wait = _waiting(url)
    op.on_kill()
    with Ledger.open_existing(url) as led:
        assert [e.job_id for e in led.queue()] == ["small"] and led.queue_entry("small").admitted


def test_a_bad_priority_fails_before_anything_is_enqueued(url):
    op = HeteroTrainOperator(task_id="t", gpu_count=8, script="train.py", ssh_conn_ids=["node01"], ledger_url=url,
                             wait_for_capacity=True, priority="urgent")
    with pytest.raises(AirflowFailException, match="priority: expected an integer"):
        op.execute({})
    with Ledger.open_existing(url) as led:
        assert led.queue() == []


def test_an_entry_swept_while_waiting_is_enqueued_again_not_a_failure(url):
    from types import SimpleNamespace

    op, wait = _waiting(url)
    # the task instance's identity, as Airflow's context carries it (the entry records it)
    wait.placement.context = {"ti": SimpleNamespace(dag_id="d", run_id="r", task_id="t", try_number=1, map_index=-1)}
    op.ledger.leave_queue("gang")   # what the sweep does to an entry whose lease ran out
    entry = wait.renew()            # the next look: in again, at the back, instead of "it has no queue entry"
    assert entry.job_id == "gang" and entry.state == "waiting"
    with Ledger.open_existing(url) as led:
        assert [e.job_id for e in led.queue()][-1] == "gang"
