"""The ledger's queue on real SQLite and PostgreSQL: enqueue, admission in every capacity write,
the head's claim and backfill outside it, priority and aging, leases, leaving."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.ledger import Ledger, LedgerError, NoQueueEntry, ReservationConflict
from airflow_hetero_gpu.ledger.inventory import HostRecord
from airflow_hetero_gpu.testing.captures import host_files
from airflow_hetero_gpu.testing.demo import small_hosts
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)
from ledger_clock import clock  # noqa: F401  (fixture)


def fill(led: Ledger, hosts: int = 2, gpus: int = 8) -> None:
    """Two 8-GPU A100 hosts (node01, node02) in the ledger's inventory."""
    led.store_collection([HostRecord(s.name, True, host_files(s)) for s in small_hosts(hosts, gpus=gpus)],
                         collector="test")


LONG = 100_000.0


def keys(res) -> set[GpuKey]:
    return set(res.keys)


@pytest.fixture
def led(ledger_db_url, clock):  # noqa: F811
    with Ledger.from_url(ledger_db_url, clock=clock) as ledger:
        fill(ledger)
        yield ledger


def test_a_job_that_fits_is_admitted_at_once_with_its_reservation(led, clock):
    entry = led.enqueue("a", PlanRequest(2), priority=0, lease_seconds=30,
                        identity={"dag_id": "d", "run_id": "r", "task_id": "t", "try_number": 1})
    assert entry.admitted and entry.admission["pool"] and len(entry.admission["gpus"]) == 2
    res = led.get("a")
    assert res is not None and res.expires_at == clock.now + timedelta(seconds=30)
    assert res.identity.task_id == "t" and res.request == PlanRequest(2).to_json()
    clock.tick(10)
    taken = led.take_admission("a")
    assert taken.expires_at == clock.now + timedelta(seconds=30) and keys(taken) == keys(res)
    assert led.queue_entry("a") is None and led.queue() == []
    with pytest.raises(NoQueueEntry, match="no queue entry"):
        led.take_admission("a")


def test_the_head_claims_a_host_and_backfill_stays_outside_the_claim(led, clock):
    for i in range(15):  # 15 of 16 GPUs held by 1-GPU jobs
        assert led.enqueue(f"s{i:02d}", PlanRequest(1)).admitted
        led.take_admission(f"s{i:02d}")
        clock.tick(1)
    big = led.enqueue("big", PlanRequest(8))
    assert big.state == "waiting" and big.standing == "head" and big.position == 1
    claimed = set(big.claimed_gpus)
    assert len(claimed) == 8 and len({k.host for k in claimed}) == 1
    assert big.reason.startswith("head of the queue: claims") and "7 of them held by" in big.reason
    free_claimed = claimed - set(led.reserved_map())
    assert len(free_claimed) == 1  # the one free GPU is kept for the head ...
    clock.tick(1)
    late = led.enqueue("late", PlanRequest(1))
    assert late.state == "waiting" and late.position == 2 and "behind big" in late.reason
    assert not free_claimed & set(led.reserved_map())
    # ... and a direct reserve does not take it either
    from airflow_hetero_gpu.collect.freshness import FreshInventory

    cluster = FreshInventory(led.inventory(), float("inf")).cluster()
    assert led.reserve("direct", cluster, PlanRequest(1)).decision is None
    # a release outside the claim backfills the later 1-GPU job there
    other_host = next(k for k, j in led.reserved_map().items() if k.host not in {c.host for c in claimed})
    led.release(led.reserved_map()[other_host])
    late = led.queue_entry("late")
    assert late.admitted and GpuKey(*late.admission["gpus"][0]) == other_host
    # the claim is stable; releasing its holders admits the head, before any 1-GPU job after it
    assert set(led.queue_entry("big").claimed_gpus) == claimed
    later = led.enqueue("later", PlanRequest(1))
    assert later.state == "waiting"
    holders = {led.reserved_map()[k] for k in claimed if k in led.reserved_map()}
    for job in sorted(holders):
        led.release(job)
    big = led.queue_entry("big")
    assert big.admitted and {GpuKey(*g) for g in big.admission["gpus"]} == claimed
    assert led.queue_entry("later").state == "waiting"
    assert set(led.take_admission("big").keys) == claimed


