"""``hetero-gpu simulate``: replay a job trace on a cluster under several placement policies.

    hetero-gpu simulate --trace alibaba:multigpu50 --out docs/img --sweep

prints the policy table (or ``--json``: the report), and with ``--out DIR`` writes
``report.json`` and the PNG plots there. Bad input raises
:class:`~airflow_hetero_gpu.errors.HeteroGpuError` (one line naming the file, column or value).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

from airflow_hetero_gpu.cli.exits import EXIT_OK
from airflow_hetero_gpu.cli.argtypes import non_negative_float, non_negative_int, positive_int
from airflow_hetero_gpu.core.admission.defaults import (
    DEFAULT_AGING_INTERVAL_S, DEFAULT_MIN_RUNTIME_S, DEFAULT_PREEMPTION_DELAY_S, DEFAULT_PREEMPTION_GRACE_S,
)
from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.sim import QUEUES

DEFAULT_POLICIES = "seed,random,first-fit,best-fit,topology-only,fgd"
DEFAULT_LOAD = 1.25
DEFAULT_COMM_COST = 0.05


def _positive(text: str) -> float:
    v = non_negative_float(text)
    if v == 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text!r}")
    return v


def _weights(text: str) -> dict[str, float]:
    parts = text.split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected W1,W2,W3[,W4] (numbers), got {text!r}") from None
    if len(values) not in (3, 4):
        raise argparse.ArgumentTypeError(f"expected three or four weights W1,W2,W3[,W4], got {text!r}")
    # three: SPEC §7's w1, w2, w3 with w4 (free blocks) at its default
    return dict(zip(("load_balance", "fragmentation", "topology", "free_blocks"), values))


def register(subparsers) -> None:
    """Add ``simulate`` to ``hetero-gpu``'s sub-parsers."""
    p = subparsers.add_parser(
        "simulate", help="replay a job trace under several placement policies (seed and baselines)",
        description="Trace-driven simulation of whole-GPU gang jobs: the product's admission queue (or a "
                    "FIFO or greedy baseline), each policy on the same trace and cluster. See docs/simulation.md.")
    p.add_argument("--trace", required=True, metavar="PATH|alibaba:NAME",
                   help="a job CSV (job_id,arrival_s,duration_s,gpus[,gpu_type]) or an Alibaba "
                        "cluster-trace-gpu-v2023 pod list, e.g. alibaba:multigpu50")
    p.add_argument("--nodes", metavar="PATH",
                   help="node list (sn,gpu,model[,topo]); default for Alibaba traces: their GPU node list")
    p.add_argument("--alibaba-dir", metavar="DIR", help="folder of the Alibaba CSVs (see docs/simulation.md)")
    p.add_argument("--policies", default=DEFAULT_POLICIES, metavar="P1,P2,...",
                   help=f"policies to compare (default: {DEFAULT_POLICIES})")
    p.add_argument("--weights", type=_weights, metavar="W1,W2,W3[,W4]",
                   help="evaluation weights of the seed (load balance, fragmentation, topology, free "
                        "blocks; default: cluster.yaml's defaults 0.1,-0.2,0.5,0.2; W4 left out: 0.2)")
    p.add_argument("--sweep", nargs="?", const="", default=None, metavar="GRID",
                   help="also run the seed over a weight grid; GRID like 'w1=0,0.3;w2=-0.2;w3=0.5,1;w4=0,0.2' "
                        "(default grid without GRID)")
    p.add_argument("--fractional", choices=("round-up", "drop"), default="round-up",
                   help="one-GPU pods asking for a GPU share: round up to a whole GPU (default) or drop")
    p.add_argument("--limit", type=positive_int, metavar="N", help="only the first N jobs by arrival")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--load", type=_positive, default=DEFAULT_LOAD, metavar="RHO",
                      help=f"compress arrivals to this offered load (default {DEFAULT_LOAD}; see docs)")
    load.add_argument("--time-scale", type=_positive, metavar="C", help="divide arrival times by C instead")
    p.add_argument("--queue", choices=QUEUES, default="admission",
                   help="admission: the product's queue (priority with aging, claims for the heads, backfill "
                        "outside them; default); fifo: first in, first out (see --backfill); greedy: every "
                        "waiting job that fits starts, in arrival order (the product before its queue)")
    p.add_argument("--aging", type=non_negative_float, default=DEFAULT_AGING_INTERVAL_S, metavar="S",
                   help=f"admission queue: seconds of waiting worth one priority level (default "
                        f"{DEFAULT_AGING_INTERVAL_S:g}; 0: no aging)")
    p.add_argument("--backfill", type=non_negative_int, default=0, metavar="N",
                   help="fifo queue: when the head waits, try up to N jobs behind it (default 0: strict FIFO)")
    p.add_argument("--preemption", choices=("on", "off"), default=None,
                   help="admission queue: a waiting job may preempt running jobs of lower priority "
                        "(docs/preemption.md; default: on when the trace has priorities)")
    p.add_argument("--preemption-grace", type=non_negative_float, default=DEFAULT_PREEMPTION_GRACE_S, metavar="S",
                   help=f"seconds a victim keeps its GPUs after the signal (default {DEFAULT_PREEMPTION_GRACE_S:g})")
    p.add_argument("--min-runtime", type=non_negative_float, default=DEFAULT_MIN_RUNTIME_S, metavar="S",
                   help=f"never preempt a job that ran less than S since it (re)started (default "
                        f"{DEFAULT_MIN_RUNTIME_S:g})")
    p.add_argument("--preemption-delay", type=non_negative_float, default=DEFAULT_PREEMPTION_DELAY_S, metavar="S",
                   help=f"never preempt for a job that waited less than S (default {DEFAULT_PREEMPTION_DELAY_S:g})")
    p.add_argument("--jobs-out", metavar="FILE",
                   help="write one CSV line per job (job_id,team,priority,gpus,arrival_s,start_s,end_s,"
                        "preemptions,lost_gpu_s); one policy only")
    p.add_argument("--events-out", metavar="FILE",
                   help="write one CSV line per start, end, preempt and stop (time_s,event,job_id,gpus,detail); "
                        "one policy only")
    p.add_argument("--comm-cost", type=non_negative_float, default=DEFAULT_COMM_COST, metavar="C",
                   help=f"run-time slowdown per unit of d(S) above 1 (default {DEFAULT_COMM_COST}; 0: trace durations)")
    p.add_argument("--span", choices=("as-needed", "never"), default="as-needed",
                   help="as-needed: a gang spans hosts when no host holds it (SPEC §7.1, default); "
                        "never: a job that fits a host waits for one")
    p.add_argument("--hosts-per-leaf", type=positive_int, default=16, metavar="N")
    p.add_argument("--leaves-per-spine", type=positive_int, default=16, metavar="N")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of drawn times and of the random policy")
    p.add_argument("--workers", type=positive_int, metavar="N", help="worker processes (default: CPU count)")
    p.add_argument("--out", metavar="DIR", help="write report.json and PNG plots into DIR")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of tables")
    p.add_argument("--teams", metavar="FILE",
                   help="team quotas (the file `hetero-gpu teams apply` takes; docs/teams.md); admission queue only")
    p.set_defaults(func=cmd_simulate)


