"""What the writers' guard (docs/ledger.md#an-older-release-may-not-write) costs a write.

Two ledgers per database (SQLite file, private PostgreSQL server): one as shipped, one with the
guard's triggers removed (the baseline, measured in the same run, rounds interleaved). Per round:
one write's round trip (``expire()``: the lock and the writer's declaration, the clock, the
sweep; the best of ``--writes``), and the CPU time of storing a ``--hosts``-host collection
(about three rows a host, each passing SQLite's row triggers). The best of ``--rounds`` is
printed (the machine is shared: the best is the least disturbed).

    python benchmarks/ledger_guard.py [--hosts 500] [--rounds 5] [--writes 40]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--writes", type=int, default=40)
    args = ap.parse_args()
    logging.disable(logging.CRITICAL)  # the admission pass logs every pass

    from airflow_hetero_gpu.ledger import Ledger, guard
    from airflow_hetero_gpu.ledger.inventory import HostRecord
    from airflow_hetero_gpu.testing.captures import host_files
    from airflow_hetero_gpu.testing.demo import small_hosts
    from airflow_hetero_gpu.testing.postgres import PostgresServer

    records = [HostRecord(s.name, True, host_files(s)) for s in small_hosts(args.hosts, gpus=8)]

    def ledger(url: str, guarded: bool) -> Ledger:
        led = Ledger.from_url(url)
        if not guarded:
            with led._write("remove the guard") as (conn, _now):
                guard.drop(conn)
        return led

    server = PostgresServer().start()
    try:
        ledgers = {(db, guarded): ledger(f"sqlite:///{tempfile.mkdtemp()}/ledger.db" if db == "sqlite"
                                         else server.create_database(), guarded)
                   for db in ("sqlite", "postgresql") for guarded in (False, True)}
        best: dict[tuple, float] = {}
        for _ in range(args.rounds):
            for (db, guarded), led in ledgers.items():
                cpu = time.process_time()
                led.store_collection(records, collector="benchmark")
                key = (db, guarded, f"store {args.hosts} hosts, CPU")
                best[key] = min(best.get(key, float("inf")), time.process_time() - cpu)
                for _ in range(args.writes):
                    wall = time.perf_counter()
                    led.expire()
                    key = (db, guarded, "one write's round trip")
                    best[key] = min(best.get(key, float("inf")), time.perf_counter() - wall)
        for db in ("sqlite", "postgresql"):
            for what in (f"store {args.hosts} hosts, CPU", "one write's round trip"):
                print(f"{db:10s} {what:24s} no guard {1000 * best[(db, False, what)]:8.2f} ms   "
                      f"guard {1000 * best[(db, True, what)]:8.2f} ms")
        for led in ledgers.values():
            led.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