def test_priority_beats_waiting_longer_and_aging_bounds_it(led, clock):
    led.queue_aging_interval_s = 100.0
    hog = led.enqueue("hog", PlanRequest(16), lease_seconds=LONG)
    assert hog.admitted
    led.take_admission("hog")
    led.enqueue("low", PlanRequest(16), priority=0, lease_seconds=LONG)
    clock.tick(50)
    led.enqueue("high", PlanRequest(16), priority=1, lease_seconds=LONG)  # 50 s later, one level up: ahead of low
    clock.tick(200)
    led.enqueue("aged-past", PlanRequest(16), priority=1, lease_seconds=LONG)  # 250 s after low: low has aged past it
    order = [(e.job_id, e.position) for e in led.queue()]
    assert order == [("high", 1), ("low", 2), ("aged-past", 3)]
    assert led.queue_entry("low").reason.startswith("2nd in the queue")
    led.release("hog")
    assert led.queue_entry("high").admitted and led.queue_entry("low").state == "waiting"
    led.take_admission("high")
    led.release("high")
    assert led.queue_entry("low").admitted and led.queue_entry("aged-past").position == 1


def test_an_entry_whose_lease_passes_is_swept_and_its_claim_freed(led, clock):
    assert led.enqueue("hold", PlanRequest(15)).admitted
    led.take_admission("hold")
    head = led.enqueue("gang", PlanRequest(8), lease_seconds=20)
    assert head.standing == "head"
    claimed = set(head.claimed_gpus)
    assert led.enqueue("small", PlanRequest(1), lease_seconds=600).state == "waiting"  # the free GPU is claimed
    clock.tick(10)
    assert led.renew_queue_entry("gang").expires_at == clock.now + timedelta(seconds=20)
    clock.tick(21)  # the gang's holder is gone: no renewal
    assert led.queue_entry("gang") is None  # a reader already ignores it
    led.renew_queue_entry("small")  # the next write sweeps it and admits the small job on the freed GPU
    small = led.queue_entry("small")
    assert small.admitted and GpuKey(*small.admission["gpus"][0]) in claimed
    assert [e.job_id for e in led.queue()] == ["small"]
    with pytest.raises(NoQueueEntry):
        led.renew_queue_entry("gang")


def test_an_admission_not_taken_expires_with_its_entry(led, clock):
    assert led.enqueue("a", PlanRequest(4), lease_seconds=10).admitted
    clock.tick(11)
    assert led.get("a") is None and led.queue_entry("a") is None
    assert led.enqueue("b", PlanRequest(16)).admitted  # every GPU is free again


def test_leaving_frees_the_claim_and_an_untaken_admission(led, clock):
    assert led.enqueue("hold", PlanRequest(15)).admitted
    led.take_admission("hold")
    assert led.enqueue("gang", PlanRequest(8)).standing == "head"
    assert led.enqueue("small", PlanRequest(1)).state == "waiting"
    assert led.leave_queue("gang") is True
    assert led.queue_entry("small").admitted  # the claimed free GPU went to the next job at once
    assert led.leave_queue("small") is True and led.get("small") is None  # admitted, not taken: released
    assert led.leave_queue("small") is False
    assert set(led.reserved_map().values()) == {"hold"}


def test_enqueue_again_keeps_the_place_and_a_reservation_counts(led, clock):
    assert led.enqueue("hold", PlanRequest(16)).admitted
    led.take_admission("hold")
    led.enqueue("first", PlanRequest(4))
    clock.tick(5)
    led.enqueue("second", PlanRequest(4))
    clock.tick(5)
    again = led.enqueue("first", PlanRequest(4), priority=0)  # a retried task
    assert again.position == 1 and again.enqueued_at == clock.now - timedelta(seconds=10)
    # a job that holds a reservation for the same request is admitted to it, a different one refused
    with pytest.raises(ReservationConflict, match="different request"):
        led.enqueue("hold", PlanRequest(2))
    assert led.enqueue("hold", PlanRequest(16)).admitted


