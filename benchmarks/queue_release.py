"""What the queue adds to a release: the admission pass inside the ledger's write transaction.

A SQLite ledger holds the inventory of ``--hosts`` hosts of 8 A100s (the emulated outputs,
stored with ``store_collection``), every GPU held by 8-GPU jobs but one host's worth. Two runs,
each releasing ``--repeat`` of those jobs one after the other:

* ``no queue`` (the baseline, measured in the same run): nobody waits, the release deletes the
  rows and its pass is one ``SELECT``;
* ``queue``: ``--waiting`` jobs wait (1, 2, 4, 8 and 16 GPUs), so every release runs a full pass
  (reasons, claims) and writes the reservations of the jobs it admits; between releases the
  admitted jobs take their admissions and enqueue again, so the queue stays as long.

Each release is timed from the call to its return (wall and CPU), and so is its write
transaction alone (``lock``: the ledger lock is held for exactly that long; the rest is the read
before it that parses the stored inventory once per process, so "first" is a new process's
first release).

    python benchmarks/queue_release.py [--hosts 125] [--waiting 100] [--repeat 20]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.ledger.inventory import HostRecord
from airflow_hetero_gpu.testing.captures import host_files
from airflow_hetero_gpu.testing.demo import small_hosts


class TimedLedger(Ledger):
    """The ledger, timing its release transactions (how long the lock is held)."""

    lock_times: list[float] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        locked = self.db.locked

        @contextmanager
        def timed(action: str):
            t0 = time.perf_counter()
            with locked(action) as uow:
                yield uow
            if action.startswith("release"):
                self.lock_times.append(time.perf_counter() - t0)

        self.db.locked = timed  # type: ignore[method-assign]


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]


def setup(url: str, hosts: int) -> list[str]:
    """The inventory, and 8-GPU holders on every host but one."""
    with Ledger.from_url(url) as led:
        led.store_collection([HostRecord(s.name, True, host_files(s)) for s in small_hosts(hosts, gpus=8)],
                             collector="benchmark")
        holders = []
        for i in range(hosts - 1):
            job = f"hold-{i:05d}"
            assert led.enqueue(job, PlanRequest(8), lease_seconds=3600).admitted
            led.take_admission(job)
            holders.append(job)
        return holders


def run(url: str, holders: list[str], waiting: int, repeat: int, seed: int = 1) -> dict:
    rng = random.Random(seed)
    sizes = [1, 2, 4, 8, 16]
    with Ledger.from_url(url) as led:
        # the free host is taken by 1-GPU jobs so that a waiting job needs a release
        for i in range(8):
            assert led.enqueue(f"fill-{i}", PlanRequest(1), lease_seconds=3600).admitted
            led.take_admission(f"fill-{i}")
        for i in range(waiting):
            led.enqueue(f"wait-{i:04d}", PlanRequest(rng.choice(sizes)), priority=rng.choice([0, 1]),
                        lease_seconds=3600)
    wall, cpu, admitted = [], [], 0
    first = None
    TimedLedger.lock_times = []
    with TimedLedger.from_url(url) as led:  # a fresh process-like start: its first release parses the inventory
        for n, job in enumerate(holders[:repeat]):
            t0, c0 = time.perf_counter(), time.process_time()
            assert led.release(job)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if n == 0:
                first = dt
            else:
                wall.append(dt)
                cpu.append(dc)
            for e in led.queue():  # the admitted take their GPUs; the queue stays as long
                if e.admitted:
                    admitted += 1
                    led.take_admission(e.job_id)
                    if waiting:
                        led.enqueue(f"again-{e.job_id}", PlanRequest(rng.choice(sizes)), lease_seconds=3600)
    return {"first": first, "wall": wall, "cpu": cpu, "admitted": admitted, "lock": TimedLedger.lock_times[1:],
            "first_lock": TimedLedger.lock_times[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=125)
    ap.add_argument("--waiting", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = {}
        for name, waiting in (("no queue", 0), ("queue", args.waiting)):
            from airflow_hetero_gpu.ledger import admission

            admission._CACHES.clear()  # each run parses the inventory once, as a new process would
            url = f"sqlite:///{Path(tmp) / (name.replace(' ', '-') + '.db')}"
            holders = setup(url, args.hosts)
            admission._CACHES.clear()
            rows[name] = run(url, holders, waiting, args.repeat + 1)
    base = statistics.median(rows["no queue"]["wall"])
    print(f"python {platform.python_version()} on {platform.machine()}, SQLite, {args.hosts} hosts x 8 GPUs "
          f"({args.hosts * 8} GPUs), {args.waiting} waiting, {args.repeat} releases after the first; ms")
    print(f"{'':>10}  {'first':>8}  {'its lock':>8}  {'wall p50':>8}  {'wall p95':>8}  {'x base':>6}  {'CPU p50':>8}  {'CPU p95':>8}  "
          f"{'lock p50':>8}  {'lock p95':>8}  {'admitted':>8}")
    for name, r in rows.items():
        print(f"{name:>10}  {r['first'] * 1e3:8.2f}  {r['first_lock'] * 1e3:8.2f}  {statistics.median(r['wall']) * 1e3:8.2f}  "
              f"{p95(r['wall']) * 1e3:8.2f}  {statistics.median(r['wall']) / base:6.1f}  "
              f"{statistics.median(r['cpu']) * 1e3:8.2f}  {p95(r['cpu']) * 1e3:8.2f}  "
              f"{statistics.median(r['lock']) * 1e3:8.2f}  {p95(r['lock']) * 1e3:8.2f}  {r['admitted']:8d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
