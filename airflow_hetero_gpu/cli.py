"""``hetero-gpu``: the command line of SPEC §10.

Exit status: 0 placed (or done), 3 no pool can host the job now, 2 bad input with a one-line
message on stderr naming the file, key or value.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from airflow_hetero_gpu import __version__
from airflow_hetero_gpu.cli_types import mib, non_negative_float, positive_int
from airflow_hetero_gpu.errors import HeteroGpuError

EXIT_OK, EXIT_BAD_INPUT, EXIT_NO_CAPACITY = 0, 2, 3


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {' '.join(message.split())}\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain left-aligned text table."""
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(list(headers)), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _load(args):
    from airflow_hetero_gpu.core.inventory import XidRule, load_cluster

    rule = None if args.xid_window is None else XidRule.offline(args.xid_window)
    return load_cluster(args.captures, args.config, xid_rule=rule)


def _ledger_state(args):
    """Reservations and evictions of the ledger named by ``--ledger`` (empty without one)."""
    if not getattr(args, "ledger", None):
        return {}, {}
    from airflow_hetero_gpu.ledger import Ledger

    with Ledger.from_url(args.ledger) as ledger:  # reserved_map() counts live leases only
        return ledger.reserved_map(), ledger.evicted_map()


# --- inventory --------------------------------------------------------------------------------
def cmd_inventory(args) -> int:
    cluster = _load(args)
    if args.json:
        print(json.dumps([g.to_json() for g in cluster.gpus], indent=2))
        return EXIT_OK
    rows = [
        (g.host, g.index, g.name, g.uuid, _fmt(g.memory_total_mib, 0), _fmt(g.memory_used_mib, 0),
         _fmt(g.utilization, 2), _fmt(g.temperature_c, 0), _fmt(g.power_w, 1), _fmt(g.base_load, 2),
         "yes" if g.healthy else "no", ",".join(g.reasons))
        for g in cluster.gpus
    ]
    print(table(["HOST", "IDX", "NAME", "UUID", "MEM MiB", "USED MiB", "UTIL", "TEMP C", "POWER W",
                 "LOAD", "HEALTHY", "REASONS"], rows))
    _print_host_problems(cluster)
    return EXIT_OK


def _print_host_problems(cluster) -> None:
    for host, err in sorted(cluster.host_errors.items()):
        print(f"host {host}: collection failed: {err}")
    for host, notes in sorted(cluster.host_notes.items()):
        for note in notes:
            print(f"host {host}: {note}")


# --- pools ------------------------------------------------------------------------------------
def cmd_pools(args) -> int:
    from airflow_hetero_gpu.core.model import PlanRequest
    from airflow_hetero_gpu.core.planner import cluster_state

    cluster = _load(args)
    reserved, evicted = _ledger_state(args)
    state = cluster_state(cluster, PlanRequest(1), reserved, evicted)
    out = []
    for p in cluster.pools:
        pos = p.positions
        hosts = sorted({cluster.gpus[int(i)].host for i in pos})
        out.append({
            "pool": p.id, "card_type": p.card_type, "task_types": list(p.task_types),
            "gpus": len(pos), "healthy": int(state.healthy[pos].sum()),
            "available": int(state.available[pos].sum()), "hosts": hosts,
        })
    if args.json:
        print(json.dumps(out, indent=2))
        return EXIT_OK
    print(table(["POOL", "CARD TYPE", "TASK TYPES", "GPUS", "HEALTHY", "AVAILABLE", "HOSTS"],
                [(o["pool"], o["card_type"], ",".join(o["task_types"]), o["gpus"], o["healthy"],
                  o["available"], ",".join(o["hosts"])) for o in out]))
    _print_host_problems(cluster)
    return EXIT_OK


# --- plan -------------------------------------------------------------------------------------
def render_plan(result) -> str:
    """The readable form of a plan: the decision, every pool with stage/reason/score, the sick."""
    req = result.request
    lines = [
        "request: {} GPU{}{}{}{}".format(
            req.gpus, "s" if req.gpus > 1 else "",
            f", card type {' or '.join(req.gpu_types)}" if req.gpu_types else "",
            f", task type {req.task_type}" if req.task_type else "",
            f", {req.gpu_memory_mib:g} MiB free each" if req.gpu_memory_mib else "",
        )
    ]
    d = result.decision
    if d is None:
        lines.append("decision: no pool can host the job now")
    else:
        by_host: dict[str, list[str]] = {}
        for g in d.gpus:
            by_host.setdefault(g.host, []).append(str(g.index))
        where = "; ".join(f"{h} GPU {','.join(ix)}" for h, ix in by_host.items())
        s = d.score
        lines.append(f"decision: pool {d.pool!r} -> {where}")
        lines.append(
            f"          E = {s.total:.4f}  (load balance {s.load_balance:.4f}, fragmentation "
            f"{s.fragmentation:.4f}, topology {s.topology:.4f}, free blocks {_fmt(s.free_blocks, 4)}; "
            f"mean distance {d.mean_distance:.4g})"
        )
    lines.append("")
    rows = []
    for p in result.pools:
        sc = p.score
        rows.append((p.pool, p.stage, p.gpus, p.healthy, p.available,
                     _fmt(sc.load_balance if sc else None), _fmt(sc.fragmentation if sc else None),
                     _fmt(sc.topology if sc else None), _fmt(sc.free_blocks if sc else None),
                     _fmt(sc.total if sc else None), p.reason or ""))
    lines.append(table(["POOL", "STAGE", "GPUS", "HEALTHY", "AVAIL", "LB", "FR", "TS", "FB", "E", "REASON"], rows))
    if result.unhealthy:
        lines.append("")
        lines.append("unhealthy: " + ", ".join(f"{g.host} GPU{g.index} ({'+'.join(g.reasons)})" for g in result.unhealthy))
    for host, err in sorted(result.host_errors.items()):
        lines.append(f"host {host}: collection failed: {err}")
    return "\n".join(lines)


