"""One-shot ``hetero-gpu collect`` of 10, 100 and 1,000 emulated hosts, against the old client.

::

    python benchmarks/collect_scale.py                          # 10,100,1000 hosts, 3 reps
    python benchmarks/collect_scale.py --hosts 100 --parallel 8,32,64 --reps 5 --delay 0.2

Starts one embedded emulated fleet (:class:`~airflow_hetero_gpu.testing.embedded.EmbeddedCluster`:
one asyncssh server process, every host on its own 127.x address with its own ed25519 host key,
``known_hosts`` listing them all) and collects its first N hosts, new connections each time and
host keys verified, in a fresh child process per collection (so the collector's CPU is measured
alone and the server's CPU does not compete with its interpreter):

- ``new``: the collector in one process, its threads sharing one interpreter
  (:func:`~airflow_hetero_gpu.collect.clients.paramiko_client_factory`: known_hosts parsed once
  per collection, ``TCP_NODELAY`` on every socket), at each ``--parallel``; as shipped for a
  fleet under 128 hosts;
- ``procs``: the same collector shared among worker processes (:mod:`airflow_hetero_gpu.collect.shards`:
  one per CPU, ``--parallel`` hosts in flight in total), as shipped for 128 hosts or more;
- ``old``: the baseline, measured in the same run at the default ``max_parallel``
  (``--baseline-reps`` times): the previous factory (:func:`legacy_client_factory` below:
  ``load_host_keys()`` per connection, no ``TCP_NODELAY``), everything else the same;
- ``keys`` (with ``--ablation``): the old factory given the shipped host-key store, so the
  difference to ``new`` is ``TCP_NODELAY`` alone;
- ``sync`` (with ``--fsync``): ``new`` writing its files durably, as a directory named with
  ``--out`` is written (one ``sync()`` at the end); ``new``, ``procs``, ``old`` and ``keys``
  write no file, as ``hetero-gpu collect --ledger`` and ``check`` do (the outputs stay in memory
  for the ledger);
- ``cli``: the real ``hetero-gpu collect --hosts-file … --ledger URL`` command at the default
  ``--max-parallel`` (interpreter start, imports and storing every host in a new SQLite ledger
  included), once per repetition; ``cliout`` the same with ``--out DIR`` instead (5 files per
  host, durably).

Nothing a run writes is removed before the end: on a file system that looks past inodes freed
in the last half minute when it creates one (ext4 without a journal, as on the reference
machine), removing one run's 5,000 files made the next run's creations cost seconds of system
CPU that were the previous run's, not its own.

Collector CPU is user + system of the collecting process and of every worker process it started
(waited for, so counted in its children's usage).

The modes are interleaved within each repetition so drift from other load hits all of them.
Printed per fleet size: median / min / max wall seconds, collector CPU per host (user + system of
the child), the server's CPU per host, hosts collected, and the ratio old / new at the same
``max_parallel``. ``--delay S`` makes every emulated ``nvidia-smi`` take S seconds, as real ones
take 0.1-1 s to talk to the driver.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import paramiko  # noqa: E402

from airflow_hetero_gpu.collect.clients import (  # noqa: E402
    PARAMIKO_LOG_CHANNEL,
    HostKeyStore,
    host_key_name,
    paramiko_client_factory,
)
from airflow_hetero_gpu.collect.shards import HOSTS_PER_WORKER, ShardWorkers, factory_spec, worker_count  # noqa: E402
from airflow_hetero_gpu.collect.ssh import DEFAULT_MAX_PARALLEL, collect_captures  # noqa: E402
from airflow_hetero_gpu.collect.targets import SshTarget, parse_hosts_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def legacy_client_factory(identity_file: str, known_hosts: str, connect_timeout: float = 10, *,
                          keys_once: bool = False):
    """The factory before this change: known_hosts loaded for every client, paramiko's own socket
    (no TCP_NODELAY). Kept here only as the benchmark's baseline. ``keys_once`` (the ``keys``
    mode) gives it the shipped host-key store, to tell the two changes apart."""
    store = HostKeyStore(known_hosts) if keys_once else None

    def factory(target: SshTarget, connect_timeout: float | None = None) -> paramiko.SSHClient:
        timeout = connect_timeout if connect_timeout is not None else default_timeout
        client = paramiko.SSHClient()
        client.set_log_channel(PARAMIKO_LOG_CHANNEL)
        try:
            if store is None:
                client.load_host_keys(str(known_hosts))
            else:
                name = host_key_name(target.address, target.port)
                for key_type, key in store.keys_for(name).items():
                    client.get_host_keys().add(name, key_type, key)
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            client.connect(hostname=target.address, port=target.port,
                           username=target.user or getpass.getuser(), key_filename=str(identity_file),
                           look_for_keys=False, allow_agent=False, timeout=timeout,
                           banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout)
        except BaseException:
            client.close()
            raise
        return client

    default_timeout = connect_timeout
    return factory


# ---------------------------------------------------------------------------------------------
# One collection, in a child process
# ---------------------------------------------------------------------------------------------

def child(args: argparse.Namespace) -> int:
    targets = parse_hosts_file(args.hosts_file)
    factory = {"old": lambda: legacy_client_factory(args.identity_file, args.known_hosts),
               "keys": lambda: legacy_client_factory(args.identity_file, args.known_hosts, keys_once=True),
               "new": lambda: paramiko_client_factory(args.identity_file, args.known_hosts),
               "procs": lambda: paramiko_client_factory(args.identity_file, args.known_hosts),
               "sync": lambda: paramiko_client_factory(args.identity_file, args.known_hosts)}[args.mode]()
    out = args.out if args.mode == "sync" else None  # the others keep the outputs in memory
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    workers = None
    if args.mode == "procs":  # the shipped choice for a fleet this size: worker processes
        spec = factory_spec(factory)
        workers = ShardWorkers(worker_count(len(targets)), *spec) if spec and worker_count(len(targets)) > 1 else None
    report = collect_captures(targets, out, factory,
                              max_parallel=args.parallel, connect_timeout=60, command_timeout=60,
                              retries=0, durable=args.mode == "sync", workers=workers)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers, stopped and waited for
    cpu = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
           + (children_after.ru_utime - children.ru_utime) + (children_after.ru_stime - children.ru_stime))
    print(json.dumps({"wall": wall, "cpu": cpu, "ok": len(report.ok),
                      "failed": [f"{h.host}: {h.reason}" for h in report.failed][:3]}))
    return 0


def run_child(cluster: Any, hosts_file: Path, mode: str, parallel: int, out: Path) -> dict[str, Any]:
    server_before = cluster.server_cpu_seconds()
    argv = [sys.executable, __file__, "_child", "--mode", mode, "--hosts-file", str(hosts_file),
            "--identity-file", str(cluster.identity_file), "--known-hosts", str(cluster.known_hosts_path),
            "--parallel", str(parallel), "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=3600,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if done.returncode != 0:
        raise SystemExit(f"collection failed: {done.stderr.strip()[-2000:]}")
    result = json.loads(done.stdout)
    result["server_cpu"] = cluster.server_cpu_seconds() - server_before
    return result


def run_cli(cluster: Any, hosts_file: Path, out: Path, into_dir: bool) -> dict[str, Any]:
    """The real command, timed from outside: start-up and imports included. Into a new SQLite
    ledger ``out``.db, or the capture directory ``out`` when ``into_dir``."""
    server_before = cluster.server_cpu_seconds()
    where = ["--out", str(out)] if into_dir else ["--ledger", f"sqlite:///{out}.db"]
    argv = [sys.executable, "-m", "airflow_hetero_gpu.cli", "collect", "--hosts-file", str(hosts_file),
            "--identity-file", str(cluster.identity_file), "--known-hosts", str(cluster.known_hosts_path),
            *where, "--json"]
    cpu_before = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=3600,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    wall = time.perf_counter() - started
    cpu = _children_cpu() - cpu_before
    if done.returncode != 0:
        raise SystemExit(f"hetero-gpu collect failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    hosts = json.loads(done.stdout)["hosts"]
    return {"wall": wall, "cpu": cpu,
            "ok": sum(h["ok"] for h in hosts), "server_cpu": cluster.server_cpu_seconds() - server_before,
            "failed": [f"{h['host']}: {h['reason']}" for h in hosts if not h["ok"]][:3]}


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------

def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(cluster: Any, root: Path, size: int, parallels: list[int], reps: int, cli: bool,
            baseline_reps: int, ablation: bool = False,
            fsync: bool = False, procs: bool = True) -> dict[tuple[str, int], list[dict[str, Any]]]:
    hosts_file = cluster.write_hosts_file(root / f"hosts-{size}", [h.name for h in cluster.hosts[:size]])
    modes = [(m, p) for m in (["new", "procs"] if procs else ["new"]) for p in parallels]
    if baseline_reps:
        modes.append(("old", DEFAULT_MAX_PARALLEL))
    if ablation:
        modes += [("keys", p) for p in parallels]
    if fsync:
        modes.append(("sync", DEFAULT_MAX_PARALLEL))
    if cli:
        modes += [("cli", DEFAULT_MAX_PARALLEL), ("cliout", DEFAULT_MAX_PARALLEL)]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {m: [] for m in modes}
    for rep in range(reps):
        for mode, parallel in modes:
            if mode == "old" and rep >= baseline_reps:
                continue
            out = root / f"out-{size}-{mode}-{parallel}-{rep}"  # kept until the end (see the module)
            if mode in ("cli", "cliout"):
                result = run_cli(cluster, hosts_file, out, into_dir=mode == "cliout")
            else:
                result = run_child(cluster, hosts_file, mode, parallel, out)
            runs[(mode, parallel)].append(result)
            print(f"  {size:>5} hosts  rep {rep + 1}/{reps}  {mode:<6} P={parallel:<3} {result['wall']:7.2f} s  "
                  f"collector CPU {1000 * result['cpu'] / size:6.1f} ms/host  server CPU "
                  f"{1000 * result['server_cpu'] / size:5.1f} ms/host  ok {result['ok']}"
                  + (f"  failed: {result['failed']}" if result["failed"] else ""), file=sys.stderr, flush=True)
    return runs


def report(size: int, runs: dict[tuple[str, int], list[dict[str, Any]]]) -> None:
    print(f"{size} hosts")
    print(f"  {'mode':<6} {'P':>3} {'median s':>9} {'min s':>7} {'max s':>7} {'collector CPU/host':>18} "
          f"{'server CPU/host':>15} {'ok':>5} {'old/this':>8}")
    old = {p: statistics.median(r["wall"] for r in v) for (m, p), v in runs.items() if m == "old"}
    keys = {p: statistics.median(r["wall"] for r in v) for (m, p), v in runs.items() if m == "keys"}
    for (mode, parallel), values in runs.items():
        walls = [r["wall"] for r in values]
        med = statistics.median(walls)
        ratio = f"{old[parallel] / med:6.1f}x" if mode in ("new", "keys") and parallel in old else ""
        if mode == "new" and parallel in keys:
            ratio += f" (keys/new {keys[parallel] / med:.2f}x)"
        print(f"  {mode:<6} {parallel:>3} {med:9.2f} {min(walls):7.2f} {max(walls):7.2f} "
              f"{1000 * statistics.median(r['cpu'] for r in values) / size:15.1f} ms "
              f"{1000 * statistics.median(r['server_cpu'] for r in values) / size:12.1f} ms "
              f"{min(r['ok'] for r in values):>5} {ratio:>7}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    inner = sub.add_parser("_child", help=argparse.SUPPRESS)
    for name in ("--mode", "--hosts-file", "--identity-file", "--known-hosts", "--out"):
        inner.add_argument(name, required=True)
    inner.add_argument("--parallel", type=int, required=True)
    parser.add_argument("--hosts", default="10,100,1000", help="fleet sizes, comma separated")
    parser.add_argument("--parallel", default=f"8,{DEFAULT_MAX_PARALLEL}",
                        help="max_parallel values of the new client, comma separated")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds every nvidia-smi call takes")
    parser.add_argument("--baseline-reps", type=int, default=1,
                        help="repetitions of the old client (0: none; it re-reads known_hosts, "
                             "about 0.7 s of CPU per host with 1,000 entries)")
    parser.add_argument("--no-cli", action="store_true", help="skip the hetero-gpu collect command")
    parser.add_argument("--no-procs", action="store_true",
                        help="skip 'procs' (the collector shared among worker processes, as shipped for "
                             f"{2 * HOSTS_PER_WORKER} hosts or more)")
    parser.add_argument("--ablation", action="store_true",
                        help="also the old client with host keys read once but no TCP_NODELAY ('keys')")
    parser.add_argument("--fsync", action="store_true",
                        help="also the new client writing its files durably, as into an --out directory ('sync')")
    parser.add_argument("--processes", type=int, default=1, help="server processes of the emulated fleet")
    args = parser.parse_args(argv)
    if args.command == "_child":
        return child(args)
    from airflow_hetero_gpu.testing.embedded import EmbeddedCluster  # noqa: PLC0415 - parent only
    from airflow_hetero_gpu.testing.fleets import scale_hosts  # noqa: PLC0415

    sizes = sorted({int(v) for v in args.hosts.split(",")})
    parallels = sorted({int(v) for v in args.parallel.split(",")})
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at start; paramiko {paramiko.__version__}")
    with tempfile.TemporaryDirectory(prefix="collect-scale-fleet-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        with EmbeddedCluster(root / "fleet", scale_hosts(max(sizes)), processes=args.processes) as cluster:
            print(f"{max(sizes)} emulated hosts started in {time.perf_counter() - started:.1f} s "
                  f"({args.processes} server process{'es' if args.processes > 1 else ''}); nvidia-smi delay "
                  f"{args.delay:g} s; each collection: --query-gpu, topo -m, kernel-log read per host")
            if args.delay:
                for host in cluster.hosts:
                    cluster.set_state(host.name, nvidia_smi_delay_s=args.delay)
            for size in sizes:
                runs = measure(cluster, root, size, parallels, args.reps, cli=not args.no_cli,
                               baseline_reps=args.baseline_reps, ablation=args.ablation, fsync=args.fsync,
                               procs=not args.no_procs)
                report(size, runs)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
