"""32 processes enqueueing, taking and releasing at once against SQLite and PostgreSQL, some of
them killed while they wait: no GPU held twice, no job admitted twice, nothing left behind."""

from __future__ import annotations

import os
import random
import time

from sqlalchemy import create_engine, func, select

from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.ledger.schema import queue_entries, reservation_gpus
from airflow_hetero_gpu.ledger.url import parse_url
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)
from test_ledger_queue import fill
from worker_race import assert_no_gpu_held_twice, race

PROCS = 32
ROUNDS = 3
DEAD_LEASE_S = 3.0
WAIT_S = 300



def _worker(url: str, idx: int, barrier, out) -> None:
    rng = random.Random(idx)
    try:
        with Ledger.from_url(url) as led:
            barrier.wait(WAIT_S)
            if idx % 8 == 7:  # killed while waiting: enqueues with a short lease, never renews nor leaves
                led.enqueue(f"dead-{idx}", PlanRequest(rng.choice([1, 8])), lease_seconds=DEAD_LEASE_S)
                out.send(("dead", idx, f"dead-{idx}", None))
                out.close()
                os._exit(0)
            for rnd in range(ROUNDS):
                job = f"p{idx}-r{rnd}"
                entry = led.enqueue(job, PlanRequest(rng.choice([1, 1, 1, 2, 2, 4, 8])), priority=rng.choice([0, 1]),
                                    lease_seconds=60)
                while not entry.admitted:
                    time.sleep(0.2)  # a holder polls its own entry (one row), as the operator does every few seconds
                    entry = led.renew_queue_entry(job)
                res = led.take_admission(job)
                took = time.monotonic()
                keys = [tuple(k) for k in res.keys]
                time.sleep(rng.uniform(0.0, 0.05))
                freed_at = time.monotonic()
                freed = led.release(job)
                out.send(("ran", idx, job, (keys, took, freed_at, freed)))
        out.send(("done", idx, None, None))
    except BaseException as err:  # noqa: BLE001 - reported to the parent
        out.send(("error", idx, None, repr(err)))


def _raw_counts(url: str) -> tuple[int, int]:
    engine = create_engine(parse_url(url))
    try:
        with engine.connect() as conn:
            return (conn.execute(select(func.count()).select_from(queue_entries)).scalar_one(),
                    conn.execute(select(func.count()).select_from(reservation_gpus)).scalar_one())
    finally:
        engine.dispose()


def test_concurrent_enqueue_and_release_hold_no_gpu_twice_and_leave_nothing(ledger_db_url):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:
        fill(led, hosts=4, gpus=8)  # 32 GPUs
    runs: dict[str, tuple] = {}
    dead: set[str] = set()
    errors: list[str] = []
    for what, idx, job, data in race(_worker, ledger_db_url, PROCS, WAIT_S):
        if what == "ran":
            assert job not in runs, f"{job} ran twice"
            runs[job] = data
        elif what == "dead":
            dead.add(job)
        elif what == "error":
            errors.append(f"worker {idx}: {data}")
    assert errors == []
    live_workers = [i for i in range(PROCS) if i % 8 != 7]
    assert len(runs) == len(live_workers) * ROUNDS and len(dead) == PROCS // 8
    # every job was admitted once and released its own reservation once
    assert all(freed for _keys, _took, _freed_at, freed in runs.values())
    # no GPU held by two jobs at once: the holding intervals of one GPU never overlap
    assert_no_gpu_held_twice((job, keys, took, freed_at) for job, (keys, took, freed_at, _) in runs.items())
    # the killed waiters' entries (and any admission they never took) go once their lease passes:
    # every write sweeps; wait on the ledger's rows (the timeout is only a safety net)
    with Ledger.from_url(ledger_db_url) as led:
        until = time.monotonic() + 120
        while _raw_counts(ledger_db_url) != (0, 0):
            assert time.monotonic() < until, f"left behind: {_raw_counts(ledger_db_url)}, queue {led.queue()}"
            led.expire()
            time.sleep(0.2)
        assert led.queue() == [] and led.live_reservations() == []
