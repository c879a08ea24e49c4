"""``hetero-gpu check``: one health check of the fleet from the command line (cron, systemd).

What one poke of ``GpuHealthSensor`` does, without Airflow: collect every host, judge every GPU,
record evictions and readmissions in the ledger, store the collection as the fleet's inventory,
and (``--mode watch``, the default) replace evicted GPUs of running jobs::

    hetero-gpu check --ledger URL --hosts NAME=USER@HOST:PORT,... [--identity-file KEY]
                     [--known-hosts FILE] [--config cluster.yaml] [--topology topology.conf]
                     [--mode watch|gate [--min-healthy N --gpu-type T --task-type T]]
                     [--interval S [--count N]] [--sweep-orphans] [--json]

Exit status: 0 the check was recorded (gate mode: the gate is met); 2 bad input (one line on
stderr); 3 gate mode only: the gate is not met; 4 no host could be collected (nothing was judged
on fresh outputs). With ``--interval`` it checks every S seconds until stopped (SIGTERM or
Ctrl-C end it after the check in progress, exit 0) or ``--count`` checks were made; the exit
status is then the last check's.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any

from airflow_hetero_gpu.cli.exits import EXIT_NO_CAPACITY, EXIT_NOTHING_COLLECTED, EXIT_OK
from airflow_hetero_gpu.cli.argtypes import positive_int, positive_seconds
from airflow_hetero_gpu.errors import HeteroGpuError


def register(subparsers: Any) -> None:
    from airflow_hetero_gpu.cli.collect import add_host_args

    p = subparsers.add_parser(
        "check", help="one health check of the fleet: collect, judge, evict/readmit, store the inventory",
        description="Run one health check (what one GpuHealthSensor poke does): collect every host over SSH, "
                    "judge every GPU, record evictions and readmissions in the ledger, store the collection as "
                    "the fleet's inventory, replace evicted GPUs of running jobs (--mode watch). Exit 0: "
                    "recorded (gate met); 2: bad input; 3: gate not met; 4: no host could be collected.")
    add_host_args(p)
    p.add_argument("--ledger", required=True, metavar="URL", help="the ledger (created when missing)")
    p.add_argument("--mode", choices=("watch", "gate"), default="watch",
                   help="watch: also replace evicted GPUs of live reservations (default); gate: report "
                        "whether a pool has --min-healthy available GPUs")
    p.add_argument("--min-healthy", type=positive_int, default=1, metavar="N", help="gate: GPUs one pool must have")
    p.add_argument("--gpu-type", action="append", metavar="T", help="gate: acceptable card type (repeatable)")
    p.add_argument("--task-type", metavar="T", help="gate: training-task type the pool must support")
    p.add_argument("--sweep-orphans", action="store_true",
                   help="watch: stop, on every host, processes of jobs that hold no live reservation")
    p.add_argument("--interval", type=positive_seconds, metavar="S", help="check again every S seconds")
    p.add_argument("--count", type=positive_int, metavar="N", help="with --interval: stop after N checks")
    p.add_argument("--json", action="store_true", help="print each check's report as one JSON line")
    p.set_defaults(func=cmd_check)


def _spec(args: argparse.Namespace):
    from airflow_hetero_gpu.healthcheck import WatchSpec

    gpu_type = args.gpu_type[0] if args.gpu_type and len(args.gpu_type) == 1 else args.gpu_type
    return WatchSpec(mode_kind=args.mode, min_healthy=args.min_healthy, gpu_type=gpu_type,
                     task_type=args.task_type, stop_when_idle=False, sweep_orphans=args.sweep_orphans).validate()


def _lines(report) -> list[str]:
    lines = []
    for e in report.evicted:
        lines.append(f"evicted {e['host']}:{e['index']} ({', '.join(e['reasons'])}) uuid {e['uuid']} pool {e['pool']}")
    for e in report.readmitted:
        lines.append(f"readmitted {e['host']}:{e['index']} uuid {e['uuid']} pool {e['pool']}")
    for e in report.replacements:
        new = e["replacement"]
        lines.append(f"job {e['job_id']}: {e['host']}:{e['index']} " +
                     (f"replaced by {new['host']}:{new['index']}" if new else "has no replacement"))
    for o in report.orphans:
        lines.append(f"stopped {o['processes']} orphaned process(es) of job {o['job_id']} on {o['host']}")
    lines += [f"inventory change: {c}" for c in report.changes]
    gate = ""
    if report.gate is not None:
        gate = f"; gate {'met by pool ' + str(report.gate['pool']) if report.gate['met'] else 'not met'}"
    lines.append(f"check {report.number}: {report.collected} host(s) collected, {report.failed} failed; "
                 f"{len(report.unhealthy)} unhealthy GPU(s), {len(report.evicted_now)} evicted in the ledger, "
                 f"{len(report.live_jobs)} live reservation(s){gate}")
    return lines


def _status(report) -> int:
    if report.collected == 0:
        return EXIT_NOTHING_COLLECTED
    if report.gate is not None and not report.gate["met"]:
        return EXIT_NO_CAPACITY
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    import logging

    from airflow_hetero_gpu.cli.collect import collector_from_args
    from airflow_hetero_gpu.healthcheck import HealthWatch
    from airflow_hetero_gpu.healthcheck.check import collector_name
    from airflow_hetero_gpu.healthcheck.metrics import silent_metrics
    from airflow_hetero_gpu.ledger import Ledger

    if args.count is not None and args.interval is None:
        raise HeteroGpuError("--count goes with --interval")
    spec = _spec(args)
    # between checks the SSH connections stay open
    collector = collector_from_args(args, None, keep_connections=args.interval is not None)
    Ledger.from_url(args.ledger).close()  # a writer: created or upgraded now, before any SSH
    quiet = logging.getLogger("airflow_hetero_gpu.check.cli")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    watch = HealthWatch(spec, collector, args.ledger, log=quiet, metrics=silent_metrics(),
                        collector=collector_name("hetero-gpu check"))
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)} \
        if args.interval is not None else {}
    status = EXIT_OK
    try:
        while True:
            report = watch.check()
            status = _status(report)
            if args.json:
                print(json.dumps(_json(report)), flush=True)
            else:
                print("\n".join(_lines(report)), flush=True)
            if args.interval is None or stop.is_set() or (args.count is not None and watch.checks >= args.count):
                break
            pause = watch.until_next(args.interval)
            if pause == 0:
                print(f"hetero-gpu check: check {watch.checks} took longer than --interval {args.interval:g}s; "
                      "the next one starts now", file=sys.stderr, flush=True)
            if stop.wait(pause):
                break
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        collector.close()  # the kept connections (and the worker processes of a large fleet)
    return status


def _json(report) -> dict[str, Any]:
    return {"check": report.number, "collected": report.collected, "failed": report.failed,
            "evicted": report.evicted, "readmitted": report.readmitted, "replacements": report.replacements,
            "orphans": report.orphans, "unhealthy": report.unhealthy, "evicted_now": report.evicted_now,
            "live_reservations": report.live_jobs, "pools": report.pools, "gate": report.gate,
            "changes": report.changes}