def cmd_plan(args) -> int:
    from airflow_hetero_gpu.core.model import PlanRequest
    from airflow_hetero_gpu.core.planner import plan

    if args.reserve and not (args.job_id and args.ledger):
        raise HeteroGpuError("plan --reserve needs --job-id ID and --ledger URL")
    if args.job_id and not args.reserve:
        raise HeteroGpuError("--job-id is only used with --reserve")
    gpu_type = args.gpu_type[0] if args.gpu_type and len(args.gpu_type) == 1 else (tuple(args.gpu_type) if args.gpu_type else None)
    request = PlanRequest(args.gpus, gpu_type, args.task_type, args.gpu_memory)
    cluster = _load(args)
    if args.reserve:
        from airflow_hetero_gpu.ledger.cli import reserve_for_cli

        result = reserve_for_cli(args.ledger, args.job_id, cluster, request, cluster.config,
                                 lease_seconds=args.lease)
    else:
        reserved, evicted = _ledger_state(args)
        result = plan(cluster, request, reserved=reserved, evicted=evicted)
    if args.json:
        out = result.to_json()
        if args.reserve:
            out["reservation"] = {"job_id": args.job_id, "reserved": result.decision is not None}
        print(json.dumps(out, indent=2))
    else:
        print(render_plan(result))
        if args.reserve and result.decision is not None:
            print(f"\nreserved for job {args.job_id!r} in the ledger")
    return EXIT_OK if result.decision is not None else EXIT_NO_CAPACITY


# --- parser -----------------------------------------------------------------------------------
def _captures_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--captures", required=True, metavar="DIR", help="capture directory (SPEC §2)")
    p.add_argument("--config", metavar="FILE", help="cluster.yaml (default: DIR/cluster.yaml when present)")
    p.add_argument("--xid-window", type=non_negative_float, metavar="SECONDS",
                   help="count a kernel-log Xid line of DIR when logged within SECONDS of the capture "
                        "(default: cluster.yaml's thresholds.xid_window_s, 3600; 0: no Xid line counts)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hetero-gpu", description=(
        "Place distributed training on a heterogeneous GPU cluster: inventory, candidate pools, "
        "the evaluation of load balance, fragmentation and topology, and reservations."))
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("inventory", help="one row per GPU with health")
    _captures_args(p)
    p.set_defaults(func=cmd_inventory)

    p = sub.add_parser("pools", help="the candidate pools")
    _captures_args(p)
    p.add_argument("--ledger", metavar="URL", help="ledger whose reservations and evictions to apply")
    p.set_defaults(func=cmd_pools)

    p = sub.add_parser("plan", help="choose the scheduling pool and its GPUs (steps S3-S8)")
    _captures_args(p)
    p.add_argument("--gpus", required=True, type=positive_int, metavar="K", help="number of GPUs")
    p.add_argument("--gpu-type", action="append", metavar="T",
                   help="acceptable card type (repeat for several; glob patterns allowed)")
    p.add_argument("--task-type", metavar="T", help="training-task type the pool must support")
    p.add_argument("--gpu-memory", type=mib, metavar="MIB", help="free memory needed on each GPU")
    p.add_argument("--ledger", metavar="URL", help="ledger database URL (reservations, evictions)")
    p.add_argument("--reserve", action="store_true", help="claim the chosen GPUs in the ledger")
    p.add_argument("--job-id", metavar="ID", help="job id of the reservation (with --reserve)")
    p.add_argument("--lease", type=positive_int, default=600, metavar="SECONDS",
                   help="lease of the reservation (with --reserve; default 600): it is freed when the "
                        "lease runs out unless renewed, or at once with `hetero-gpu release`")
    p.set_defaults(func=cmd_plan)

    for register in _extra_commands():
        register(sub)
    return parser


def _extra_commands():
    """Sub-commands that live beside their subsystem (collection, ledger, simulator)."""
    from airflow_hetero_gpu.collect.cli import register as collect_register
    from airflow_hetero_gpu.ledger.cli import register as ledger_register
    from airflow_hetero_gpu.sim.cli import register as simulate_register

    return [collect_register, ledger_register, simulate_register]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HeteroGpuError as err:
        print(f"hetero-gpu {args.command}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
