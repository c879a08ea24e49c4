"""Server-side render time of the cluster page for a 1,000-host fleet, against the old page.

The fleet is the planner benchmark's synthetic cluster (``plan_latency.synthetic_cluster``:
hosts of 8 GPUs with real intra-host wirings, four card types, ~40 % loaded, ~1 % unhealthy,
racks of 16 hosts under leaves under spines), with live reservations on 10 % of the GPUs and
20 evicted GPUs. What a request costs once the inventory is parsed (the page keeps the parsed
cluster until a capture changes), each timed ``--repeat`` times after one warm-up:

* ``page``: :func:`model.build` and :func:`render.render_page` (the cluster page as it opens);
* ``page, filtered``: the same with ``?state=reserved&sort=-util``;
* ``host page``: one host with its wiring and 6 h of history (72 samples, 2 events);
* ``history, 6 h``: the pools' history page over 72 samples of every host;
* ``JSON``: ``/api/cluster`` (the model as JSON text);
* ``inventory from the ledger``: what the page pays once per stored collection (it keeps the
  parsed cluster until the next one): the 1,000 emulated hosts of the page's browser tests
  (``tests/page_fleet.py``: the emulated nvidia-smi's outputs) read from a SQLite ledger and
  parsed into the cluster (``--inventory`` only);
* baseline ``old page``: the renderer this page replaced (``plugins/render.py`` of commit
  ``BASELINE_COMMIT``, read from git): its facts, the whole wiring picture in one row and every
  GPU in one table, on the same fleet in the same run.

Printed: median wall time and median CPU time (the CPU time is steadier on a shared machine),
the HTML size, and the ratios of the medians against the old page.

    python benchmarks/page_render.py [--hosts 1000] [--repeat 7] [--inventory]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent / "tests"))  # page_fleet: the browser tests' emulated fleet

from plan_latency import synthetic_cluster  # noqa: E402

from airflow_hetero_gpu.ledger.records import Eviction, Reservation, ReservedGpu, TaskIdentity  # noqa: E402
from airflow_hetero_gpu.plugins import model, render, tables  # noqa: E402

BASELINE_COMMIT = "38d500c"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Sample:  # the shape of the ledger's HostSample
    host: str
    collected_at: datetime
    ok: bool
    gpus: tuple

    def to_json(self) -> dict:
        return {"host": self.host, "collected_at": self.collected_at.isoformat(), "ok": self.ok,
                "gpus": list(self.gpus)}


@dataclass(frozen=True)
class Event:  # the shape of the ledger's GpuEvent
    at: datetime
    host: str
    index: int
    uuid: str | None
    kind: str
    reasons: tuple = ()
    job_id: str | None = None
    detail: Any = None


def ledger_state(cluster, rng: random.Random) -> tuple[list, list]:
    free = [g for g in cluster.gpus if g.healthy and g.base_load <= 0.1]
    rng.shuffle(free)
    reservations, i, n = [], 0, 0
    target = len(cluster.gpus) // 10
    while i < target and i + 8 <= len(free):
        k = rng.choice([1, 2, 4, 8])
        gpus = free[i:i + k]
        i += k
        n += 1
        ident = TaskIdentity(f"train_{n % 9}", f"scheduled__2026-12-01T{n % 24:02d}:00:00+00:00", "train", 1 + n % 3)
        reservations.append(Reservation(
            job_id=f"train_{n % 9}.train.{rng.getrandbits(48):012x}", pool="p",
            gpus=tuple(ReservedGpu(g.host, g.index, g.uuid, s) for s, g in enumerate(gpus)), score={"total": 0.5},
            created_at=NOW - timedelta(minutes=30), renewed_at=NOW - timedelta(seconds=30),
            expires_at=NOW + timedelta(minutes=5), gpu_count=k, identity=ident))
    evictions = [Eviction(g.host, g.index, g.uuid, ("xid-79",), NOW - timedelta(hours=1), NOW, 1)
                 for g in free[i:i + 20]]
    return reservations, evictions


def history(cluster, hours: float = 6, every_s: float = 300) -> tuple[list, list]:
    samples = []
    steps = int(hours * 3600 / every_s)
    by_host: dict[str, list] = {}
    for g in cluster.gpus:
        by_host.setdefault(g.host, []).append(g)
    for step in range(steps + 1):
        at = NOW - timedelta(seconds=(steps - step) * every_s)
        for host, gpus in by_host.items():
            samples.append(Sample(host, at, True, tuple(
                {"index": g.index, "uuid": g.uuid, "name": g.name, "utilization": g.utilization,
                 "temperature_c": g.temperature_c, "memory_used_mib": g.memory_used_mib,
                 "memory_total_mib": g.memory_total_mib, "healthy": g.healthy, "reasons": list(g.reasons),
                 "reserved": None, "evicted": None} for g in gpus)))
    host = cluster.hosts[0]
    events = [Event(NOW - timedelta(hours=2), host, 1, None, "evicted", ("xid-79",)),
              Event(NOW - timedelta(hours=1), host, 1, None, "readmitted")]
    return samples, events


def old_renderer() -> types.ModuleType | None:
    """The page's renderer before it was split (one module of f-strings), from git."""
    try:
        text = subprocess.run(["git", "show", f"{BASELINE_COMMIT}:airflow_hetero_gpu/plugins/render.py"],
                              cwd=HERE, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        print(f"baseline unavailable (git show {BASELINE_COMMIT}): {err}")
        return None
    mod = types.ModuleType("old_render")
    sys.modules["old_render"] = mod  # dataclasses look their module up
    exec(compile(text, f"{BASELINE_COMMIT}:plugins/render.py", "exec"), mod.__dict__)  # noqa: S102
    return mod


def inventory_case(hosts: int, tmp: Path) -> Callable[[], Any]:
    """Read and parse the ledger's inventory of ``hosts`` emulated hosts (stored once, untimed)."""
    from page_fleet import down_hosts, fleet_hosts, fleet_records, topology_conf

    from airflow_hetero_gpu.collect.freshness import FreshInventory
    from airflow_hetero_gpu.ledger import Ledger

    url = f"sqlite:///{tmp / 'ledger.db'}"
    specs = fleet_hosts(hosts)
    with Ledger.from_url(url) as led:
        led.store_collection(fleet_records(specs, down_hosts(specs)), collector="benchmark",
                             fleet_files={"topology.conf": topology_conf(hosts)})
    ledger = Ledger.open_existing(url)
    return lambda: FreshInventory(ledger.inventory(), float("inf")).cluster()


def timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], list[float], Any]:
    out = fn()  # warm-up: templates compiled, the cluster's graph built (both kept by a server)
    wall, cpu = [], []
    for _ in range(repeat):
        gc.collect()
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return wall, cpu, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--inventory", action="store_true", help="also time reading the inventory from a ledger")
    args = ap.parse_args()
    rng = random.Random(11)
    t0 = time.perf_counter()
    cluster = synthetic_cluster(args.hosts * 8)
    reservations, evictions = ledger_state(cluster, rng)
    samples, events = history(cluster)
    print(f"python {platform.python_version()} on {platform.machine()}; {len(cluster.hosts)} hosts, "
          f"{len(cluster.gpus)} GPUs, {len(reservations)} reservations, {len(evictions)} evictions, "
          f"{len(samples)} samples; fleet built in {time.perf_counter() - t0:.1f} s; repeat {args.repeat}")
    host = cluster.hosts[0]
    host_samples = [s for s in samples if s.host == host]

    def page(q: tables.Query = tables.Query()) -> str:
        m = model.build(cluster, reservations, evictions, now=NOW)
        return render.render_page(m, q)

    def host_page() -> str:
        m = model.build(cluster, reservations, evictions, samples=host_samples, events=events, now=NOW)
        return render.render_host(m, host, hours=6)

    def history_page() -> str:
        m = model.build(cluster, reservations, evictions, samples=samples, events=events, now=NOW)
        return render.render_history(m, hours=6)

    def as_json() -> str:
        return json.dumps(model.build(cluster, reservations, evictions, now=NOW).to_json())

    cases: list[tuple[str, Callable[[], str]]] = [
        ("page", page),
        ("page, filtered", lambda: page(tables.Query.parse({"state": "reserved", "sort": "-util"}))),
        ("host page", host_page),
        ("history, 6 h", history_page),
        ("JSON", as_json),
    ]
    old = old_renderer()
    if old is not None:
        def old_page() -> str:
            facts = old.cluster_facts(cluster, reservations, evictions, now=NOW)
            statuses = old.gpu_statuses(cluster, {g.key: r.job_id for r in reservations for g in r.gpus},
                                        {e.key: tuple(e.reasons) for e in evictions})
            return old.render_page(facts, old.topology_svg(cluster.graph, statuses))
        cases.append((f"old page ({BASELINE_COMMIT})", old_page))
    results = {}
    for name, fn in cases:
        wall, cpu, out = timed(fn, args.repeat)
        results[name] = (statistics.median(wall), statistics.median(cpu), len(out))
    if args.inventory:
        with tempfile.TemporaryDirectory(prefix="page-render-") as tmp:
            wall, cpu, cluster_read = timed(inventory_case(args.hosts, Path(tmp)), max(1, args.repeat // 2))
            results["inventory from the ledger"] = (statistics.median(wall), statistics.median(cpu), 0)
            print(f"inventory: {len(cluster_read.hosts)} hosts, {len(cluster_read.gpus)} GPUs parsed from the ledger")
    base = results.get(f"old page ({BASELINE_COMMIT})")
    print(f"{'':26} {'wall p50 ms':>12} {'cpu p50 ms':>11} {'size KiB':>9} {'wall/old':>9} {'cpu/old':>8}")
    for name, (w, c, size) in results.items():
        ratios = (f"{w / base[0]:.2f}", f"{c / base[1]:.2f}") if base else ("-", "-")
        size_kib = f"{size / 1024:.0f}" if size else "-"
        print(f"{name:26} {w * 1e3:>12.0f} {c * 1e3:>11.0f} {size_kib:>9} {ratios[0]:>9} {ratios[1]:>8}")


if __name__ == "__main__":
    main()
