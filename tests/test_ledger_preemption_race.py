"""32 processes running jobs of two priorities at once against SQLite and PostgreSQL, with
preemption on (no minimum run time, no delay: as many preemptions as the jobs allow): a victim
sees its mark at a renewal, stops and finishes its preemption, waits again and resumes. No GPU
held twice, every preemption closed, no victim half-stopped (holding GPUs and queued at once, or
neither), nothing left behind."""

from __future__ import annotations

import random
import time

from sqlalchemy import create_engine, func, select

from airflow_hetero_gpu.core.admission import PreemptionRules
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.ledger.schema import preemptions, queue_entries, reservation_gpus
from airflow_hetero_gpu.ledger.url import parse_url
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)
from test_ledger_queue import fill
from worker_race import assert_no_gpu_held_twice, race

PROCS = 32
ROUNDS = 2
WAIT_S = 300
RULES = PreemptionRules(min_runtime_s=0, delay_s=0)



def _admitted(led: Ledger, job: str):
    entry = led.queue_entry(job) or led.renew_queue_entry(job)
    while not entry.admitted:
        time.sleep(0.2)  # polled as the operator does every few seconds
        entry = led.renew_queue_entry(job)
    return led.take_admission(job)


def _worker(url: str, idx: int, barrier, out) -> None:
    rng = random.Random(idx)
    high = idx % 4 == 0
    try:
        with Ledger.from_url(url) as led:
            led.preemption = RULES
            barrier.wait(WAIT_S)
            for rnd in range(ROUNDS):
                job = f"{'hi' if high else 'lo'}{idx}-r{rnd}"
                led.enqueue(job, PlanRequest(rng.choice([2, 4, 8])), priority=5 if high else 0, lease_seconds=60,
                            preemptible=not high)
                res = _admitted(led, job)
                left = rng.uniform(0.1, 0.4)  # seconds of work
                while True:
                    took = time.monotonic()
                    keys = [tuple(k) for k in res.keys]
                    mark = None
                    while time.monotonic() - took < left:
                        time.sleep(0.05)
                        mark = led.renew(job, 60).preempting  # the run loop's renewal
                        if mark is not None:
                            break
                    freed_at = time.monotonic()
                    if mark is None:
                        assert led.release(job)
                        out.send(("ran", idx, job, (keys, took, freed_at, None)))
                        break
                    assert not high, f"{job} (priority 5, not preemptible) was marked"
                    left -= freed_at - took
                    led.finish_preemption(job, outcome="exited", exited_after_s=0.01)
                    out.send(("ran", idx, job, (keys, took, freed_at, mark["by"])))
                    res = _admitted(led, job)  # back in the queue: resumes when admitted
        out.send(("done", idx, None, None))
    except BaseException as err:  # noqa: BLE001 - reported to the parent
        out.send(("error", idx, None, repr(err)))


def _raw(url: str) -> tuple[int, int, int]:
    engine = create_engine(parse_url(url))
    try:
        with engine.connect() as conn:
            return (conn.execute(select(func.count()).select_from(queue_entries)).scalar_one(),
                    conn.execute(select(func.count()).select_from(reservation_gpus)).scalar_one(),
                    conn.execute(select(func.count()).select_from(preemptions)
                                 .where(preemptions.c.ended_at.is_(None))).scalar_one())
    finally:
        engine.dispose()


def test_concurrent_preemptions_hold_no_gpu_twice_and_leave_no_victim_half_stopped(ledger_db_url):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:
        fill(led, hosts=4, gpus=8)  # 32 GPUs
    segments: list[tuple[str, tuple]] = []
    errors: list[str] = []
    done = 0
    for what, idx, job, data in race(_worker, ledger_db_url, PROCS, WAIT_S):
        if what == "ran":
            segments.append((job, data))
        elif what == "error":
            errors.append(f"worker {idx}: {data}")
        else:
            done += 1
    assert errors == [] and done == PROCS
    finished = {job for job, (_k, _t, _f, by) in segments if by is None}
    assert len(finished) == PROCS * ROUNDS  # every job ran to its end, preempted or not
    preempted = [(job, by) for job, (_k, _t, _f, by) in segments if by is not None]
    assert preempted, "no preemption happened: the test would prove nothing"
    assert all(job.startswith("lo") and by.startswith("hi") for job, by in preempted)
    # no GPU held by two jobs at once: the holding intervals of one GPU never overlap
    assert_no_gpu_held_twice((job, keys, took, freed_at) for job, (keys, took, freed_at, _) in segments)
    # every preemption closed, with its lost work; nothing queued or held
    assert _raw(ledger_db_url) == (0, 0, 0)
    with Ledger.open_existing(ledger_db_url) as led:
        records = led.preemptions()
        # a victim stopped and finished its preemption, or ended its work first (released)
        assert sorted((r["victim"], r["preemptor"]) for r in records if r["state"] == "exited") == sorted(preempted)
        assert all(r["state"] in ("exited", "released") and r["ended_at"] for r in records)
        assert all(r["lost_gpu_s"] is not None for r in records if r["state"] == "exited")
        assert led.queue() == [] and led.live_reservations() == []
