"""Every preemption record closes, on real SQLite and PostgreSQL: whatever removes a marked
victim's reservation (its task leaves the queue before taking it, its drained host's deadline,
a release by its holder, its lease passing) closes its record in the same transaction, and a
later preemption of the same job id opens a record of its own."""

from __future__ import annotations

import pytest
from sqlalchemy import func, insert, select

from airflow_hetero_gpu.collect.freshness import FreshInventory
from airflow_hetero_gpu.core.admission import PreemptionRules
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.ledger.schema import preemptions as pre_t
from ledger_clock import clock  # noqa: F401  (fixture)
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)
from test_ledger_queue import LONG, fill


@pytest.fixture
def led(ledger_db_url, clock):  # noqa: F811
    with Ledger.from_url(ledger_db_url, clock=clock) as ledger:
        ledger.preemption = PreemptionRules(min_runtime_s=600, delay_s=60)
        fill(ledger)  # node01, node02: 8 A100 each
        yield ledger


def _open(led: Ledger) -> list[str]:
    """The victims whose records are still in progress (what `hetero-gpu queue` and the page list)."""
    return [r["victim"] for r in led.preemptions() if r["state"] == "in progress"]


def _keep_one_host(led: Ledger) -> None:
    """A job nobody may preempt holds one host, so the other host's job is the only victim."""
    assert led.enqueue("keep", PlanRequest(8), priority=0, lease_seconds=LONG, preemptible=False).admitted
    led.take_admission("keep")


def _preempt_for(led: Ledger, clock, victim: str, preemptor: str = "hi") -> None:
    """Enqueue ``preemptor`` (priority 5) and renew it past the delay: ``victim`` is marked."""
    led.enqueue(preemptor, PlanRequest(8), priority=5, lease_seconds=LONG)
    clock.tick(61)
    assert f"preempting {victim} for it" in led.renew_queue_entry(preemptor).reason
    assert led.get(victim).preempting["by"] == preemptor
    assert _open(led) == [victim]


def test_a_victim_admitted_but_not_taken_that_leaves_the_queue_closes_its_record(led, clock):
    _keep_one_host(led)
    assert led.enqueue("lo", PlanRequest(8), priority=1, lease_seconds=LONG, preemptible=True).admitted
    clock.tick(700)  # admitted long ago, its task never took it (it was deferred, then killed)
    _preempt_for(led, clock, "lo")
    assert led.leave_queue("lo")  # the task is cleared: it leaves the queue with its admission
    assert led.get("lo") is None and _open(led) == []
    [record] = led.preemptions()
    assert record["victim"] == "lo" and record["state"] == "released" and record["ended_at"]
    assert led.queue_entry("hi").admitted  # the GPUs went to the preemptor in the same transaction


def test_a_task_less_victim_released_at_its_drained_hosts_deadline_closes_its_record(led, clock):
    _keep_one_host(led)
    cluster = FreshInventory(led.inventory(), float("inf")).cluster()
    bare = led.reserve("bare", cluster, PlanRequest(8), lease_seconds=LONG, preemptible=True)
    (host,) = {g.host for g in bare.decision.gpus}
    clock.tick(700)
    _preempt_for(led, clock, "bare")
    led.drain([host], "firmware", deadline_s=30)
    clock.tick(31)
    assert "bare" in led.expire()  # no task answers for it: released at the deadline
    assert led.get("bare") is None and _open(led) == []
    [record] = led.preemptions()
    assert record["state"] == "drain deadline" and record["ended_at"]


def test_a_victim_released_by_its_holder_or_whose_lease_passes_closes_its_record(led, clock):
    _keep_one_host(led)
    led.enqueue("lo", PlanRequest(8), priority=1, lease_seconds=LONG, preemptible=True)
    led.take_admission("lo")
    clock.tick(700)
    _preempt_for(led, clock, "lo")
    assert led.release("lo")
    assert _open(led) == [] and led.preemptions()[0]["state"] == "released"
    led.take_admission("hi")
    led.release("hi")
    led.enqueue("lo2", PlanRequest(8), priority=1, lease_seconds=120, preemptible=True)
    led.take_admission("lo2")
    for _ in range(6):  # runs past min_runtime, renewing every 110 s
        clock.tick(110)
        led.renew("lo2", 120)
    _preempt_for(led, clock, "lo2", "hi2")
    clock.tick(121)  # its holder died: the lease passes while it should stop
    assert "lo2" in led.expire()
    assert _open(led) == []
    assert {r["victim"]: r["state"] for r in led.preemptions()} == {"lo": "released", "lo2": "lease expired"}


def test_a_later_preemption_of_the_same_job_id_opens_its_own_record(led, clock):
    _keep_one_host(led)
    led.enqueue("lo", PlanRequest(8), priority=1, lease_seconds=LONG, preemptible=True)
    led.take_admission("lo")
    clock.tick(700)
    _preempt_for(led, clock, "lo")
    first = led.finish_preemption("lo", outcome="exited", exited_after_s=3.0)
    assert led.queue_entry("hi").admitted and led.queue_entry("lo").state == "waiting"
    led.take_admission("hi")
    led.release("hi")  # lo is admitted again, under the same job id, and runs
    led.take_admission("lo")
    clock.tick(700)
    _preempt_for(led, clock, "lo", "hi2")
    second = led.finish_preemption("lo", outcome="killed", exited_after_s=300.0)
    records = sorted(led.preemptions(), key=lambda r: r["decided_at"])
    assert [(r["preemptor"], r["state"], r["exited_after_s"]) for r in records] == \
        [("hi", "exited", 3.0), ("hi2", "killed", 300.0)]
    assert records[0]["lost_gpu_s"] == first["lost_gpu_s"] and records[1]["lost_gpu_s"] == second["lost_gpu_s"]
    assert _open(led) == []


def test_a_stale_open_record_is_never_closed_with_a_later_preemptions_values(led, clock, ledger_db_url):  # noqa: F811
    """A record an earlier release left open (its victim's reservation went without closing it)
    closes as abandoned when the same job id is preempted again; the new preemption's values go
    to the new record only."""
    from airflow_hetero_gpu.ledger.db import make_engine, write_transaction
    from airflow_hetero_gpu.ledger.url import parse_url

    engine = make_engine(parse_url(ledger_db_url))
    try:
        with write_transaction(engine) as conn:
            conn.execute(insert(pre_t).values(victim="lo", preemptor="old", reason="left open", gpus=[],
                                              decided_at=clock.now))
    finally:
        engine.dispose()
    _keep_one_host(led)
    led.enqueue("lo", PlanRequest(8), priority=1, lease_seconds=LONG, preemptible=True)
    led.take_admission("lo")
    clock.tick(700)
    led.enqueue("hi", PlanRequest(8), priority=5, lease_seconds=LONG)
    clock.tick(61)
    assert "preempting lo for it" in led.renew_queue_entry("hi").reason
    led.finish_preemption("lo", outcome="exited", exited_after_s=2.0, checkpoint="epoch 1")
    by = {r["preemptor"]: r for r in led.preemptions()}
    assert by["old"]["state"] == "abandoned" and by["old"]["lost_gpu_s"] is None and by["old"]["checkpoint"] is None
    assert by["hi"]["state"] == "exited" and by["hi"]["checkpoint"] == "epoch 1"
    assert _open(led) == []
    with led._read("count") as (conn, _now):
        assert conn.execute(select(func.count()).select_from(pre_t)).scalar_one() == 2
