"""A release's hold of the ledger lock while a health check stores its parts: the write's own warmed
cluster against a rebuild under the lock.

A ledger (SQLite; ``--postgres``: a private PostgreSQL server) holds the inventory of ``--hosts``
hosts of 8 A100s (the emulated outputs). Every host but ``--open`` is drained, so that a few
8-GPU holders fill what is open and ``--waiting`` jobs (1-8 GPUs) wait: every release runs a full
admission pass that admits some of them. Each of ``--repeat`` rounds releases one holder, and
between the release's warm (the read transaction that builds the queue's cluster before the lock)
and its lock a health check's part of ``--part`` hosts lands: a ``record_health_check`` of another
``Ledger`` (``admit=False``, as the check's parts; it runs no pass, as another process's part
would not touch this process's cache). The admitted jobs then take their GPUs and as many jobs
enqueue again.

Two runs, each on a fresh ledger and cache:

* ``rebuild`` (the baseline: the write before this change): the write warms, then under the
  lock its pass finds the inventory's version moved and re-parses the part's hosts;
* ``warmed``: the write's pass uses the cluster it warmed (``UnitOfWork.cluster``): nothing is
  parsed under the lock (the cache's counters say so).

Printed per run, in ms: the release's hold of the lock (p50, p99, max), its wall and CPU (p50,
without the part's write), the hosts the cache parsed under the release's lock per round; then
whether both runs admitted the same jobs on the same GPUs (the parts store the same outputs
again, so the cluster a write warmed and the rebuilt one agree), and the ratio of the lock p50
and p99 rebuild / warmed measured in the same run.

    python benchmarks/write_during_check.py [--hosts 1250] [--part 100] [--repeat 20] [--postgres]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.ledger.inventory import HostRecord
from airflow_hetero_gpu.testing.captures import host_files
from airflow_hetero_gpu.testing.demo import small_hosts

SIZES = (1, 2, 4, 8)


def judge(captures, new_xids, files):
    from airflow_hetero_gpu.core import watch
    from airflow_hetero_gpu.core.config import ClusterConfig

    config = ClusterConfig()
    return watch.evaluate(captures, config, new_xids), watch.WatchPolicy.from_thresholds(config.thresholds)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def setup(url: str, specs: list, open_hosts: int, waiting: int) -> list[str]:
    """The inventory, every host but ``open_hosts`` drained, those held by 8-GPU jobs, and the
    waiting jobs."""
    with Ledger.from_url(url) as led:
        led.store_collection([HostRecord(s.name, True, host_files(s)) for s in specs], collector="benchmark")
        led.drain([s.name for s in specs[open_hosts:]], "benchmark: only a few hosts open")
        holders = []
        for i in range(open_hosts):
            assert led.enqueue(f"hold-{i}", PlanRequest(8), lease_seconds=3600).admitted
            led.take_admission(f"hold-{i}")
            holders.append(f"hold-{i}")
        for i in range(waiting):
            led.enqueue(f"wait-{i:04d}", PlanRequest(SIZES[i % len(SIZES)]), lease_seconds=3600)
        return holders


def run(url: str, specs: list, holders: list[str], part: int, repeat: int, warmed: bool) -> dict[str, Any]:
    from airflow_hetero_gpu.ledger import admission

    admission._CACHES.clear()  # a fresh process's cache
    lock: list[float] = []
    parsed: list[int] = []
    wall: list[float] = []
    cpu: list[float] = []
    part_s: list[float] = []
    part_cpu: list[float] = []
    placed: list[tuple[str, tuple]] = []
    with Ledger.from_url(url) as led, Ledger.from_url(url) as check:
        db, cache = led.db, led.db.clusters
        locked, write = db.locked, db.write
        turn = {"n": 0}

        @contextmanager
        def timed(action: str) -> Iterator[Any]:
            if not action.startswith("release"):
                with locked(action) as uow:
                    yield uow
                return
            # the release warmed: a check's part lands before it takes the lock
            n = turn["n"] = turn["n"] + 1
            chunk = [specs[(n * part + i) % len(specs)] for i in range(part)]
            p0, q0 = time.perf_counter(), time.process_time()
            check.record_health_check([HostRecord(s.name, True, host_files(s)) for s in chunk],
                                      collector="benchmark check", judge=judge, admit=False)
            part_s.append(time.perf_counter() - p0)
            part_cpu.append(time.process_time() - q0)
            before = cache.stats.hosts_parsed
            t0 = time.perf_counter()
            with locked(action) as uow:
                yield uow
            lock.append(time.perf_counter() - t0)
            parsed.append(cache.stats.hosts_parsed - before)

        @contextmanager
        def rebuild_write(action: str, *, warm: bool = False) -> Iterator[Any]:
            """The write as it was: warm, then under the lock the cache compares the version only."""
            if warm:
                db.warm()
            with db.locked(action) as uow:
                yield uow

        db.locked = timed  # type: ignore[method-assign]
        if not warmed:
            db.write = rebuild_write  # type: ignore[method-assign]
        holders = list(holders)
        admitted, n_enq = 0, 0
        for _ in range(repeat + 1):
            job = holders.pop(0)
            t0, c0, p0, q0 = time.perf_counter(), time.process_time(), sum(part_s), sum(part_cpu)
            assert led.release(job)
            wall.append(time.perf_counter() - t0 - (sum(part_s) - p0))  # the part's write is not the release's
            cpu.append(time.process_time() - c0 - (sum(part_cpu) - q0))
            for e in led.queue():  # the admitted take their GPUs and as many jobs wait again
                if e.admitted:
                    admitted += 1
                    res = led.take_admission(e.job_id)
                    placed.append((e.job_id, tuple((g.host, g.index) for g in res.gpus)))
                    holders.append(e.job_id)
                    led.enqueue(f"again-{n_enq:04d}", PlanRequest(SIZES[n_enq % len(SIZES)]), lease_seconds=3600)
                    n_enq += 1
        db.write = write  # type: ignore[method-assign]
        uses = cache.stats.warmed_uses
    # the first release of the process parses every host in its warm: leave it out
    return {"lock": lock[1:], "wall": wall[1:], "cpu": cpu[1:], "parsed": parsed[1:], "admitted": admitted,
            "uses": uses, "placed": placed, "part": part_s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1250)
    ap.add_argument("--part", type=int, default=100, help="hosts in each part of the check")
    ap.add_argument("--open", type=int, default=4, help="hosts not drained (held by 8-GPU jobs)")
    ap.add_argument("--waiting", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--postgres", action="store_true", help="a private PostgreSQL server instead of SQLite")
    args = ap.parse_args(argv)
    specs = small_hosts(args.hosts, gpus=8)
    server = None
    if args.postgres:
        from airflow_hetero_gpu.testing.postgres import PostgresServer

        server = PostgresServer().start()
    rows: dict[str, dict[str, Any]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, warmed in (("rebuild", False), ("warmed", True)):
                url = server.create_database() if server else f"sqlite:///{Path(tmp) / (name + '.db')}"
                holders = setup(url, specs, args.open, args.waiting)
                rows[name] = run(url, specs, holders, args.part, args.repeat, warmed)
    finally:
        if server is not None:
            server.stop()
    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"{'PostgreSQL' if args.postgres else 'SQLite'}, {args.hosts} hosts x 8 GPUs, a part of {args.part} "
          f"hosts between each release's warm and its lock, {args.waiting} waiting, {args.repeat} releases; ms")
    print(f"{'':>8}  {'lock p50':>8}  {'lock p99':>8}  {'lock max':>8}  {'wall p50':>8}  {'CPU p50':>8}  "
          f"{'parsed/lock':>11}  {'admitted':>8}  {'warmed uses':>11}")
    for name, r in rows.items():
        print(f"{name:>8}  {statistics.median(r['lock']) * 1e3:8.1f}  {pct(r['lock'], 0.99) * 1e3:8.1f}  "
              f"{max(r['lock']) * 1e3:8.1f}  {statistics.median(r['wall']) * 1e3:8.1f}  "
              f"{statistics.median(r['cpu']) * 1e3:8.1f}  {statistics.median(r['parsed']):11.0f}  "
              f"{r['admitted']:8d}  {r['uses']:11d}")
    a, b = rows["rebuild"]["lock"], rows["warmed"]["lock"]
    print(f"the parts' writes: p50 {statistics.median(rows['warmed']['part']) * 1e3:.0f} ms (not in the release's wall); "
          f"the same admissions, job by job and GPU by GPU: {rows['rebuild']['placed'] == rows['warmed']['placed']}")
    print(f"lock hold rebuild / warmed: p50 {statistics.median(a) / statistics.median(b):.1f}x, "
          f"p99 {pct(a, 0.99) / pct(b, 0.99):.1f}x")
    return 0 if max(rows["warmed"]["parsed"]) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
