"""The ledger's ``hetero-gpu`` sub-commands: ``release``, ``uncordon``, ``reservations``, ``evictions``,
``queue``, ``ledger init``, ``captures export``.

Readers (``reservations``, ``evictions``, ``queue``, ``captures export``) open an existing ledger and change
nothing; ``release`` and ``uncordon`` change an existing one; only ``ledger init`` (and the
writers elsewhere: ``collect --ledger``, ``check``, ``plan --reserve``) create one.

Each handler returns an exit status; bad input raises a one-line
:class:`~airflow_hetero_gpu.errors.HeteroGpuError` subclass that the CLI prints (exit 2).
``--ledger`` defaults to the tasks' ledger (``[hetero_gpu] ledger_url``, read without Airflow by
:func:`airflow_hetero_gpu.cli.default_ledger`), else the SQLite file under ``$AIRFLOW_HOME``.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from airflow_hetero_gpu.cli.argtypes import job_id as job_id_arg
from airflow_hetero_gpu.cli.exits import EXIT_OK
from airflow_hetero_gpu.text import table, terminal_width
from airflow_hetero_gpu.durations import duration
from airflow_hetero_gpu.cli.drain import print_drains
from airflow_hetero_gpu.cli.drain import register as drain_register
from airflow_hetero_gpu.ledger.errors import LedgerError

if TYPE_CHECKING:  # the ledger and the core are imported by the commands that use them
    from airflow_hetero_gpu.core.cluster import Cluster
    from airflow_hetero_gpu.core.config import ClusterConfig
    from airflow_hetero_gpu.core.model import PlanRequest, PlanResult


def parse_gpu_target(text: str) -> tuple[str, int | None]:
    """``HOST`` or ``HOST:INDEX`` -> (host, index or None)."""
    host, sep, index = text.strip().rpartition(":")
    if not sep:
        host, index = index, ""
    if not host or any(c.isspace() for c in host) or (sep and not index.isdigit()):
        raise LedgerError(f"expected HOST or HOST:INDEX (INDEX a GPU number >= 0), got {text!r}")
    return host, int(index) if sep else None


def reserve_for_cli(
    ledger_url: str | None,
    job_id: str,
    cluster: Cluster,
    request: PlanRequest,
    config: ClusterConfig | None = None,
    *,
    lease_seconds: float | None = None,
    team: str | None = None,
) -> PlanResult:
    """``plan --reserve``: plan and claim in one ledger transaction; decision None means exit 3.
    ``lease_seconds``: default the ledger's :data:`DEFAULT_LEASE_SECONDS`. ``team`` is translated
    as a task's team is: an Airflow team the teams file's ``airflow_teams`` lists draws on its fleet
    team's quota (said in one line on stderr), and the reservation stores the fleet team. A team the
    applied teams file neither names nor maps is refused (LedgerError; nothing reserved, docs/teams.md)."""
    from airflow_hetero_gpu.core.admission.teams import unknown_team
    from airflow_hetero_gpu.ledger.store import DEFAULT_LEASE_SECONDS, Ledger

    lease = DEFAULT_LEASE_SECONDS if lease_seconds is None else lease_seconds
    with Ledger.from_url(ledger_url) as ledger:
        if team is not None:
            teams = ledger.teams()
            fleet = teams.fleet_team(team) if teams else team
            problem = unknown_team(fleet, teams.teams if teams else ())
            if problem:
                raise LedgerError(f"--team: {problem}; nothing reserved")
            if fleet != team:
                print(f"hetero-gpu plan: Airflow team {team!r} draws on the quota of team {fleet!r}", file=sys.stderr)
            team = fleet
        return ledger.reserve(job_id, cluster, request, lease_seconds=lease, config=config, team=team)


def cmd_release(args: argparse.Namespace) -> int:
    from airflow_hetero_gpu.ledger.store import Ledger

    with Ledger.from_url(args.ledger, create=False) as ledger:
        freed = ledger.release(args.job_id)
    if freed:
        print(f"released job {args.job_id!r}")
    else:
        print(f"job {args.job_id!r} holds no live reservation; nothing to release")
    return EXIT_OK


def cmd_uncordon(args: argparse.Namespace) -> int:
    from airflow_hetero_gpu.ledger.store import Ledger

    host, index = parse_gpu_target(args.target)
    with Ledger.from_url(args.ledger, create=False) as ledger:
        back = ledger.uncordon(host, index)
    if back:
        print("readmitted: " + ", ".join(str(k) for k in back))
    else:
        print(f"no evicted GPU on {args.target.strip()}; nothing to do")
    return EXIT_OK


def _remaining(expires_at: datetime) -> str:
    seconds = (expires_at - datetime.now(timezone.utc)).total_seconds()
    return f"{max(0, int(seconds))}s"


def cmd_reservations(args: argparse.Namespace) -> int:
    from airflow_hetero_gpu.ledger.store import Ledger

    with Ledger.open_existing(args.ledger) as ledger:
        live = ledger.live_reservations()
    if args.json:
        print(json.dumps([r.to_json() for r in live], indent=2))
        return EXIT_OK
    rows = [
        (r.job_id, r.pool, len(r.gpus), " ".join(str(g.key) for g in r.gpus),
         f"{r.score.get('total', 0.0):.3f}", r.expires_at.strftime("%Y-%m-%d %H:%M:%S"), _remaining(r.expires_at),
         "/".join(str(x) for x in (r.identity.dag_id, r.identity.run_id, r.identity.task_id) if x) if r.identity else "")
        for r in live
    ]
    print(table(["JOB", "POOL", "K", "GPUS", "E", "EXPIRES (UTC)", "LEFT", "AIRFLOW TASK"], rows))
    if not live:
        print("(no live reservations)")
    return EXIT_OK


def cmd_evictions(args: argparse.Namespace) -> int:
    from airflow_hetero_gpu.ledger.store import Ledger

    with Ledger.open_existing(args.ledger) as ledger:
        evicted = ledger.evictions()
    if args.json:
        print(json.dumps([e.to_json() for e in evicted], indent=2))
        return EXIT_OK
    rows = [(e.host, e.index, e.uuid or "", ",".join(e.reasons), e.evicted_at.strftime("%Y-%m-%d %H:%M:%S"),
             e.healthy_checks) for e in evicted]
    print(table(["HOST", "IDX", "UUID", "REASONS", "EVICTED (UTC)", "HEALTHY CHECKS"], rows))
    if not evicted:
        print("(no evicted GPUs)")
    return EXIT_OK


def _asks(request: dict) -> str:
    text = f"{request.get('gpus')}"
    kind = request.get("gpu_type")
    if kind:
        text += " × " + (" or ".join(kind) if isinstance(kind, list) else str(kind))
    if request.get("task_type"):
        text += f" ({request['task_type']})"
    return text


def _claim(record) -> str:
    from airflow_hetero_gpu.core.admission import describe_gpus

    if record.admitted and record.admission:
        return "admitted: " + describe_gpus(tuple(g) for g in record.admission.get("gpus") or ())
    if not record.claim:
        return ""
    held = len(record.claim.get("held_by") or {})
    return describe_gpus(record.claimed_gpus) + (f" ({held} held)" if held else " (all free)")


def cmd_queue(args: argparse.Namespace) -> int:
    """The queue in order: position, job, priority, waited, what it waits for, the head's claim."""
    from airflow_hetero_gpu.ledger.store import Ledger

    with Ledger.open_existing(args.ledger) as ledger:
        now = ledger.now()
        entries = ledger.queue()
        teams = ledger.teams() is not None  # the TEAM column once teams are configured (docs/teams.md)
        drains = ledger.drains()
        preempted = ledger.preemptions()
    if args.json:
        print(json.dumps({"now": now.isoformat(), "entries": [e.to_json(now) for e in entries],
                          "drained": [d.to_json() for d in drains], "preemptions": preempted}, indent=2))
        return EXIT_OK
    rows = [(e.position or "-", e.job_id, *((e.team or "default",) if teams else ()),
             "admitted" if e.admitted else (e.standing or "waiting"), e.priority,
             _asks(e.request), duration(e.waited_s(now)), _claim(e), "" if e.admitted else e.where())
            for e in entries]
    width = None if args.wide else terminal_width()  # REASON wraps to the terminal; --wide: one line each
    print(table(["POS", "JOB", *(("TEAM",) if teams else ()), "STATE", "PRIO", "ASKS", "WAITED", "CLAIM", "REASON"],
                rows, width))
    if not entries:
        print("(nobody waits)")
    print_drains(drains, now)
    if preempted:  # in progress, and the last day's (docs/preemption.md)
        print("\npreemptions (last 24 h):")
        print(table(["VICTIM", "BY", "STATE", "DECIDED", "EXITED AFTER", "LOST GPU-S", "CHECKPOINT", "REASON"],
                    [(p["victim"], p["preemptor"], p["state"], p["decided_at"][11:19],
                      "" if p["exited_after_s"] is None else duration(p["exited_after_s"]),
                      "" if p["lost_gpu_s"] is None else f"{p['lost_gpu_s']:.0f}", p["checkpoint"] or "", p["reason"])
                     for p in preempted], width))
    return EXIT_OK


