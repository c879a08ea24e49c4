"""A task's ledger writes in a fresh process: the CPU of each step, teams configured.

::

    python benchmarks/fresh_process_writes.py                      # 1,250 hosts, 5 repetitions
    python benchmarks/fresh_process_writes.py --hosts 250 --reps 3 --baseline HEAD~1

A SQLite ledger gets one stored collection of ``--hosts`` emulated 8-GPU hosts
(``Ledger.store_collection``, as a health check stores it) and a teams file of two teams. Then,
per repetition, a fresh child process does what a task of the operator does with the ledger, and
times each step in CPU seconds (``time.process_time``):

* ``imports``: the ledger and the inventory's modules;
* ``read``: the stored inventory (``Ledger.inventory()``);
* ``cluster``: the planner's cluster of it (``FreshInventory.cluster()``);
* ``reserve``: an 8-GPU reservation for a team's job;
* ``release``: its release, nobody waiting (what a task does when its training ends).

With ``--baseline REV`` each repetition runs a second child with the package at ``REV``
(``git archive``) on the same ledger, interleaved; medians of both print side by side with
their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEPS = ("imports", "read", "cluster", "reserve", "release")

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
t0 = time.process_time()
from airflow_hetero_gpu.collect.freshness import FreshInventory
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
t1 = time.process_time()
led = Ledger(sys.argv[2])
stored = led.inventory(None)
t2 = time.process_time()
cluster = FreshInventory(stored, 3600.0).cluster(None)
t3 = time.process_time()
led.reserve(sys.argv[3], cluster, PlanRequest(8), team="research")
t4 = time.process_time()
assert led.release(sys.argv[3])
t5 = time.process_time()
print(json.dumps({"imports": t1 - t0, "read": t2 - t1, "cluster": t3 - t2, "reserve": t4 - t3, "release": t5 - t4}))
"""

TEAMS = {"teams": {"research": {"quota": {"*": 64}}, "prod": {"quota": {"*": 64}}}}


def setup(url: str, hosts: int) -> None:
    from airflow_hetero_gpu.core.admission import teams_from_mapping
    from airflow_hetero_gpu.ledger import Ledger
    from airflow_hetero_gpu.ledger.inventory import HostRecord
    from airflow_hetero_gpu.testing.captures import host_files
    from airflow_hetero_gpu.testing.demo import small_hosts

    with Ledger.from_url(url) as led:
        led.store_collection([HostRecord(s.name, True, host_files(s)) for s in small_hosts(hosts, gpus=8)],
                             collector="benchmark")
        led.apply_teams(teams_from_mapping(TEAMS, "benchmark"))


def child(package_root: Path, url: str, job: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(package_root), url, job], check=True,
                         capture_output=True, text=True, cwd=package_root)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1250)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--baseline", metavar="REV", help="also time the package at this git revision (interleaved)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hetero-gpu-fresh-writes-") as tmp:
        url = f"sqlite:///{tmp}/ledger.db"
        setup(url, args.hosts)
        roots = {"this": ROOT}
        if args.baseline:
            import baseline
            roots["base"] = baseline.extract(args.baseline, Path(tmp) / "base")
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in roots}
        for rep in range(args.reps):
            for name, root in roots.items():
                runs[name].append(child(root, url, f"job-{name}-{rep}"))
    print(f"{args.hosts} hosts of 8 GPUs, teams configured, {args.reps} fresh processes each; CPU seconds, median")
    head = f"{'step':>8} {'this':>7}"
    if "base" in runs:
        head += f" {'base':>7} {'x base':>7}"
    print(head)
    for step in STEPS:
        mine = statistics.median(r[step] for r in runs["this"])
        line = f"{step:>8} {mine:>7.3f}"
        if "base" in runs:
            base = statistics.median(r[step] for r in runs["base"])
            line += f" {base:>7.3f} {mine / base if base else float('nan'):>7.2f}"
        print(line)
    if args.baseline:
        import baseline
        print(f"base: the package at {baseline.revision(args.baseline)}, in children interleaved with this one's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
