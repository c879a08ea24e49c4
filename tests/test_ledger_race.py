"""Many processes reserving at the same instant, and processes killed mid-reservation.

Real processes (fork), not threads, on a SQLite file and on a private PostgreSQL server.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import random
import signal
import time
from multiprocessing.connection import wait

from sqlalchemy import create_engine, func, select

from airflow_hetero_gpu.core.cluster import build_cluster
from airflow_hetero_gpu.core.model import Gpu, GpuKey, PlanRequest
from airflow_hetero_gpu.core.topology import HostWiring
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.ledger.schema import reservation_gpus, reservations
from airflow_hetero_gpu.ledger.url import parse_url
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)

HOSTS, PER_HOST = 4, 8
TOTAL = HOSTS * PER_HOST
PROCS = 32
ROUNDS = 20
WAIT_S = 120

ctx = multiprocessing.get_context("fork")


def cluster32():
    """4 hosts x 8 A100s, NVLink inside each host."""
    gpus = [Gpu(f"n{h}", i, f"GPU-n{h}-{i}", "NVIDIA A100-SXM4-80GB", 81920, 0, 0.0)
            for h in range(HOSTS) for i in range(PER_HOST)]
    nv = {pair: "NV12" for pair in itertools.combinations(range(PER_HOST), 2)}
    return build_cluster(gpus, {f"n{h}": HostWiring.from_links(range(PER_HOST), nv) for h in range(HOSTS)})


def integrity(url: str) -> tuple[list[tuple[str, int, int]], int]:
    """(job id, GPU count it claims, GPU rows it has) per reservation, and GPU rows without a reservation."""
    engine = create_engine(parse_url(url))
    try:
        with engine.connect() as conn:
            per_job = conn.execute(
                select(reservations.c.job_id, reservations.c.gpu_count, func.count(reservation_gpus.c.host))
                .select_from(reservations.outerjoin(reservation_gpus,
                                                    reservation_gpus.c.job_id == reservations.c.job_id))
                .group_by(reservations.c.job_id, reservations.c.gpu_count)
                .order_by(reservations.c.job_id)
            ).all()
            orphans = conn.execute(
                select(func.count()).select_from(reservation_gpus)
                .where(reservation_gpus.c.job_id.not_in(select(reservations.c.job_id)))
            ).scalar_one()
        return [tuple(r) for r in per_job], orphans
    finally:
        engine.dispose()


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(10)


# --- 32 processes, one instant, 20 rounds ----------------------------------------------------------
def _racer(url: str, idx: int, sizes: list[int], barrier, out) -> None:
    cluster = cluster32()
    with Ledger.from_url(url) as led:
        for rnd, k in enumerate(sizes):
            barrier.wait(WAIT_S)  # everyone starts at once
            try:
                result = led.reserve(f"r{rnd}-p{idx}", cluster, PlanRequest(k), lease_seconds=300)
                out.send((rnd, idx, k, [tuple(g) for g in result.decision.keys] if result.decision else None))
            except Exception as err:  # noqa: BLE001 - reported to the parent
                out.send((rnd, idx, k, f"error: {err!r}"))
            barrier.wait(WAIT_S)  # the parent has checked and cleared the round


def test_32_processes_reserving_at_once_never_share_a_gpu(ledger_db_url):  # noqa: F811
    rng = random.Random(20250101)
    sizes = [[rng.randint(2, 4) for _ in range(ROUNDS)] for _ in range(PROCS)]
    Ledger.from_url(ledger_db_url).close()  # schema in place; no connection open across fork
    barrier = ctx.Barrier(PROCS + 1)
    pipes = [ctx.Pipe(duplex=False) for _ in range(PROCS)]
    procs = [ctx.Process(target=_racer, args=(ledger_db_url, i, sizes[i], barrier, pipes[i][1]), daemon=True)
             for i in range(PROCS)]
    for p in procs:
        p.start()
    granted_total = []
    try:
        with Ledger.from_url(ledger_db_url) as led:
            for rnd in range(ROUNDS):
                barrier.wait(WAIT_S)
                outcomes = []
                for i in range(PROCS):
                    assert pipes[i][0].poll(WAIT_S), f"round {rnd}: process {i} sent nothing"
                    outcomes.append(pipes[i][0].recv())
                errors = [o for o in outcomes if isinstance(o[3], str)]
                assert errors == []
                granted = {f"r{rnd}-p{i}": [GpuKey(*g) for g in keys] for _, i, k, keys in outcomes if keys}
                failed = [k for _, _, k, keys in outcomes if keys is None]
                for _, i, k, keys in outcomes:
                    assert keys is None or len(set(keys)) == len(keys) == k
                held = [g for keys in granted.values() for g in keys]
                assert len(held) == len(set(held)) <= TOTAL, "a GPU was granted twice"
                left = TOTAL - len(held)
                assert all(k > left for k in failed), f"round {rnd}: a job that fit in {left} GPUs got none"
                # the database agrees with what the processes were told
                assert led.reserved_map() == {g: job for job, keys in granted.items() for g in keys}
                assert integrity(ledger_db_url) == (sorted((job, len(keys), len(keys)) for job, keys in granted.items()), 0)
                granted_total.append(len(granted))
                for job in granted:
                    assert led.release(job)
                assert led.reserved_map() == {}
                barrier.wait(WAIT_S)
        for p in procs:
            p.join(WAIT_S)
        assert [p.exitcode for p in procs] == [0] * PROCS
    finally:
        _stop(procs)
    assert all(8 <= n <= 16 for n in granted_total), granted_total  # 32 GPUs / 2-4 each


# --- half of them killed mid-transaction -------------------------------------------------------------
# a dead holder's lease must outlast all 32 reservations (2-3 s on a loaded 2-core machine; a
# lease that ran out before the last one legitimately hands its GPUs on, which the test would
# count as held twice); the test then waits it out
HOLDER_LEASE_S = 15.0
RENEWER_LEASE_S = 30.0


def _victim(url: str, idx: int, role: str, barrier, out, stop) -> None:
    def die_inside(action: str, job_id: str) -> None:
        out.send(("inside", idx, os.getpid(), None))
        time.sleep(WAIT_S)  # the parent SIGKILLs us here, before the commit

    hook = die_inside if role == "dies-inside" else None
    with Ledger.from_url(url, before_commit=hook) as led:
        lease = RENEWER_LEASE_S if role == "renews" else HOLDER_LEASE_S
        barrier.wait(WAIT_S)
        k = 2 if role == "dies-inside" else 1  # the 16 that commit leave 16 GPUs: the others always get a plan
        result = led.reserve(f"p{idx}", cluster32(), PlanRequest(k), lease_seconds=lease)
        out.send(("held", idx, os.getpid(), [tuple(g) for g in result.decision.keys] if result.decision else None))
        if role == "holder-dies":
            time.sleep(WAIT_S)  # a holder that dies while its job runs: killed here
        while not stop.wait(0.5):  # a healthy holder renews its lease
            led.renew(f"p{idx}", lease)
        out.send(("released", idx, os.getpid(), led.release(f"p{idx}")))


def test_processes_killed_mid_reservation_leave_nothing_half_made(ledger_db_url):  # noqa: F811
    roles = ["dies-inside", "holder-dies", "dies-inside", "renews"] * (PROCS // 4)  # 16 die mid-transaction
    Ledger.from_url(ledger_db_url).close()
    barrier = ctx.Barrier(PROCS)
    stop = ctx.Event()
    pipes = [ctx.Pipe(duplex=False) for _ in range(PROCS)]
    procs = [ctx.Process(target=_victim, args=(ledger_db_url, i, roles[i], barrier, pipes[i][1], stop), daemon=True)
             for i in range(PROCS)]
    for p in procs:
        p.start()
    held: dict[int, list[GpuKey]] = {}
    killed_inside: set[int] = set()
    try:
        readers = {pipes[i][0]: i for i in range(PROCS)}
        deadline = time.monotonic() + WAIT_S
        while len(held) + len(killed_inside) < PROCS:
            assert time.monotonic() < deadline, "processes stopped reporting"
            for r in wait(list(readers), timeout=5):
                what, i, pid, keys = r.recv()
                del readers[r]
                if what == "inside":
                    os.kill(pid, signal.SIGKILL)
                    killed_inside.add(i)
                    continue
                assert keys is not None, f"process {i} ({roles[i]}) got no GPUs"
                held[i] = [GpuKey(*g) for g in keys]
                if roles[i] == "holder-dies":
                    os.kill(pid, signal.SIGKILL)
                else:
                    readers[r] = i  # a renewer reports again when released
        killed_at = time.monotonic()
        for i in killed_inside | {i for i in held if roles[i] == "holder-dies"}:
            procs[i].join(WAIT_S)
            assert procs[i].exitcode == -signal.SIGKILL
        assert killed_inside == {i for i, r in enumerate(roles) if r == "dies-inside"}

        # nothing half-made: every reservation has exactly its k GPU rows, none of a killed transaction
        per_job, orphans = integrity(ledger_db_url)
        assert orphans == 0 and all(claimed == rows for _, claimed, rows in per_job)
        assert {job for job, _, _ in per_job} <= {f"p{i}" for i in held}
        all_held = [g for keys in held.values() for g in keys]
        assert len(all_held) == len(set(all_held)) == len(held) == TOTAL // 2

        # once the dead holders' leases pass, their GPUs are free; the renewers keep theirs
        time.sleep(max(0.0, killed_at + HOLDER_LEASE_S + 0.5 - time.monotonic()))
        renewers = {i for i in held if roles[i] == "renews"}
        with Ledger.from_url(ledger_db_url) as led:
            led.expire()
            assert {r.job_id for r in led.live_reservations()} == {f"p{i}" for i in renewers}
            assert set(led.reserved_map()) == {g for i in renewers for g in held[i]}
            dead_gpus = {g for i in held if roles[i] == "holder-dies" for g in held[i]}
            again = led.reserve("after", cluster32(), PlanRequest(TOTAL - len(renewers)))
            assert dead_gpus <= set(again.decision.keys)
            assert led.release("after")
            per_job, orphans = integrity(ledger_db_url)
            assert orphans == 0 and all(claimed == rows for _, claimed, rows in per_job)
        stop.set()
        for i in renewers:
            assert pipes[i][0].poll(WAIT_S)
            assert pipes[i][0].recv() == ("released", i, procs[i].pid, True)
            procs[i].join(WAIT_S)
            assert procs[i].exitcode == 0
        with Ledger.from_url(ledger_db_url) as led:
            assert led.live_reservations() == [] and led.reserved_map() == {}
    finally:
        stop.set()
        _stop(procs)
