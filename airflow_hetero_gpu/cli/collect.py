"""``hetero-gpu collect``: collect GPU hosts over SSH into the ledger's inventory or a capture directory.

::

    hetero-gpu collect (--hosts [NAME=][USER@]HOST[:PORT],... | --hosts-file FILE) [--identity-file KEY]
                       [--known-hosts FILE] (--ledger URL | --out DIR | both) [--config FILE]
                       [--topology FILE] [--max-parallel N] [--connect-timeout S]
                       [--command-timeout S] [--retries N] [--no-kernel-log]
                       [--nvml [--nvml-python PATH]] [--json]
    hetero-gpu collect --ssh-conn-ids CONN[,LABEL=CONN...] --ledger URL [...]    # Airflow connections

Prints one line per host (``ok`` or ``failed: <reason>``). With ``--ledger`` the collection is
stored as the fleet's inventory (what the operator, the triggers and the cluster page read); a
new Xid line in a host's kernel log evicts its GPU once. Exit status:

* 0: at least one host was collected (a failed host keeps its last good outputs);
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
from airflow_hetero_gpu.collect.ssh import (
    DEFAULT_MAX_PARALLEL,
    CollectReport,
    OpenFilesLimitError,
)
from airflow_hetero_gpu.collect.targets import parse_hosts_arg, parse_hosts_file
from airflow_hetero_gpu.cli.exits import EXIT_NOTHING_COLLECTED, EXIT_OK
from airflow_hetero_gpu.cli.argtypes import non_negative_int, positive_int, positive_seconds
from airflow_hetero_gpu.errors import HeteroGpuError

EXIT_COLLECTED = EXIT_OK


def add_host_args(p: argparse.ArgumentParser) -> None:
    """The hosts and how to reach them (shared by ``collect`` and ``check``)."""
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--hosts", metavar="[NAME=][USER@]HOST[:PORT],...",
                       help="hosts to reach with plain SSH (host keys verified)")
    where.add_argument("--hosts-file", metavar="FILE",
                       help="the same, one [NAME=][USER@]HOST[:PORT] a line (# comments allowed)")
    where.add_argument("--ssh-conn-ids", metavar="CONN[,LABEL=CONN...]",
                       help="Airflow ssh connection ids (needs an Airflow environment)")
    p.add_argument("--identity-file", metavar="KEY", help="private key to offer (with --hosts/--hosts-file)")
    p.add_argument("--known-hosts", metavar="FILE",
                   help="known_hosts file to verify host keys against (with --hosts/--hosts-file; "
                        "default ~/.ssh/known_hosts)")
    p.add_argument("--config", metavar="FILE", help="the fleet's cluster.yaml (stored with the inventory)")
    p.add_argument("--topology", metavar="FILE", help="the fleet's topology.conf (stored with the inventory)")
    p.add_argument("--max-parallel", type=positive_int, default=DEFAULT_MAX_PARALLEL, metavar="N",
                   help=f"hosts worked on at once (default {DEFAULT_MAX_PARALLEL})")
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


def register(subparsers: Any) -> None:
    """Add the ``collect`` sub-command to ``hetero-gpu``'s parser."""
    p = subparsers.add_parser(
        "collect", help="collect captures from GPU hosts over SSH, in parallel",
        description="Collect nvidia-smi captures (query, topo -m, Xid log) from GPU hosts over SSH "
                    "into the ledger's inventory (--ledger) and/or a capture directory (--out). Exit 0: at "
                    "least one host collected; 2: bad input; 4: no host could be collected.")
    add_host_args(p)
    p.add_argument("--out", metavar="DIR", help="capture directory to write")
    p.add_argument("--ledger", metavar="URL", help="store the collection in this ledger's inventory "
                                                    "(created when missing)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_collect)


def collector_from_args(args: argparse.Namespace, out_dir: str | None, *, keep_connections: bool = False) -> Any:
    """The :class:`~airflow_hetero_gpu.collect.fleet.Collector` the arguments name.

    ``keep_connections``: the SSH connections stay open from one collection to the next
    (:class:`~.persistent.KeptConnections`: the client factory of a collector over
    ``--hosts``/``--hosts-file``, close it when done; a hook over ``--ssh-conn-ids`` keeps them
    itself, ``hook.close()``)."""
    options = dict(max_parallel=args.max_parallel, connect_timeout=args.connect_timeout,
                   command_timeout=args.command_timeout, retries=args.retries,
                   read_kernel_log=not args.no_kernel_log, use_nvml=args.nvml, nvml_python=args.nvml_python)
    try:
        agent_command(args.nvml_python)
        if args.hosts is not None or args.hosts_file is not None:
            from airflow_hetero_gpu.collect.fleet import ssh_collector

            targets = parse_hosts_arg(args.hosts) if args.hosts is not None else parse_hosts_file(args.hosts_file)
            return ssh_collector(targets, identity_file=args.identity_file, known_hosts=args.known_hosts,
                                 keep_connections=keep_connections, out_dir=out_dir, config=args.config,
                                 topology_conf=args.topology, **options)
    except ValueError as exc:
        raise HeteroGpuError(str(exc)) from None
    if args.identity_file or args.known_hosts:
        raise HeteroGpuError("--identity-file and --known-hosts go with --hosts/--hosts-file; with --ssh-conn-ids "
                             "the key and host key come from each connection (key_file, host_key extras)")
    try:
        from airflow_hetero_gpu.hooks.hetero_gpu import HeteroGpuHook, normalize_conn_ids
    except ImportError as exc:  # pragma: no cover - Airflow is a dependency of the package
        raise HeteroGpuError(f"--ssh-conn-ids needs Apache Airflow: {exc}") from None
    try:
        conn_ids = normalize_conn_ids(args.ssh_conn_ids)
    except ValueError as exc:
        raise HeteroGpuError(str(exc)) from None
    hook = HeteroGpuHook(conn_ids, captures_dir=out_dir, config=args.config, topology_conf=args.topology,
                         keep_connections=keep_connections, **options)
    hook.fleet_files()  # validates cluster.yaml and topology.conf before anything is collected
    return hook


def render_report(report: CollectReport, *, where: str | None = None, ledger: str | None = None) -> str:
    """One line per host, then a summary line."""
    width = max((len(h.host) for h in report.hosts), default=4)
    lines = []
    for h in report.hosts:
        if h.ok:
            extra = f" ({h.query_source})" if h.query_source and h.query_source != "nvidia-smi" else ""
            lines.append(f"{h.host.ljust(width)}  ok{extra}  {h.seconds:.2f}s")
            lines += [f"{' ' * width}  warning: {w}" for w in h.warnings]
        elif h.duplicate_of is not None:
            lines.append(f"{h.host.ljust(width)}  {h.reason}")
        else:
            lines.append(f"{h.host.ljust(width)}  failed: {h.reason}")
    into = " and ".join(x for x in (f"the ledger {ledger}" if ledger else None, where) if x) or str(report.out_dir)
    lines.append(f"collected {len(report.ok)}/{len(report.hosts)} hosts into {into} in {report.seconds:.2f}s")
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
    if not args.out and not args.ledger:
        raise HeteroGpuError("give --ledger URL (store in the ledger's inventory) and/or --out DIR (a capture "
                             "directory)")
    collector = collector_from_args(args, args.out)  # bad input is refused before a ledger is made
    ledger = None
    if args.ledger:
        from airflow_hetero_gpu.ledger import Ledger

        ledger = Ledger.from_url(args.ledger)  # a writer: created when missing, before any SSH
    try:
        try:
            with _quiet_logging():
                report = collector.collect()
        except OpenFilesLimitError as exc:
            raise HeteroGpuError(str(exc)) from None
        except OSError as exc:  # --out is a file, not writable, ...
            raise HeteroGpuError(f"--out {args.out}: {exc.strerror or exc}") from None
        if ledger is not None:
            from airflow_hetero_gpu.collect.records import host_records
            from airflow_hetero_gpu.healthcheck.check import collector_name

            stored = ledger.store_collection(host_records(report), collector=collector_name("hetero-gpu collect"),
                                             fleet_files=collector.fleet_files(), config=collector.cluster_config())
    finally:
        if ledger is not None:
            ledger.close()
    if args.json:
        out = report.as_dict()
        if ledger is not None:
            out["ledger"] = {"url": ledger.display_url, "collection_id": stored.collection_id,
                             "xid_evictions": [{"host": k.host, "index": k.index, "reasons": list(r)}
                                               for k, r in stored.xid_evictions]}
        print(json.dumps(out, indent=2))
    else:
        print(render_report(report, where=args.out or None, ledger=ledger.display_url if ledger else None))
        if ledger is not None:
            for key, reasons in stored.xid_evictions:
                print(f"evicted {key} ({', '.join(reasons)}): a new Xid line in its kernel log")
    return EXIT_COLLECTED if report.ok else EXIT_NOTHING_COLLECTED
