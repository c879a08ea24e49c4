"""A day of the whole system, shortened: the real deployment at fleet size on this machine.

::

    python benchmarks/fleet_day.py                                   # 1,250 hosts, 10 min of stream
    python benchmarks/fleet_day.py --hosts 200 --minutes 3 --rate 6 --watch-interval 20 --contended 2 --lease 60 --out day.json

The engine is :mod:`airflow_hetero_gpu.testing.fleet_day` (``tests/test_fleet_day.py`` runs a
smaller day through it and asserts its invariants): an embedded emulated fleet of ``--hosts``
8-GPU hosts (four platforms, NVLink domains, MIG on a few), PostgreSQL (Airflow's metadata and
the ledger), Redis, Airflow with the CeleryExecutor as separate processes (api-server,
scheduler, dag-processor, triggerer, two Celery workers), the health watch DAG checking the
whole fleet every ``--watch-interval`` seconds, a stream of training runs triggered through the
REST API at ``--rate`` a minute for ``--minutes`` (1-16 GPUs, three teams with quotas, two
priorities, preemption on) and four faults on the way (Xid 79 and an uncorrectable ECC error on
GPUs jobs hold, a host that stops answering, the same host coming back).

Printed: runs and their states, task start (execute() to the job running) p50/p99, the health
checks' duration, fault to eviction, admission passes per minute and their p99, GPUs held twice,
reservations and queue entries left, orphaned processes, and the CPU of the provider's and
Airflow's processes beside PostgreSQL's, Redis's and the emulated fleet's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from airflow_hetero_gpu.testing.fleet_day import DayConfig, run_day  # noqa: PLC0415
    from airflow_hetero_gpu.testing.fleet_day_report import render  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=1250, help="emulated 8-GPU hosts (default 1250)")
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of the training stream (default 10)")
    parser.add_argument("--rate", type=float, default=12.0, help="training runs triggered a minute (default 12)")
    parser.add_argument("--watch-interval", type=float, default=60.0, help="seconds between health checks (60)")
    parser.add_argument("--concurrency", type=int, default=8, help="task slots of each Celery worker (8)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-faults", action="store_true", help="inject no fault")
    parser.add_argument("--contended", type=int, default=0, metavar="N",
                        help="leave N RTX 4090 hosts open, drain the others, and open the stream with a burst "
                             "on them that makes quotas and preemption act (testing/fleet_day_contention.py)")
    parser.add_argument("--lease", type=float, default=120.0, help="the training tasks' lease_seconds (120)")
    parser.add_argument("--keep", metavar="DIR", help="run in DIR and keep it (logs, ledger dumps)")
    parser.add_argument("--out", metavar="FILE", help="write the report as JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    cfg = DayConfig(hosts=args.hosts, minutes=args.minutes, rate=args.rate, watch_interval=args.watch_interval,
                    concurrency=args.concurrency, seed=args.seed, faults=not args.no_faults,
                    contended_hosts=args.contended, lease_seconds=args.lease,
                    root=Path(args.keep) if args.keep else None, keep=bool(args.keep))
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start", flush=True)
    result = run_day(cfg, log=lambda line: print(line, flush=True))
    print(render(result))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
