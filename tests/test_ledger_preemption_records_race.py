"""24 processes against SQLite and PostgreSQL with preemption on (no minimum run time, no delay),
every job under a job id of its own (a fresh token per run: no later job of the same id can
close a record left open): victims finish their preemption, or are released by their holder
instead, or leave the queue admitted but not taken. Every record ends closed."""

from __future__ import annotations

import random
import time
import uuid

import pytest
from sqlalchemy import create_engine, func, select

from airflow_hetero_gpu.core.admission import PreemptionRules
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger, NoLiveReservation, NoQueueEntry
from airflow_hetero_gpu.ledger.schema import preemptions, queue_entries, reservation_gpus
from airflow_hetero_gpu.ledger.url import parse_url
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)
from test_ledger_queue import fill
from worker_race import race

pytestmark = pytest.mark.slow  # many worker processes: left out of make test-fast

PROCS = 24
JOBS = 3
WAIT_S = 300
RULES = PreemptionRules(min_runtime_s=0, delay_s=0)
LEASE = 600  # long: a loaded machine must not expire a lease here (expiry has its own tests)


def _wait_admitted(led: Ledger, job: str):
    entry = led.renew_queue_entry(job)
    while not entry.admitted:
        time.sleep(0.1)
        entry = led.renew_queue_entry(job)
    return entry


def _run(led: Ledger, job: str, seconds: float, on_mark: str) -> str:
    """Hold the job's GPUs for ``seconds``, renewing; at a mark, do ``on_mark``. How it ended."""
    led.take_admission(job)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)
        try:
            mark = led.renew(job, LEASE).preempting
        except NoLiveReservation:
            return "lost"
        if mark is None:
            continue
        if on_mark == "release":  # its task was killed meanwhile
            led.release(job)
            return "released"
        led.finish_preemption(job, outcome="exited", exited_after_s=0.01)
        _wait_admitted(led, job)  # back in the queue with its place: resumes when admitted
        return _run(led, job, max(0.05, end - time.monotonic()), on_mark)
    led.release(job)
    return "ran"


def _worker(url: str, idx: int, barrier, out) -> None:
    rng = random.Random(idx)
    high = idx % 4 == 0
    out_token = None
    try:
        with Ledger.from_url(url) as led:
            led.preemption = RULES
            barrier.wait(WAIT_S)
            for n in range(JOBS):
                token = uuid.uuid4().hex[:8]
                job = f"{'hi' if high else 'lo'}{idx}-{n}-{token}"
                out_token = job
                led.enqueue(job, PlanRequest(rng.choice([2, 4, 8])), priority=5 if high else 0, lease_seconds=LEASE,
                            preemptible=not high)
                how = "finish" if high else rng.choice(["finish", "release", "leave"])
                _wait_admitted(led, job)
                if how == "leave":  # admitted, not taken: the task waits a little, then is cleared
                    end = time.monotonic() + rng.uniform(0.1, 0.4)
                    marked = False
                    while time.monotonic() < end and not marked:
                        time.sleep(0.05)
                        try:
                            led.renew_queue_entry(job)
                        except NoQueueEntry:
                            break
                        res = led.get(job)
                        marked = res is not None and res.preempting is not None
                    led.leave_queue(job)
                    out.send(("ran", idx, job, "left marked" if marked else "left"))
                    continue
                out.send(("ran", idx, job, _run(led, job, rng.uniform(0.1, 0.4), how)))
        out.send(("done", idx, None, None))
    except BaseException as err:  # noqa: BLE001 - reported to the parent
        out.send(("error", idx, out_token, repr(err)))


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


def test_every_record_closes_whatever_ends_its_victim_with_fresh_job_ids(ledger_db_url):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:
        fill(led, hosts=3, gpus=8)  # 24 GPUs
    ended: dict[str, str] = {}
    errors: list[str] = []
    done = 0
    for what, idx, job, data in race(_worker, ledger_db_url, PROCS, WAIT_S):
        if what == "ran":
            assert job not in ended, f"job id {job} used twice"
            ended[job] = data
        elif what == "error":
            errors.append(f"worker {idx} ({job}): {data}")
        else:
            done += 1
    assert errors == [] and done == PROCS
    assert len(ended) == PROCS * JOBS
    with Ledger.open_existing(ledger_db_url) as led:
        records = led.preemptions()
        assert led.queue() == [] and led.live_reservations() == []
    assert records, "no preemption happened: the test would prove nothing"
    still_open = [r["victim"] for r in records if r["ended_at"] is None]
    assert still_open == [], f"records left in progress: {still_open} ({[ended.get(v) for v in still_open]})"
    assert {r["state"] for r in records} <= {"exited", "released"}
    assert all(r["victim"] in ended and r["preemptor"] in ended for r in records)
    assert _raw(ledger_db_url) == (0, 0, 0)
