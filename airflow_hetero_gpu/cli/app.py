"""``hetero-gpu``: the command line of SPEC §10.

Exit status: 0 placed (or done), 3 no pool can host the job now, 2 bad input with a one-line
message on stderr naming the file, key or value (also a request the fleet can never serve: a card
or task type it lacks, more GPUs than every matching pool has). The commands are listed in the
order of :mod:`airflow_hetero_gpu.cli.guide`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from airflow_hetero_gpu import __version__
from airflow_hetero_gpu.cli.argtypes import job_id as job_id_arg, mib, non_negative_float, positive_int, team_name
from airflow_hetero_gpu.cli.exits import EXIT_BAD_INPUT, EXIT_NO_CAPACITY, EXIT_OK
from airflow_hetero_gpu.cli.guide import EPILOG, arrange
from airflow_hetero_gpu.text import fmt, render_plan, table
from airflow_hetero_gpu.errors import HeteroGpuError, RequestError



class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {' '.join(message.split())}\n")


def _load(args):
    """The cluster: from ``--captures DIR``, else from the inventory of ``--ledger URL``."""
    from airflow_hetero_gpu.core.inventory import XidRule, load_cluster

    if args.captures:
        # a capture directory's Xid lines count when recent (--xid-window, cluster.yaml's
        # thresholds.xid_window_s); a --ledger adds its evictions on top
        rule = None if args.xid_window is None else XidRule.offline(args.xid_window)
        return load_cluster(args.captures, args.config, xid_rule=rule)
    if not getattr(args, "ledger", None):
        raise HeteroGpuError("give --ledger URL (the ledger `hetero-gpu check` or `collect` filled) or --captures DIR "
                             "(a capture directory); without them the command line opens the tasks' ledger, "
                             "[hetero_gpu] ledger_url, and none is set")
    from airflow_hetero_gpu.collect.freshness import FreshInventory
    from airflow_hetero_gpu.core.config import load_config
    from airflow_hetero_gpu.ledger import Ledger
    from airflow_hetero_gpu.ledger.base import FILL_WITH

    with Ledger.open_existing(args.ledger) as ledger:
        stored = ledger.inventory()
    if not stored.hosts:
        raise HeteroGpuError(f"ledger {ledger.display_url} holds no inventory: {FILL_WITH}")
    fresh = FreshInventory(stored, args.max_age if args.max_age is not None else float("inf"))
    args.inventory_ages = stored.ages()  # for plan's warning on an old inventory
    if not args.json:
        print(fresh.describe())
    return fresh.cluster(load_config(args.config) if args.config else None)


def _ledger_state(args):
    """Reservations, evictions and drained hosts of the ledger named by ``--ledger`` (empty
    without one); the drains are printed (unless ``--json``)."""
    if not getattr(args, "ledger", None):
        return {}, {}, {}
    from airflow_hetero_gpu.ledger import Ledger
    from airflow_hetero_gpu.cli.drain import print_drains

    with Ledger.open_existing(args.ledger) as ledger:  # reserved_map() counts live leases only
        state = ledger.reserved_map(), ledger.evicted_map(), ledger.drained_map()
        if not args.json:
            print_drains(ledger.drains(), ledger.now())
        return state


# --- inventory --------------------------------------------------------------------------------
def cmd_inventory(args) -> int:
    cluster = _load(args)
    if args.json:
        print(json.dumps([g.to_json() for g in cluster.gpus], indent=2))
        return EXIT_OK
    rows = [  # a MIG instance under its GPU: IDX "1 MIG 3"; HELD: why a unit is never handed out
        (g.host, g.index if g.instance is None else f"{g.index} MIG {g.instance}", g.name, g.uuid,
         fmt(g.memory_total_mib, 0), fmt(g.memory_used_mib, 0), fmt(g.utilization, 2), fmt(g.temperature_c, 0),
         fmt(g.power_w, 1), fmt(float(cluster.base_load[i]), 2), ",".join(g.unschedulable),
         "yes" if g.healthy else "no", ",".join(g.reasons))
        for i, g in enumerate(cluster.gpus)
    ]
    print(table(["HOST", "IDX", "NAME", "UUID", "MEM MiB", "USED MiB", "UTIL", "TEMP C", "POWER W",
                 "LOAD", "HELD", "HEALTHY", "REASONS"], rows))
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
    from airflow_hetero_gpu.core.occupancy import pool_counts

    cluster = _load(args)
    reserved, evicted, drained = _ledger_state(args)
    out = [c.to_json() for c in pool_counts(cluster, reserved, evicted, drained=drained)]
    if args.json:
        print(json.dumps(out, indent=2))
        return EXIT_OK
    print(table(["POOL", "CARD TYPE", "TASK TYPES", "GPUS", "HEALTHY", "AVAILABLE", "RESERVED", "EVICTED",
                 "UNHEALTHY", "HOSTS"],
                [(o["pool"], o["card_type"], ",".join(o["task_types"]), o["gpus"], o["healthy"],
                  o["available"], o["reserved"], o["evicted"], o["unhealthy"], ",".join(o["hosts"])) for o in out]))
    _print_host_problems(cluster)
    return EXIT_OK


# --- plan -------------------------------------------------------------------------------------
def cmd_plan(args) -> int:
    from airflow_hetero_gpu.core.model import PlanRequest
    from airflow_hetero_gpu.core.planner import plan

    if args.reserve and not (args.job_id and args.ledger):
        raise HeteroGpuError("plan --reserve needs --job-id ID and --ledger URL")
    if args.job_id and not args.reserve:
        raise HeteroGpuError("--job-id is only used with --reserve")
    if args.team is not None and not args.reserve:
        raise HeteroGpuError("--team is only used with --reserve")
    gpu_type = args.gpu_type[0] if args.gpu_type and len(args.gpu_type) == 1 else (tuple(args.gpu_type) if args.gpu_type else None)
    request = PlanRequest(args.gpus, gpu_type, args.task_type, args.gpu_memory)
    cluster = _load(args)
    from airflow_hetero_gpu.core.request_check import never_satisfiable

    mistake = never_satisfiable(cluster, request)
    if mistake:  # a card or task type the fleet does not have: bad input (2), not "no capacity" (3)
        raise RequestError(mistake)
    if args.reserve:
        from airflow_hetero_gpu.cli.ledger import reserve_for_cli

        from airflow_hetero_gpu.ledger.errors import QuotaRefused

        try:
            result = reserve_for_cli(args.ledger, args.job_id, cluster, request, cluster.config,
                                     lease_seconds=args.lease, team=args.team)
        except QuotaRefused as err:  # not a mistake: no room in the team's quota now, as no capacity
            print(f"hetero-gpu plan: job {args.job_id!r}: {err}", file=sys.stderr)
            return EXIT_NO_CAPACITY
    else:
        reserved, evicted, drained = _ledger_state(args)
        result = plan(cluster, request, reserved=reserved, evicted=evicted, drained=drained)
    if result.decision is not None:
        _warn_old_inventory(args, {k.host for k in result.decision.keys})
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


def _warn_old_inventory(args, hosts: set[str]) -> None:
    """One line on stderr when ``plan`` placed (with no ``--max-age``) on hosts whose inventory in
    the ledger is older than ``[hetero_gpu] inventory_max_age`` (300 s): the operator would
    collect them again first, the command line places on what it has."""
    from airflow_hetero_gpu.collect.freshness import DEFAULT_MAX_AGE_S
    from airflow_hetero_gpu.settings import light_setting

    ages = getattr(args, "inventory_ages", None)
    if not ages or args.max_age is not None:
        return
    value, _ = light_setting("inventory_max_age")
    try:
        limit = float(value) if value is not None else DEFAULT_MAX_AGE_S
    except ValueError:
        limit = DEFAULT_MAX_AGE_S
    old = sorted((h for h in hosts if ages.get(h) is not None and ages[h] > limit), key=lambda h: -ages[h])
    if old:
        print(f"hetero-gpu plan: warning: placed on an inventory {ages[old[0]]:.0f} s old ({', '.join(old)}), older "
              f"than inventory_max_age {limit:g} s, which a task would collect again first: run `hetero-gpu check` "
              f"or `hetero-gpu collect --ledger`, or give --max-age to refuse old hosts", file=sys.stderr)


# --- parser -----------------------------------------------------------------------------------
def _captures_args(p: argparse.ArgumentParser, ledger_help: str, max_age_help: str) -> None:
    p.add_argument("--captures", metavar="DIR", help="capture directory (SPEC §2); without it, the inventory "
                                                      "stored in --ledger (one of the two is needed)")
    p.add_argument("--ledger", metavar="URL", help=ledger_help)
    p.add_argument("--max-age", type=non_negative_float, metavar="SECONDS",
                   help=f"with the ledger's inventory: {max_age_help} (the operator's inventory_max_age rule); "
                        "default: no bound")
    p.add_argument("--config", metavar="FILE", help="cluster.yaml (default: DIR/cluster.yaml, or the ledger's)")
    p.add_argument("--xid-window", type=non_negative_float, metavar="SECONDS",
                   help="with --captures: count a kernel-log Xid line of DIR when logged within SECONDS of the "
                        "capture (default: cluster.yaml's thresholds.xid_window_s, 3600; 0: no Xid line counts); "
                        "the ledger's inventory takes Xids from its evictions")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hetero-gpu", epilog=EPILOG, description=(
        "Place distributed training on a heterogeneous GPU cluster: inventory, candidate pools, "
        "the evaluation of load balance, fragmentation and topology, and reservations."))
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    stale = "mark GPUs of hosts whose inventory is older as stale (never placed on)"

    p = sub.add_parser("inventory", help="one row per GPU with health, from the ledger or a capture directory")
    _captures_args(p, "ledger whose inventory to show (without --captures)", stale)
    p.set_defaults(func=cmd_inventory)

    p = sub.add_parser("pools", help="the candidate pools, with their GPUs healthy, available, reserved, evicted")
    _captures_args(p, "ledger whose reservations and evictions to apply (and whose inventory, without --captures)",
                   stale)
    p.set_defaults(func=cmd_pools)

    p = sub.add_parser("plan", help="choose the scheduling pool and its GPUs for a job (steps S3-S8)",
                       description="Choose the scheduling pool and its GPUs for a job of --gpus K (steps S3-S8), "
                                   "printing every pool's stage, scores and reason. Exit 0: placed; 3: no pool can "
                                   "host it now; 2: bad input, also a card type, task type or GPU count the "
                                   "fleet can never serve.")
    _captures_args(p, "ledger database URL: reservations, evictions, and the inventory without --captures",
                   "do not place on hosts whose inventory is older")
    p.add_argument("--gpus", required=True, type=positive_int, metavar="K", help="number of GPUs")
    p.add_argument("--gpu-type", action="append", metavar="T",
                   help="acceptable card type (repeat for several; glob patterns allowed)")
    p.add_argument("--task-type", metavar="T", help="training-task type the pool must support")
    p.add_argument("--gpu-memory", type=mib, metavar="MIB", help="free memory needed on each GPU")
    p.add_argument("--reserve", action="store_true", help="claim the chosen GPUs in the ledger")
    p.add_argument("--job-id", metavar="ID", type=job_id_arg, help="job id of the reservation (with --reserve; "
                                                               "1-128 letters, digits, '.', '_', '-')")
    p.add_argument("--team", metavar="NAME", type=team_name, help="the job's team for the quotas (with --reserve; default: the "
                                                  "default team; an Airflow team the teams file's airflow_teams "
                                                  "lists counts for its team; docs/teams.md)")
    p.add_argument("--lease", type=positive_int, default=600, metavar="SECONDS",
                   help="lease of the reservation (with --reserve; default 600): it is freed when the "
                        "lease runs out unless renewed, or at once with `hetero-gpu release`")
    p.set_defaults(func=cmd_plan)

    for register in _extra_commands():
        register(sub)
    arrange(sub)  # the order of a user's first hour, an example each (cli.guide.COMMANDS)
    return parser


def _extra_commands():
    """Sub-commands that live beside their subsystem (collection, ledger, simulator)."""
    from airflow_hetero_gpu.cli.collect import register as collect_register
    from airflow_hetero_gpu.cli.check import register as check_register
    from airflow_hetero_gpu.cli.ledger import register as ledger_register
    from airflow_hetero_gpu.cli.teams import register as teams_register
    from airflow_hetero_gpu.cli.simulate import register as simulate_register

    return [collect_register, check_register, ledger_register, teams_register, simulate_register]


#: Commands whose ledger, when --ledger is not given, is the tasks' (docs/operations.md)
_LEDGER_COMMANDS = frozenset({"queue", "teams", "drain", "undrain", "hosts", "reservations", "evictions", "release",
                              "uncordon", "captures"})
#: Commands that read a ledger or a capture directory: the tasks' ledger only when a setting names it
_PLANNING_COMMANDS = frozenset({"inventory", "pools", "plan"})


def default_ledger(args: argparse.Namespace, err=None) -> None:
    """Without ``--ledger``, take the ledger the operator uses: ``[hetero_gpu] ledger_url``
    (``AIRFLOW__HETERO_GPU__LEDGER_URL``, then airflow.cfg; Airflow is not imported), else, for
    the ledger's own commands, the SQLite file under ``$AIRFLOW_HOME``; say which on stderr.
    ``inventory``/``pools``/``plan`` take it only with no ``--captures`` (``plan --reserve``:
    always) and only when a setting names it."""
    from airflow_hetero_gpu.settings import cli_ledger_url

    if getattr(args, "ledger", "given") or args.command not in _LEDGER_COMMANDS | _PLANNING_COMMANDS:
        return
    planning = args.command in _PLANNING_COMMANDS
    if planning and getattr(args, "captures", None) and not getattr(args, "reserve", False):
        return  # a capture directory alone, as before: no ledger
    url, where = cli_ledger_url()
    where = f"from {where}"
    if url is None:
        if planning:
            return  # `give --ledger URL or --captures DIR`
        from airflow_hetero_gpu.ledger.url import default_url

        url, where = default_url(), "the default: no [hetero_gpu] ledger_url is set"
    from airflow_hetero_gpu.ledger.url import mask

    args.ledger = url
    print(f"hetero-gpu {args.command}: ledger {mask(url)} ({where}; --ledger URL for another)",
          file=err or sys.stderr)


def _stacks_on_sigusr1() -> None:
    """``kill -USR1 <pid>`` prints every thread's stack to stderr (what a command that does not end
    is doing); only where stderr is a file and this is the main thread (not when called in-process)."""
    import faulthandler
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    try:
        faulthandler.register(signal.SIGUSR1, file=sys.stderr.fileno(), all_threads=True)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        pass


def main(argv: Sequence[str] | None = None) -> int:
    _stacks_on_sigusr1()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        default_ledger(args)
        return int(args.func(args) or 0)
    except HeteroGpuError as err:
        print(f"hetero-gpu {args.command}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


