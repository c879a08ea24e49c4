"""Many planning-and-reserving clients against one PostgreSQL ledger.

N clients (default 200) are threads of this process, each with its own :class:`Ledger` (its
own SQLAlchemy engine and PostgreSQL connection). Each loops for ``--seconds``:
``reserve()`` a random 1-4 GPUs of a synthetic 256-GPU cluster (32 hosts of 8 A100s, NV12
inside a host) -> hold it 20-100 ms -> ``release()``. A reserve that finds no room (all GPUs
held by others) counts as "no fit" and the client backs off 20-100 ms.

A sampler thread reads ``live_reservations()`` continuously and counts GPUs that appear in two
live reservations at once (the primary key of ``reservation_gpus`` forbids it; checked anyway).
After all clients stop, the ledger must hold no live reservation (nothing leaked).

Prints throughput (successful reservations per second), p50/p99 latency of ``reserve()``
(successful and no-fit calls separately), the double-booking and leak counts; exits 1 when
either is not 0.

Without ``--url`` it starts a private PostgreSQL server (the tests' ``PostgresServer``, with
``max_connections`` raised to fit the clients) and deletes it at the end.

    python benchmarks/ledger_load.py [--clients 200] [--seconds 60] [--url postgresql://...]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import threading
import time
import uuid

from airflow_hetero_gpu.core.cluster import build_cluster
from airflow_hetero_gpu.core.model import Gpu, PlanRequest
from airflow_hetero_gpu.core.topology import HostWiring
from airflow_hetero_gpu.ledger import Ledger

HOSTS, PER_HOST = 32, 8


def synthetic_cluster():
    gpus = [Gpu(f"gpu{h:02d}", i, f"GPU-{h:02d}-{i}", "NVIDIA A100-SXM4-80GB", 81920, 0, 0.0)
            for h in range(HOSTS) for i in range(PER_HOST)]
    nv12 = {(a, b): "NV12" for a in range(PER_HOST) for b in range(a + 1, PER_HOST)}
    wiring = {f"gpu{h:02d}": HostWiring.from_links(range(PER_HOST), nv12) for h in range(HOSTS)}
    return build_cluster(gpus, wiring)


def private_server(max_connections: int):
    from airflow_hetero_gpu.testing.postgres import PostgresServer

    class Server(PostgresServer):
        def _run(self, *args, check=True):  # same server, room for every client's connection
            args = tuple(a.replace("max_connections=200", f"max_connections={max_connections}") for a in args)
            return super()._run(*args, check=check)

    return Server().start()


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok: list[float] = []
        self.no_fit: list[float] = []
        self.errors: list[str] = []
        self.double_booked = 0
        self.samples = 0
        self.max_live_gpus = 0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def client(url: str, cluster, stop: threading.Event, stats: Stats, seed: int) -> None:
    rng = random.Random(seed)
    try:
        ledger = Ledger(url)
    except Exception as exc:  # noqa: BLE001 - reported at the end
        with stats.lock:
            stats.errors.append(f"open: {exc}")
        return
    ok, no_fit = [], []
    try:
        while not stop.is_set():
            job_id = f"load-{seed}-{uuid.uuid4().hex[:8]}"
            started = time.perf_counter()
            try:
                result = ledger.reserve(job_id, cluster, PlanRequest(rng.randint(1, 4)), lease_seconds=600)
            except Exception as exc:  # noqa: BLE001
                with stats.lock:
                    stats.errors.append(f"reserve: {str(exc).splitlines()[0]}")
                time.sleep(0.1)
                continue
            elapsed = time.perf_counter() - started
            if result.decision is None:
                no_fit.append(elapsed)
                time.sleep(rng.uniform(0.02, 0.1))
                continue
            ok.append(elapsed)
            time.sleep(rng.uniform(0.02, 0.1))
            try:
                ledger.release(job_id)
            except Exception as exc:  # noqa: BLE001
                with stats.lock:
                    stats.errors.append(f"release: {str(exc).splitlines()[0]}")
    finally:
        ledger.close()
        with stats.lock:
            stats.ok += ok
            stats.no_fit += no_fit


def sampler(url: str, stop: threading.Event, stats: Stats) -> None:
    with Ledger(url) as ledger:
        while not stop.is_set():
            seen: dict[tuple[str, int], str] = {}
            doubles = 0
            live = ledger.live_reservations()
            for res in live:
                for g in res.gpus:
                    key = (g.host, g.index)
                    if key in seen and seen[key] != res.job_id:
                        doubles += 1
                    seen[key] = res.job_id
            with stats.lock:
                stats.samples += 1
                stats.double_booked += doubles
                stats.max_live_gpus = max(stats.max_live_gpus, len(seen))
            time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--url", help="a PostgreSQL ledger URL (default: a private throw-away server)")
    args = parser.parse_args(argv)

    server = None
    url = args.url
    if url is None:
        server = private_server(args.clients + 20)
        url = server.create_database()
    try:
        cluster = synthetic_cluster()
        with Ledger(url):  # create the schema once, before the clients race to it
            pass
        stats, stop = Stats(), threading.Event()
        threads = [threading.Thread(target=client, args=(url, cluster, stop, stats, i), daemon=True)
                   for i in range(args.clients)]
        watch = threading.Thread(target=sampler, args=(url, stop, stats), daemon=True)
        watch.start()
        started = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join()
        wall = time.monotonic() - started
        watch.join()
        with Ledger(url) as ledger:
            leaked = ledger.live_reservations()

        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
              f"ledger {'private PostgreSQL' if server else 'PostgreSQL at --url'}")
        print(f"clients: {args.clients} threads, each with its own Ledger (engine + connection); "
              f"cluster: {HOSTS * PER_HOST} GPUs on {HOSTS} hosts; wall {wall:.1f} s")
        print(f"reservations: {len(stats.ok)} ({len(stats.ok) / wall:.1f}/s); no fit: {len(stats.no_fit)} "
              f"({len(stats.no_fit) / wall:.1f}/s); errors: {len(stats.errors)}")
        print(f"reserve latency, successful: p50 {percentile(stats.ok, 0.5) * 1000:.1f} ms, "
              f"p99 {percentile(stats.ok, 0.99) * 1000:.1f} ms, "
              f"mean {statistics.fmean(stats.ok) * 1000 if stats.ok else float('nan'):.1f} ms")
        print(f"reserve latency, no fit:    p50 {percentile(stats.no_fit, 0.5) * 1000:.1f} ms, "
              f"p99 {percentile(stats.no_fit, 0.99) * 1000:.1f} ms")
        print(f"ledger samples: {stats.samples}, most GPUs reserved at once: {stats.max_live_gpus}")
        print(f"double-booked GPUs seen: {stats.double_booked}")
        print(f"leaked reservations after stop: {len(leaked)}")
        for line in sorted(set(stats.errors))[:5]:
            print(f"  error: {line}")
        return 0 if stats.double_booked == 0 and not leaked and stats.ok else 1
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
