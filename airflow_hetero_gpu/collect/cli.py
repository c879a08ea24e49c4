"""``hetero-gpu collect``: fill a capture directory from GPU hosts over SSH.

::

    hetero-gpu collect --hosts [NAME=][USER@]HOST[:PORT],... [--identity-file KEY]
                       [--known-hosts FILE] --out DIR [--max-parallel N] [--connect-timeout S]
                       [--command-timeout S] [--retries N] [--no-kernel-log]
                       [--nvml [--nvml-python PATH]] [--json]
    hetero-gpu collect --ssh-conn-ids CONN[,LABEL=CONN...] --out DIR [...]    # Airflow connections

Prints one line per host (``ok`` or ``failed: <reason>``). Exit status:

* 0: at least one host was collected (failed hosts have ``error.txt`` in DIR);
* 2: bad input (one line on stderr naming the value);
* 4: no host could be collected.

Host keys are always verified (``--known-hosts``, default ``~/.ssh/known_hosts``; with
``--ssh-conn-ids`` the connection's ``host_key`` extra or ``~/.ssh/known_hosts``); there is no
option to turn that off.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
from typing import Any, Iterator

from airflow_hetero_gpu.collect.nvml import agent_command
from airflow_hetero_gpu.collect.ssh import CollectReport, collect_captures, paramiko_client_factory
from airflow_hetero_gpu.collect.targets import parse_hosts_arg
from airflow_hetero_gpu.cli_output import EXIT_NOTHING_COLLECTED, EXIT_OK
from airflow_hetero_gpu.cli_types import non_negative_int, positive_int, positive_seconds
from airflow_hetero_gpu.errors import HeteroGpuError

EXIT_COLLECTED = EXIT_OK


def register(subparsers: Any) -> None:
    """Add the ``collect`` sub-command to ``hetero-gpu``'s parser."""
    p = subparsers.add_parser(
        "collect", help="collect captures from GPU hosts over SSH, in parallel",
        description="Collect nvidia-smi captures (query, topo -m, Xid log) from GPU hosts over SSH "
                    "into a capture directory. Exit 0: at least one host collected; 2: bad input; "
                    "4: no host could be collected.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--hosts", metavar="[NAME=][USER@]HOST[:PORT],...",
                       help="hosts to reach with plain SSH (host keys verified)")
    where.add_argument("--ssh-conn-ids", metavar="CONN[,LABEL=CONN...]",
                       help="Airflow ssh connection ids (needs an Airflow environment)")
    p.add_argument("--out", required=True, metavar="DIR", help="capture directory to write")
    p.add_argument("--identity-file", metavar="KEY", help="private key to offer (with --hosts)")
    p.add_argument("--known-hosts", metavar="FILE",
                   help="known_hosts file to verify host keys against (with --hosts; default ~/.ssh/known_hosts)")
    p.add_argument("--max-parallel", type=positive_int, default=8, metavar="N",
                   help="hosts worked on at once (default 8)")
    p.add_argument("--connect-timeout", type=positive_seconds, default=10.0, metavar="S",
                   help="seconds to connect and authenticate, per host (default 10)")
    p.add_argument("--command-timeout", type=positive_seconds, default=30.0, metavar="S",
                   help="seconds per remote command (default 30)")
    p.add_argument("--retries", type=non_negative_int, default=2, metavar="N",
                   help="further attempts after a transient network error (default 2)")
    p.add_argument("--no-kernel-log", action="store_true", help="do not read Xid lines from the kernel log")
    p.add_argument("--nvml", action="store_true",
                   help="query GPUs through NVML (python3 + pynvml on the host), else nvidia-smi")
    p.add_argument("--nvml-python", default="python3", metavar="PATH",
                   help="the hosts' interpreter that has pynvml, for --nvml (default python3)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_collect)


def _collect_with_ssh(args: argparse.Namespace) -> CollectReport:
    try:
        targets = parse_hosts_arg(args.hosts)
        factory = paramiko_client_factory(args.identity_file, args.known_hosts, args.connect_timeout)
        agent_command(args.nvml_python)
    except ValueError as exc:
        raise HeteroGpuError(str(exc)) from None
    return collect_captures(
        targets, args.out, factory, max_parallel=args.max_parallel,
        connect_timeout=args.connect_timeout, command_timeout=args.command_timeout,
        retries=args.retries, read_kernel_log=not args.no_kernel_log, use_nvml=args.nvml,
        nvml_python=args.nvml_python,
    )


def _collect_with_airflow(args: argparse.Namespace) -> CollectReport:
    if args.identity_file or args.known_hosts:
        raise HeteroGpuError("--identity-file and --known-hosts go with --hosts; with --ssh-conn-ids "
                             "the key and host key come from each connection (key_file, host_key extras)")
    try:
        from airflow_hetero_gpu.hooks.hetero_gpu import HeteroGpuHook, normalize_conn_ids
    except ImportError as exc:  # pragma: no cover - Airflow is a dependency of the package
        raise HeteroGpuError(f"--ssh-conn-ids needs Apache Airflow: {exc}") from None
    try:
        conn_ids = normalize_conn_ids(args.ssh_conn_ids)
        agent_command(args.nvml_python)
    except ValueError as exc:
        raise HeteroGpuError(str(exc)) from None
    hook = HeteroGpuHook(
        conn_ids, captures_dir=args.out, max_parallel=args.max_parallel,
        connect_timeout=args.connect_timeout, command_timeout=args.command_timeout,
        retries=args.retries, read_kernel_log=not args.no_kernel_log, use_nvml=args.nvml,
        nvml_python=args.nvml_python,
    )
    return hook.collect()


def render_report(report: CollectReport) -> str:
    """One line per host, then a summary line."""
    width = max((len(h.host) for h in report.hosts), default=4)
    lines = []
    for h in report.hosts:
        if h.ok:
            extra = f" ({h.query_source})" if h.query_source and h.query_source != "nvidia-smi" else ""
            lines.append(f"{h.host.ljust(width)}  ok{extra}  {h.seconds:.2f}s")
            lines += [f"{' ' * width}  warning: {w}" for w in h.warnings]
        else:
            lines.append(f"{h.host.ljust(width)}  failed: {h.reason}")
    lines.append(f"collected {len(report.ok)}/{len(report.hosts)} hosts into {report.out_dir} "
                 f"in {report.seconds:.2f}s")
    return "\n".join(lines)


@contextlib.contextmanager
def _quiet_logging() -> Iterator[None]:
    """Mute log records while collecting: every host's outcome is printed by the command itself
    (and Airflow, once imported, logs to stdout, which must stay clean for ``--json``)."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


def cmd_collect(args: argparse.Namespace) -> int:
    """Run the collection; the exit status says whether anything was collected."""
    try:
        with _quiet_logging():
            report = _collect_with_ssh(args) if args.hosts is not None else _collect_with_airflow(args)
    except OSError as exc:  # --out is a file, not writable, ...
        raise HeteroGpuError(f"--out {args.out}: {exc.strerror or exc}") from None
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(render_report(report))
    return EXIT_COLLECTED if report.ok else EXIT_NOTHING_COLLECTED
