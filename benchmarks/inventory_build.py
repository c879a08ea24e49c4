"""A task's read of the stored inventory and the build of its cluster, in a process with Airflow loaded.

Every task of ``HeteroTrainOperator`` reads the ledger's stored inventory of the fleet and builds
its cluster before it plans (``FreshInventory``); every process's first admission pass builds the
queue's cluster (``ClusterCache``); a health check judges its parts on the same builders. These
make a few hundred thousand long-lived objects, and the cyclic garbage collector scanned the
growing heap again and again while they were made; it is now paused for the build
(:mod:`airflow_hetero_gpu.interpreter`).

A SQLite ledger holds one collection of ``--hosts`` emulated hosts of 8 GPUs. The process first
imports the operator's module (Airflow with it), as a task process has. Then ``--repeat`` times:

* ``read``: ``Ledger.inventory(hosts)``: the stored rows (their outputs and parsed facts);
* ``build``: ``FreshInventory(...).cluster()``: the outputs parsed and the cluster built;
* ``cache``: a fresh ``ClusterCache`` builds the queue's cluster (what a process's first pass does).

Printed: the CPU median and min of each, in ms; with ``--baseline REV`` the same run of the
package at ``REV`` in a subprocess of this run, and the ratio of the medians, base / this.

    python benchmarks/inventory_build.py [--hosts 1250] [--repeat 9] [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def measure(hosts: int, repeat: int) -> dict:
    import airflow_hetero_gpu
    import airflow_hetero_gpu.operators.hetero_train  # noqa: F401 - a task process's modules, Airflow with them
    from airflow_hetero_gpu.collect.freshness import FreshInventory
    from airflow_hetero_gpu.ledger import Ledger
    from airflow_hetero_gpu.ledger.admission import ClusterCache
    from airflow_hetero_gpu.ledger.inventory import HostRecord
    from airflow_hetero_gpu.testing.captures import host_files
    from airflow_hetero_gpu.testing.demo import small_hosts

    specs = small_hosts(hosts, gpus=8)
    names = [s.name for s in specs]
    times: dict[str, list[float]] = {"read": [], "build": [], "cache": []}
    gpus = 0
    with tempfile.TemporaryDirectory() as tmp, Ledger.from_url(f"sqlite:///{Path(tmp) / 'ledger.db'}") as led:
        led.store_collection([HostRecord(s.name, True, host_files(s)) for s in specs], collector="benchmark")
        for _ in range(repeat):
            t0 = time.process_time()
            stored = led.inventory(names)
            t1 = time.process_time()
            cluster = FreshInventory(stored, 3600).cluster(None)
            t2 = time.process_time()
            with led.db.read("benchmark") as uow:
                t3 = time.process_time()
                cached = ClusterCache().get(uow.conn, uow.now)
                t4 = time.process_time()
            times["read"].append(t1 - t0)
            times["build"].append(t2 - t1)
            times["cache"].append(t4 - t3)
            gpus = len(cluster.gpus)
            assert cached is not None and len(cached.gpus) == gpus
            del stored, cluster, cached
    return {"package": airflow_hetero_gpu.__file__, "gpus": gpus,
            **{k: {"median": statistics.median(v) * 1e3, "min": min(v) * 1e3} for k, v in times.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1250)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--baseline", metavar="REV", help="also time the package at this git revision (same run)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # baseline runs
    args = ap.parse_args(argv)
    this = measure(args.hosts, args.repeat)
    if args.json:
        print(json.dumps(this))
        return 0
    base = None
    if args.baseline:
        import baseline

        base = baseline.run(args.baseline, __file__, ["--hosts", str(args.hosts), "--repeat", str(args.repeat)])
        assert base["package"] != this["package"], "the baseline ran the same package"
    print(f"python {platform.python_version()} on {platform.machine()}, {args.hosts} hosts ({this['gpus']} GPUs), "
          f"Airflow loaded, {args.repeat} repeats; CPU ms")
    head = f"{'':>6}  {'median':>8}  {'min':>8}"
    if base:
        head += f"  {'base median':>11}  {'base min':>8}  {'base/this':>9}"
    print(head)
    for k in ("read", "build", "cache"):
        row = f"{k:>6}  {this[k]['median']:8.1f}  {this[k]['min']:8.1f}"
        if base:
            row += f"  {base[k]['median']:11.1f}  {base[k]['min']:8.1f}  {base[k]['median'] / this[k]['median']:9.2f}"
        print(row)
    if base:
        print(f"base: the package at {baseline.revision(args.baseline)}, timed in a subprocess of this run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