def test_bad_input_is_one_line_and_writes_nothing(led):
    for kwargs, match in (({"priority": "high"}, "priority: expected an integer"),
                          ({"priority": True}, "priority: expected an integer"),
                          ({"priority": 2 ** 31}, "priority: expected an integer from -1000000 to 1000000"),
                          ({"team": "a\n"}, "invalid team 'a\\\\n'"),
                          ({"lease_seconds": 0}, "lease_seconds")):
        with pytest.raises(LedgerError, match=match):
            led.enqueue("x", PlanRequest(1), **kwargs)
    with pytest.raises(LedgerError, match="request: expected a PlanRequest"):
        led.enqueue("x", {"gpus": 1})  # type: ignore[arg-type]
    assert led.queue() == [] and led.get("x") is None


def test_an_impossible_request_waits_with_its_reason_and_blocks_nobody(led):
    bad = led.enqueue("h100", PlanRequest(1, "H100"))
    assert bad.standing == "impossible" and "can never start on this cluster" in bad.reason
    assert led.enqueue("ok", PlanRequest(1)).admitted


def test_without_an_inventory_the_queue_says_so(ledger_db_url):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:
        entry = led.enqueue("a", PlanRequest(1))
        assert entry.state == "waiting" and "holds no inventory" in entry.reason
        fill(led)  # a collection is a capacity change: the pass runs
        assert led.queue_entry("a").admitted


def test_an_eviction_moves_the_claim_and_a_readmission_admits(led, clock):
    assert led.enqueue("hold", PlanRequest(8)).admitted  # one host full
    led.take_admission("hold")
    held_host = next(iter(led.reserved_map())).host
    free_host = ({"node01", "node02"} - {held_host}).pop()
    led.evict((free_host, 3), reasons="ecc")
    gang = led.enqueue("gang", PlanRequest(8))
    assert gang.standing == "head" and {k.host for k in gang.claimed_gpus} == {held_host}
    led.record_check((free_host, 3), True, readmit_after=1)  # readmitted: the other host has 8 free
    gang = led.queue_entry("gang")
    assert gang.admitted and {GpuKey(*g).host for g in gang.admission["gpus"]} == {free_host}


def _cli(capsys, *argv):
    from airflow_hetero_gpu.cli.app import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_hetero_gpu_queue_shows_positions_the_claim_and_reasons(ledger_db_url, capsys, tmp_path):  # noqa: F811
    import json

    with Ledger.from_url(ledger_db_url) as led:
        fill(led)
        for i in range(15):
            led.enqueue(f"s{i:02d}", PlanRequest(1), lease_seconds=LONG)
            led.take_admission(f"s{i:02d}")
        led.enqueue("big", PlanRequest(8, "A100*"), priority=2, lease_seconds=LONG)
        led.enqueue("late", PlanRequest(1), lease_seconds=LONG)
        claimed = set(led.queue_entry("big").claimed_gpus)
    code, out, err = _cli(capsys, "queue", "--ledger", ledger_db_url, "--wide")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split()[:7] == ["POS", "JOB", "STATE", "PRIO", "ASKS", "WAITED", "CLAIM"]
    big = next(line for line in lines if " big " in f" {line} ")
    host = next(iter(claimed)).host
    assert big.split()[:5] == ["1", "big", "head", "2", "8"] and f"{host} GPU 0-7 (7 held)" in big
    assert "head of the queue: claims" in big
    late = next(line for line in lines if " late " in f" {line} ")
    assert late.split()[:3] == ["2", "late", "waiting"] and "behind big" in late
    code, out, _ = _cli(capsys, "queue", "--ledger", ledger_db_url, "--json")
    data = json.loads(out)
    assert [e["job_id"] for e in data["entries"]] == ["big", "late"]
    head = data["entries"][0]
    assert head["standing"] == "head" and head["priority"] == 2 and head["waited_s"] >= 0
    assert {GpuKey(*k) for k in head["claim"]["gpus"]} == claimed and len(head["claim"]["held_by"]) == 7


def test_hetero_gpu_queue_on_a_missing_ledger_is_one_line_and_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "typo.db"
    code, out, err = _cli(capsys, "queue", "--ledger", str(missing))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "no ledger at" in err
    assert not missing.exists()
    Ledger.from_url(str(tmp_path / "empty.db")).close()
    code, out, _ = _cli(capsys, "queue", "--ledger", str(tmp_path / "empty.db"))
    assert code == 0 and "(nobody waits)" in out
