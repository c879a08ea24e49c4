"""``hetero-gpu teams``: apply a teams file to the ledger, show each team's standing (docs/teams.md).

    hetero-gpu teams apply FILE --ledger URL     # atomic, idempotent; a bad file changes nothing
    hetero-gpu teams --ledger URL [--json]       # quota, in use, borrowed, lent, waiting, fair share
"""

from __future__ import annotations

import argparse
import json
import sys

from airflow_hetero_gpu.cli.exits import EXIT_OK
from airflow_hetero_gpu.core.admission.teams import read_teams_file
from airflow_hetero_gpu.text import table


def cmd_teams_apply(args: argparse.Namespace) -> int:
    from airflow_hetero_gpu.cli.airflow_teams import check_airflow_teams
    from airflow_hetero_gpu.ledger.store import Ledger

    teams = read_teams_file(args.file)
    check_airflow_teams(teams, args.file, lambda line: print(f"hetero-gpu teams: warning: {line}", file=sys.stderr))
    with Ledger.from_url(args.ledger, create=False) as ledger:
        changed = ledger.apply_teams(teams, args.file)
    names = ", ".join(sorted(teams.teams)) or "none (quotas off)"
    print(f"teams {'applied' if changed else 'unchanged (already applied)'}: {names}")
    return EXIT_OK


APPLY_DESCRIPTION = """\
Replace every team's GPU quota by those of FILE, in one transaction: the whole file or nothing,
and applying the same file again changes nothing. A bad file is one line naming the file, the
team and the key (exit 2); the applied quotas stay as they were. An empty `teams:` turns quotas
off. Then an admission pass runs (what may start changed).

The file (YAML, UTF-8, at most 1 MiB; no team or key twice):

  teams:
    TEAM:                       # 1-64 letters, digits, _ . @ -
      quota: {PATTERN: GPUS}    # card-type pattern ("*", "A100*", "H100-SXM5-80GB") -> 0..1000000
      borrowing_limit: {PATTERN: GPUS}   # optional, per pattern of quota; default unlimited
      lending_limit: {PATTERN: GPUS}     # optional, per pattern of quota; default all idle quota
      weight: 1                 # optional, fair-share weight, 0.001..1000
      airflow_teams: [NAME, ...]         # optional: the Airflow teams drawing on this quota;
                                         # default the Airflow team of the team's own name
  usage_half_life: 24h          # optional, 1s..365d (seconds, or 30m, 24h, 2d)

Example (teams.yaml):

  teams:
    research: {quota: {"*": 16}, weight: 2}
    prod:     {quota: {"A100*": 8}, lending_limit: {"A100*": 4}}
    intern:   {quota: {"*": 4}, borrowing_limit: {"*": 4}}
  usage_half_life: 24h

  hetero-gpu teams apply teams.yaml --ledger postgresql://user@db/ledger
  hetero-gpu teams --ledger postgresql://user@db/ledger      # where each team stands

Rules, bounds and a worked example: docs/teams.md."""


def _n(v) -> str:
    return "-" if v is None else str(v)


def _jobs(team: dict) -> str:
    """``3`` running jobs, ``4/4`` with its max_jobs."""
    jobs = team.get("jobs", 0)
    return str(jobs) if team.get("max_jobs") is None else f"{jobs}/{team['max_jobs']}"


def cmd_teams(args: argparse.Namespace) -> int:
    from airflow_hetero_gpu.ledger.store import Ledger

    if getattr(args, "teams_command", None) == "apply":
        return cmd_teams_apply(args)
    with Ledger.open_existing(args.ledger) as ledger:
        standing = ledger.team_standing()
    if args.json:
        print(json.dumps(standing, indent=2))
        return EXIT_OK
    if not standing["rows"]:
        print("(no teams configured: `hetero-gpu teams apply FILE --ledger URL`)")
        return EXIT_OK
    shares = standing["teams"]
    rows = [(r["team"], r["pattern"] or "(no quota)", r["quota"], r["in_use"], r["borrowed"], r["lent"], r["waiting"],
             "unlimited" if r["borrowing_limit"] is None else r["borrowing_limit"],
             "all" if r["lending_limit"] is None else r["lending_limit"], shares[r["team"]]["fair_share"],
             _jobs(shares[r["team"]]))
            for r in standing["rows"]]
    print(table(["TEAM", "CARDS", "QUOTA", "IN USE", "BORROWED", "LENT", "WAITING", "MAY BORROW", "LENDS",
                 "FAIR SHARE", "JOBS"], rows))
    mapped = [(n, ", ".join(t.get("airflow_teams") or [n])) for n, t in sorted(shares.items())]
    if any(airflow != name for name, airflow in mapped):  # some team serves Airflow teams of other names
        print()
        print(table(["TEAM", "AIRFLOW TEAMS"], mapped))
    return EXIT_OK


def register(subparsers) -> None:
    from airflow_hetero_gpu.cli.ledger import _ledger_arg

    p = subparsers.add_parser("teams", help="teams' GPU quotas: apply a teams file, or show where each team stands")
    _ledger_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sub = p.add_subparsers(dest="teams_command", required=False, metavar="COMMAND", parser_class=type(p))
    q = sub.add_parser("apply", help="replace every team's quota by FILE's, in one transaction",
                       description=APPLY_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("file", metavar="FILE", help="the teams file (YAML; docs/teams.md)")
    # given before or after `apply`: the sub-command's default must not overwrite the parent's value
    q.add_argument("--ledger", metavar="URL", default=argparse.SUPPRESS,
                   help="ledger database URL (default: the tasks' ledger, as `teams --help` says)")
    q.set_defaults(func=cmd_teams)
    p.set_defaults(func=cmd_teams)
