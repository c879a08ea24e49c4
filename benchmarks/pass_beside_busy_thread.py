"""A write's hold of the ledger lock while another thread of its process is busy with pure Python.

In the triggerer a health check merges, parses and judges its parts in one thread while the
triggers' renewals run admission passes in others. After each database round trip the writing
thread waits for the interpreter (the GIL) up to the switch interval, which the busy thread holds
(5 ms by default); :mod:`airflow_hetero_gpu.ledger.switching` lowers the interval while a write
holds the lock.

A ledger (SQLite, and with ``--postgres`` a private PostgreSQL server too) holds the inventory of
``--hosts`` hosts of 8 A100s; every host but 4 is drained and held, and ``--waiting`` jobs of 1-8
GPUs wait, so that every ``run_admission`` runs a full pass that admits nothing (the same pass
each time). Three rows, ``--repeat`` passes each, in one process:

* ``alone``: no other thread;
* ``busy, as it was``: a thread parses hosts' outputs (``parse_host`` over 100 hosts, as a
  check's part) without pause, and the write leaves the switch interval as it finds it;
* ``busy, prompt``: the same thread, the write as it is (the interval lowered under the lock).

Printed per row, in ms: the lock hold (the write's transaction, from asking for the lock to its
commit: what every other writer of the fleet waits on) p50, p99 and max, the wall of the whole
``run_admission`` (with its warm, a read before the lock) p50; then the ratio of the lock
hold's p50 and p99, as it was / prompt, measured in the same run.

    python benchmarks/pass_beside_busy_thread.py [--hosts 1250] [--waiting 8] [--repeat 30] [--postgres]
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).parent))

from write_during_check import pct, setup  # noqa: E402

from airflow_hetero_gpu.capture.directory import parse_host  # noqa: E402
from airflow_hetero_gpu.ledger import Ledger, db as ledger_db  # noqa: E402
from airflow_hetero_gpu.testing.captures import host_files  # noqa: E402
from airflow_hetero_gpu.testing.demo import small_hosts  # noqa: E402

PART = 100


def busy(stop: threading.Event, parts: list[tuple[str, dict[str, str]]], rounds: list[int]) -> None:
    """A check's part parsed again and again until ``stop`` (pure Python, as the triggerer's)."""
    while not stop.is_set():
        for name, files in parts:
            parse_host(name, files, f"benchmark part, host {name}")
        rounds[0] += 1


def measure(led: Ledger, repeat: int, parts: list[tuple[str, dict[str, str]]] | None,
            prompt: bool) -> dict[str, Any]:
    holds: list[float] = []
    walls: list[float] = []
    db = led.db
    locked = db.locked

    @contextlib.contextmanager
    def timed(action: str) -> Iterator[Any]:
        t0 = time.perf_counter()
        with locked(action) as uow:
            yield uow
        holds.append(time.perf_counter() - t0)

    found = ledger_db.prompt_switching
    if not prompt:
        ledger_db.prompt_switching = contextlib.nullcontext  # type: ignore[assignment]
    db.locked = timed  # type: ignore[method-assign]
    stop, rounds = threading.Event(), [0]
    thread = threading.Thread(target=busy, args=(stop, parts, rounds), daemon=True) if parts else None
    try:
        if thread is not None:
            thread.start()
            while rounds[0] == 0:  # the busy thread is at work before the first pass
                time.sleep(0.01)
        for _ in range(repeat):
            t0 = time.perf_counter()
            result = led.run_admission()
            walls.append(time.perf_counter() - t0)
            assert result is not None and not result.admitted, "the pass must run in full and admit nothing"
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        db.locked = locked  # type: ignore[method-assign]
        ledger_db.prompt_switching = found  # type: ignore[assignment]
    return {"hold": holds, "wall": walls, "switch": sys.getswitchinterval()}


def run_one(url: str, specs: list, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    setup(url, specs, 4, args.waiting)
    parts = [(s.name, host_files(s)) for s in specs[:PART]]
    rows: dict[str, dict[str, Any]] = {}
    with Ledger.from_url(url) as led:
        led.run_admission()  # the process's first pass builds the cluster
        for name, with_parts, prompt in (("alone", False, True), ("busy, as it was", True, False),
                                         ("busy, prompt", True, True)):
            rows[name] = measure(led, args.repeat, parts if with_parts else None, prompt)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1250)
    ap.add_argument("--waiting", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--postgres", action="store_true", help="a private PostgreSQL server as well as SQLite")
    args = ap.parse_args(argv)
    specs = small_hosts(args.hosts, gpus=8)
    print(f"python {platform.python_version()} on {platform.machine()}, {args.hosts} hosts x 8 GPUs, "
          f"{args.waiting} waiting, {args.repeat} passes a row, switch interval as found "
          f"{sys.getswitchinterval() * 1e3:g} ms, under the lock {ledger_db.prompt_switching.__module__}"
          f".WRITE_SWITCH_INTERVAL_S; ms")
    server = None
    if args.postgres:
        from airflow_hetero_gpu.testing.postgres import PostgresServer

        server = PostgresServer().start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            databases = [("SQLite", f"sqlite:///{Path(tmp) / 'ledger.db'}")]
            if server is not None:
                databases.append(("PostgreSQL", server.create_database()))
            for label, url in databases:
                rows = run_one(url, specs, args)
                print(f"{label}: {'':>16}  {'lock p50':>8}  {'lock p99':>8}  {'lock max':>8}  {'wall p50':>8}")
                for name, r in rows.items():
                    print(f"{label}: {name:>16}  {statistics.median(r['hold']) * 1e3:8.1f}  "
                          f"{pct(r['hold'], 0.99) * 1e3:8.1f}  {max(r['hold']) * 1e3:8.1f}  "
                          f"{statistics.median(r['wall']) * 1e3:8.1f}")
                was, now = rows["busy, as it was"]["hold"], rows["busy, prompt"]["hold"]
                p50, p99 = statistics.median(was) / statistics.median(now), pct(was, 0.99) / pct(now, 0.99)
                print(f"{label}: lock hold beside a busy thread, as it was / prompt: p50 {p50:.1f}x, p99 {p99:.1f}x")
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