def cmd_ledger_init(args: argparse.Namespace) -> int:
    """Create the ledger (or apply its missing schema steps): the one explicit way to make one."""
    from airflow_hetero_gpu.ledger.store import Ledger

    with Ledger.from_url(args.url) as ledger:
        version = ledger.schema_version()
        print(f"ledger {ledger.display_url} is ready (schema version {version})")
    return EXIT_OK


def cmd_captures_export(args: argparse.Namespace) -> int:
    """Write the ledger's inventory as a capture directory (support bundles, offline what-if planning)."""
    from airflow_hetero_gpu.ledger.store import Ledger

    from airflow_hetero_gpu.capture.export import write_capture_dir
    from airflow_hetero_gpu.ledger.base import FILL_WITH

    with Ledger.open_existing(args.ledger) as ledger:
        stored = ledger.inventory(args.host or None)
    if not stored.hosts:
        raise LedgerError(f"ledger {ledger.display_url} holds no inventory" +
                          (f" of {', '.join(args.host)}" if args.host else "") + f": {FILL_WITH}")
    try:
        written = write_capture_dir(args.out, stored)
    except OSError as exc:
        raise LedgerError(f"--out {args.out}: {exc.strerror or exc}") from None
    print(f"wrote {written} host(s) of the ledger's inventory to {args.out}")
    return EXIT_OK