def _read_teams(path: str, cluster):
    """The teams file, checked against the simulated fleet's card types (one-line errors)."""
    from airflow_hetero_gpu.core.admission.teams import read_teams_file

    teams = read_teams_file(path)
    teams.check_fleet([g.name for g in cluster.gpus], path)
    return teams


def cmd_simulate(args) -> int:
    from airflow_hetero_gpu.core.config import Weights
    from airflow_hetero_gpu.sim.experiment import (
        RunSpec, Setup, direction, grid_points, parse_grid, run_many, sweep_specs,
    )
    from airflow_hetero_gpu.sim.fleet import build_fleet, read_nodes
    from airflow_hetero_gpu.sim.policies import POLICY_NAMES
    from airflow_hetero_gpu.sim.report import build_report, render_text
    from airflow_hetero_gpu.sim.sources import load_trace, resolve_nodes
    from airflow_hetero_gpu.sim.trace import compress, offered_load, time_scale_for_load

    started = time.perf_counter()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICY_NAMES]
    if unknown or not policies:
        raise HeteroGpuError(f"--policies: unknown policy {unknown[0] if unknown else args.policies!r} "
                             f"(known: {', '.join(POLICY_NAMES)})")
    if len(set(policies)) != len(policies):
        raise HeteroGpuError(f"--policies: a policy is listed twice in {args.policies!r}")
    grid = parse_grid(args.sweep) if args.sweep is not None else None
    if args.backfill and args.queue != "fifo":
        raise HeteroGpuError(f"--backfill {args.backfill}: only with --queue fifo (the admission and greedy "
                             f"queues try every waiting job), got --queue {args.queue}")
    aging = args.aging or None
    if args.teams and args.queue != "admission":
        raise HeteroGpuError(f"--teams {args.teams}: only the admission queue applies quotas, got --queue {args.queue}")
    outputs = [o for o in ("jobs_out", "events_out") if getattr(args, o)]
    if outputs and (len(policies) != 1 or grid is not None):
        raise HeteroGpuError(f"--{outputs[0].replace('_', '-')}: writes the jobs of one run; give one policy "
                             f"(--policies seed) and no --sweep, got --policies {args.policies}")
    if args.preemption == "on" and args.queue != "admission":
        raise HeteroGpuError(f"--preemption on: only the admission queue preempts, got --queue {args.queue}")

    trace = load_trace(args.trace, fractional=args.fractional, seed=args.seed, directory=args.alibaba_dir)
    nodes_path = resolve_nodes(args.nodes, args.trace, args.alibaba_dir)
    nodes = read_nodes(nodes_path)
    fleet = build_fleet(nodes, hosts_per_leaf=args.hosts_per_leaf, leaves_per_spine=args.leaves_per_spine,
                        source=str(nodes_path))
    total = fleet.total_gpus
    teams = _read_teams(args.teams, fleet.cluster) if args.teams else None
    scale = args.time_scale if args.time_scale else time_scale_for_load(trace.jobs, total, args.load)
    trace = compress(trace, scale).limited(args.limit)
    last_arrival = trace.jobs[-1].arrival if trace.jobs else 0.0
    # plots show the busy window: from the 1st-percentile arrival to twice the last arrival
    since = trace.jobs[int(0.01 * (len(trace.jobs) - 1))].arrival if trace.jobs else None

    preemption = _preemption(args, trace.jobs)
    setup = Setup(tuple(nodes), tuple(trace.jobs), hosts_per_leaf=args.hosts_per_leaf,
                  leaves_per_spine=args.leaves_per_spine, queue=args.queue, aging_interval_s=aging,
                  backfill=args.backfill, comm_cost=args.comm_cost,
                  span=args.span, seed=args.seed, series_since=since,
                  series_until=2.0 * last_arrival if last_arrival > 0 else None, teams=teams,
                  preemption=preemption, keep_records=bool(outputs))
    specs = [RunSpec(p, args.weights if p.startswith("seed") else None) for p in policies]
    sweep_runs, sweep_index, points = [], [], []
    if grid is not None:
        points = grid_points(grid)
        sweep_runs, sweep_index = sweep_specs(points)
    # the sweep point with the seed's own weights is the seed run of the table: run it once
    reuse = None
    if "seed" in policies and sweep_runs:
        seed_dir = direction(args.weights or Weights().model_dump())
        reuse = next((i for i, r in enumerate(sweep_runs) if direction(r.weights) == seed_dir), None)
    todo = [r for i, r in enumerate(sweep_runs) if i != reuse]
    outcomes = run_many(setup, [*specs, *todo], args.workers)
    runs, swept = outcomes[:len(specs)], list(outcomes[len(specs):])
    if reuse is not None:
        swept.insert(reuse, runs[policies.index("seed")])

    trace_info = {
        "source": trace.source, "jobs": len(trace.jobs), "notes": trace.notes, "counts": trace.counts,
        "gpu_counts": {str(k): v for k, v in trace.gpu_count_histogram().items()},
        "multi_gpu_jobs": sum(1 for j in trace.jobs if j.gpus > 1),
        "constrained_jobs": sum(1 for j in trace.jobs if j.gpu_types),
        "time_scale": scale, "offered_load": offered_load(trace.jobs, total, 1.0),
        "last_arrival_s": last_arrival,
    }
    settings = {"policies": policies, "seed_weights": args.weights, "queue": args.queue,
                "aging_interval_s": aging if args.queue == "admission" else None, "backfill": args.backfill,
                "comm_cost": args.comm_cost, "span": args.span, "fractional": args.fractional,
                "limit": args.limit, "seed": args.seed, "load": None if args.time_scale else args.load,
                "preemption": None if preemption is None else {
                    "grace_s": preemption.grace_s, "min_runtime_s": preemption.rules.min_runtime_s,
                    "delay_s": preemption.rules.delay_s},
                **({"teams": teams.to_json()} if teams else {})}
    argv = sys.argv[1:] if sys.argv and Path(sys.argv[0]).name.startswith("hetero-gpu") else None
    command = "hetero-gpu " + (shlex.join(argv) if argv else f"simulate --trace {args.trace}")
    report = build_report(command=command, trace=trace_info, cluster=fleet.describe(), settings=settings,
                          runs=runs, sweep=[(p, swept[i]) for p, i in zip(points, sweep_index)],
                          runtime_s=time.perf_counter() - started)
    if args.out:
        from airflow_hetero_gpu.sim.plots import write_plots

        out = Path(args.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
            files = write_plots(report, runs, out)
            report["plots"] = [f.name for f in files]
            report["runtime_s"] = round(time.perf_counter() - started, 1)
            (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        except OSError as err:
            raise HeteroGpuError(f"--out {args.out}: cannot write: {err}") from None
    if args.jobs_out:
        from airflow_hetero_gpu.core.admission.quota import DEFAULT_TEAM
        from airflow_hetero_gpu.sim.jobs_out import write_jobs

        # a job of no team is the default team's, as in the quotas and metrics.by_team
        write_jobs(args.jobs_out, [dataclasses.replace(r, team=r.team or DEFAULT_TEAM) for r in runs[0].records])
    if args.events_out:
        from airflow_hetero_gpu.sim.events_out import write_events

        write_events(args.events_out, runs[0].events)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(render_text(report))
        if args.out:
            print(f"report and plots written to {args.out}")
    return EXIT_OK


def _preemption(args, jobs):
    """The simulator's preemption settings: ``--preemption``, default on when the trace has
    priorities (two or more distinct ones), only with the admission queue."""
    from airflow_hetero_gpu.core.admission.preemption import PreemptionRules
    from airflow_hetero_gpu.sim.preempt import SimPreemption

    on = args.preemption == "on" if args.preemption else (
        args.queue == "admission" and len({j.priority for j in jobs}) > 1)
    if not on:
        return None
    rules = PreemptionRules(min_runtime_s=args.min_runtime, delay_s=args.preemption_delay)
    return SimPreemption(rules, args.preemption_grace)


def main(argv=None) -> int:
    """``hetero-gpu simulate ...`` without the rest of the command line (tests, scripts)."""
    parser = argparse.ArgumentParser(prog="hetero-gpu")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HeteroGpuError as err:
        print(f"simulate: error: {err}", file=sys.stderr)
        return 2
