"""``hetero-gpu drain / undrain / hosts remove``: take hosts out of placement for maintenance,
put them back, drop a host from the inventory (docs/operations.md).

``drain`` and ``undrain`` change an existing ledger only; bad input (a host the fleet does not
have, an empty reason, a bad deadline) is one line and exit 2 with nothing changed.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import TYPE_CHECKING, Iterable

from airflow_hetero_gpu.cli.exits import EXIT_OK
from airflow_hetero_gpu.durations import parse_duration

if TYPE_CHECKING:
    from airflow_hetero_gpu.ledger.drains import Drain


def _deadline(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def print_drains(drains: Iterable[Drain], now: datetime) -> None:
    from airflow_hetero_gpu.core.drain import drain_line

    for d in drains:
        print(drain_line(d, now))


def _who() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no name for this uid: say so
        user = "unknown user"
    return f"{user} on {socket.gethostname()}"


def cmd_drain(args: argparse.Namespace) -> int:
    from airflow_hetero_gpu.core.drain import drain_line
    from airflow_hetero_gpu.ledger.store import Ledger

    with Ledger.open_existing(args.ledger) as ledger:
        drains = ledger.drain(args.hosts, args.reason, deadline_s=args.deadline, by=_who())
        now = ledger.now()
        holding = {d.host: ledger.jobs_on(d.host) for d in drains}
    for d in drains:
        jobs = holding[d.host]
        print(drain_line(d, now) + (f"; running there: {', '.join(jobs)}" if jobs else ""))
    return EXIT_OK


def cmd_undrain(args: argparse.Namespace) -> int:
    from airflow_hetero_gpu.ledger.store import Ledger

    with Ledger.open_existing(args.ledger) as ledger:
        back = ledger.undrain(args.hosts)
    for host in args.hosts:
        print(f"{host} undrained: placeable again" if host in back else f"{host} was not drained")
    return EXIT_OK


def cmd_hosts_remove(args: argparse.Namespace) -> int:
    from airflow_hetero_gpu.ledger.store import Ledger

    with Ledger.open_existing(args.ledger) as ledger:
        ledger.remove_host(args.host)
    print(f"{args.host} removed from the inventory (a later collection that reaches it adds it again)")
    return EXIT_OK


def cmd_hosts_list(args: argparse.Namespace) -> int:
    from airflow_hetero_gpu.ledger.store import Ledger

    with Ledger.open_existing(args.ledger) as ledger:
        drains = ledger.drains()
        now = ledger.now()
    print_drains(drains, now)
    if not drains:
        print("(no drained hosts)")
    return EXIT_OK


def register(subparsers, ledger_arg) -> None:
    p = subparsers.add_parser("drain", help="take hosts out of placement for maintenance (running jobs finish)")
    p.add_argument("hosts", nargs="+", metavar="HOST", help="host names as the inventory has them")
    p.add_argument("--reason", required=True, metavar="TEXT", help="why (shown wherever the host is not placed on)")
    p.add_argument("--deadline", type=_deadline, metavar="DURATION",
                   help="end the jobs still running there after this long (90s, 30m, 2h, 1d); default: they finish")
    ledger_arg(p)
    p.set_defaults(func=cmd_drain)

    p = subparsers.add_parser("undrain", help="put drained hosts back into placement")
    p.add_argument("hosts", nargs="+", metavar="HOST")
    ledger_arg(p)
    p.set_defaults(func=cmd_undrain)

    p = subparsers.add_parser("hosts", help="the inventory's hosts: drained ones, removing one")
    sub = p.add_subparsers(dest="hosts_command", required=True, metavar="COMMAND", parser_class=type(p))
    q = sub.add_parser("remove", help="drop a host no job holds from the inventory")
    q.add_argument("host", metavar="HOST")
    ledger_arg(q)
    q.set_defaults(func=cmd_hosts_remove)
    q = sub.add_parser("drained", help="the drained hosts, why, and when their jobs end")
    ledger_arg(q)
    q.set_defaults(func=cmd_hosts_list)


__all__ = ["print_drains", "register"]
