"""Preemption in the ledger on real SQLite and PostgreSQL: the admission pass marks the victim,
the victim's holder finishes it (GPUs freed, back in the queue with its place, record closed)
and the preemptor is admitted in the same transaction."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_hetero_gpu.core.admission import PreemptionRules
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger, LedgerError, NoLiveReservation
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)
from ledger_clock import clock  # noqa: F401  (fixture)
from test_ledger_queue import LONG, fill


@pytest.fixture
def led(ledger_db_url, clock):  # noqa: F811
    with Ledger.from_url(ledger_db_url, clock=clock) as ledger:
        ledger.preemption = PreemptionRules(min_runtime_s=600, delay_s=60)
        fill(ledger)
        yield ledger


def _run(led, job, priority, preemptible=True):
    entry = led.enqueue(job, PlanRequest(8), priority=priority, lease_seconds=LONG, preemptible=preemptible)
    assert entry.admitted
    return led.take_admission(job)


def test_the_victim_is_marked_then_finished_and_the_preemptor_admitted(led, clock):
    _run(led, "lo1", 1)
    _run(led, "lo2", 1)
    enqueued = clock.now
    clock.tick(10)
    hi = led.enqueue("hi", PlanRequest(8), priority=5, lease_seconds=LONG, preemptible=True)
    assert hi.state == "waiting" and "preempting" not in hi.reason
    clock.tick(61)  # the delay passed, but the running jobs ran only 71 s (< min_runtime)
    assert "preempting" not in led.renew_queue_entry("hi").reason
    assert led.get("lo1").preempting is None and led.preemptions() == []
    clock.tick(600)
    led.note_checkpoint("lo2")  # lo2 would lose least
    clock.tick(5)
    hi = led.renew_queue_entry("hi")
    assert hi.state == "waiting" and "preempting lo2 for it" in hi.reason
    mark = led.get("lo2").preempting
    assert mark["by"] == "hi" and mark["reason"] == "priority 5 > 1"
    assert led.get("lo1").preempting is None
    [record] = led.preemptions()
    assert record["victim"] == "lo2" and record["state"] == "in progress" and len(record["gpus"]) == 8
    clock.tick(5)  # renewals go on; no second victim while lo2 stops
    led.renew_queue_entry("hi")
    led.renew("lo2", LONG)
    assert led.get("lo1").preempting is None and len(led.preemptions()) == 1
    clock.tick(30)
    done = led.finish_preemption("lo2", outcome="exited", exited_after_s=35.0, checkpoint="epoch 3")
    assert done["lost_gpu_s"] == pytest.approx(40 * 8) and done["by"] == "hi"
    assert led.get("lo2") is None
    assert led.queue_entry("hi").admitted  # admitted in the same transaction, on lo2's GPUs
    back = led.queue_entry("lo2")
    assert back.state == "waiting" and back.priority == 1 and back.enqueued_at == enqueued
    [record] = led.preemptions()
    assert record["state"] == "exited" and record["lost_gpu_s"] == pytest.approx(320) and record["checkpoint"] == "epoch 3"
    assert record["exited_after_s"] == 35.0
    # once hi ends, lo2 (waiting with its old place) is admitted again
    led.take_admission("hi")
    led.release("hi")
    assert led.queue_entry("lo2").admitted
    res = led.take_admission("lo2")
    assert res.preempting is None and res.preemption["priority"] == 1 and res.preemption["preemptible"]


def test_a_job_that_is_not_preemptible_is_never_marked(led, clock):
    _run(led, "keep1", 1, preemptible=False)
    _run(led, "keep2", 1, preemptible=False)
    led.enqueue("hi", PlanRequest(8), priority=5, lease_seconds=LONG, preemptible=True)
    clock.tick(3600)
    assert "preempting" not in led.renew_queue_entry("hi").reason
    assert led.get("keep1").preempting is None and led.get("keep2").preempting is None
    assert led.preemptions() == []


def test_finish_without_a_mark_is_an_error_and_changes_nothing(led, clock):
    _run(led, "lo1", 1)
    with pytest.raises(NoLiveReservation):
        led.finish_preemption("lo1", outcome="exited", exited_after_s=1)
    with pytest.raises(LedgerError, match="outcome: expected one of exited, killed, got 'x'"):
        led.finish_preemption("lo1", outcome="x", exited_after_s=1)
    assert led.get("lo1") is not None and led.queue_entry("lo1") is None
    assert timedelta(days=1) and led.preemptions() == []


def test_a_victim_whose_lease_passes_or_that_is_released_closes_its_record(led, clock):
    led.enqueue("lo1", PlanRequest(8), priority=1, lease_seconds=30, preemptible=True)
    led.take_admission("lo1")
    _run(led, "lo2", 1)
    led.enqueue("hi", PlanRequest(8), priority=5, lease_seconds=LONG)
    for _ in range(25):  # lo1 renews its lease (30 s) every 25 s for 625 s: it may then be preempted
        clock.tick(25)
        led.renew("lo1", 30)
    led.note_checkpoint("lo1")
    assert "preempting lo1 for it" in led.renew_queue_entry("hi").reason
    clock.tick(31)  # lo1's holder is gone: its lease passes while it should stop
    led.expire()
    [record] = led.preemptions()
    assert record["victim"] == "lo1" and record["state"] == "lease expired"
    assert led.queue_entry("hi").admitted  # the expiry freed the GPUs: the preemptor starts
    clock.tick(700)
    led.take_admission("hi")
    led.enqueue("hi2", PlanRequest(8), priority=5, lease_seconds=LONG)
    clock.tick(61)
    assert "preempting lo2 for it" in led.renew_queue_entry("hi2").reason
    assert led.release("lo2")  # its task was killed meanwhile
    states = {r["victim"]: r["state"] for r in led.preemptions()}
    assert states == {"lo1": "lease expired", "lo2": "released"}