def _ledger_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ledger", metavar="URL", default=None,
                   help="ledger database URL (default: the tasks' ledger, [hetero_gpu] ledger_url from "
                        "AIRFLOW__HETERO_GPU__LEDGER_URL or airflow.cfg, else the sqlite file "
                        "$AIRFLOW_HOME/hetero_gpu_ledger.db)")


def register(subparsers) -> None:
    """Add the ledger's sub-commands to ``hetero-gpu``'s sub-parsers."""
    p = subparsers.add_parser("release", help="free a job's reservation (harmless when there is none)")
    p.add_argument("--job-id", required=True, metavar="ID", type=job_id_arg, help="job id of the reservation")
    _ledger_arg(p)
    p.set_defaults(func=cmd_release)

    p = subparsers.add_parser("uncordon", help="bring an evicted GPU (HOST:INDEX) or all of a host's back")
    p.add_argument("target", metavar="HOST[:INDEX]", help="one GPU, or every evicted GPU of the host")
    _ledger_arg(p)
    p.set_defaults(func=cmd_uncordon)

    p = subparsers.add_parser("reservations", help="the live reservations")
    _ledger_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_reservations)

    p = subparsers.add_parser("evictions", help="the evicted (abnormal) GPUs")
    _ledger_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_evictions)

    p = subparsers.add_parser("queue", help="the jobs waiting for GPUs, in order, with the head's claim")
    _ledger_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--wide", action="store_true", help="each reason on one line, however long (default: reasons "
                                                       "wrap to the terminal's width when printing to one)")
    p.set_defaults(func=cmd_queue)

    drain_register(subparsers, _ledger_arg)

    p = subparsers.add_parser("ledger", help="the ledger database itself: `ledger init URL` creates or upgrades it")
    sub = p.add_subparsers(dest="ledger_command", required=True, metavar="COMMAND", parser_class=type(p))
    q = sub.add_parser("init", help="create the ledger, or upgrade its schema (readers never do)")
    q.add_argument("url", metavar="URL", help="sqlite:///PATH, a file path, or postgresql://...")
    q.set_defaults(func=cmd_ledger_init)

    p = subparsers.add_parser("captures", help="capture directories: `captures export` writes the ledger's inventory "
                                              "as one")
    sub = p.add_subparsers(dest="captures_command", required=True, metavar="COMMAND", parser_class=type(p))
    q = sub.add_parser("export", help="write the ledger's inventory as a capture directory")
    _ledger_arg(q)
    q.add_argument("--out", required=True, metavar="DIR", help="the capture directory to write")
    q.add_argument("--host", action="append", metavar="HOST", help="only this host (repeatable)")
    q.set_defaults(func=cmd_captures_export)
