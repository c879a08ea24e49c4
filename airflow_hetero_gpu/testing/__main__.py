"""``python -m airflow_hetero_gpu.testing start --root DIR [--hosts demo|small|scale] [--count N] [--embedded]``

Starts an emulated GPU cluster, prints where each host answers and the client paths, and keeps
it running until SIGTERM or SIGINT; then stops every sshd and every command started through it.
Once every host answers it writes ``DIR/airflow.env`` (and prints it): ready-to-source
``export`` lines that point Airflow at the cluster (:mod:`.airflow_recipe`; the demo host set
also gets the demo's ``cluster.yaml`` and ``topology.conf`` in DIR).
``--embedded`` serves the hosts from one asyncssh process instead of a real sshd each (no
OpenSSH server needed; the way to run hundreds of hosts, ``--hosts scale --count 1000``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Sequence

from airflow_hetero_gpu.testing import sshd_available
from airflow_hetero_gpu.testing.airflow_recipe import ENV_FILE, write_recipe
from airflow_hetero_gpu.testing.cluster import EmulatedCluster
from airflow_hetero_gpu.testing.demo import demo_hosts, small_hosts
from airflow_hetero_gpu.testing.embedded import EmbeddedCluster, EmbeddedServerError
from airflow_hetero_gpu.testing.fleets import scale_hosts
from airflow_hetero_gpu.testing.sshd import SshdError

HOST_SETS = {"demo": lambda count: demo_hosts(), "small": lambda count: small_hosts(count or 2),
             "scale": lambda count: scale_hosts(count or 100)}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m airflow_hetero_gpu.testing",
                                     description="Run an emulated GPU cluster (real sshd, fake nvidia-smi).")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start a cluster and keep it running until SIGTERM/SIGINT")
    start.add_argument("--root", required=True, type=Path, help="directory for keys, states and configs")
    start.add_argument("--hosts", default="demo", choices=sorted(HOST_SETS), help="which host set")
    start.add_argument("--count", type=int, default=0, metavar="N",
                       help="hosts of the small (default 2) or scale (default 100) set")
    start.add_argument("--first-address", default="127.0.0.11", help="address of the first host")
    start.add_argument("--embedded", action="store_true",
                       help="one asyncssh server process for every host instead of a real sshd each")
    return parser


def describe(cluster: EmulatedCluster | EmbeddedCluster, limit: int = 20) -> str:
    """The human-readable summary printed once the cluster is up (the first ``limit`` hosts)."""
    server = "one embedded asyncssh server" if isinstance(cluster, EmbeddedCluster) else "a real sshd per host"
    lines = [f"emulated cluster under {cluster.root} ({len(cluster.hosts)} hosts, {server})"]
    for host in cluster.hosts[:limit]:
        state = cluster.state(host.name)
        cards = sorted({g["name"] for g in state.get("gpus", [])})
        lines.append(f"  {host.name:<12} {host.address}:{host.port:<6} {len(state.get('gpus', []))} x "
                     f"{', '.join(cards)}  state: {host.state_file}")
    lines += [
        f"user:          {cluster.user}",
        f"identity file: {cluster.identity_file}",
        f"known_hosts:   {cluster.known_hosts_path}",
        f"--hosts value: {cluster.hosts_arg() if len(cluster.hosts) <= limit else '(see hosts.txt)'}",
        f"--hosts-file:  {cluster.write_hosts_file(cluster.root / 'hosts.txt')}",
        f"try:           ssh -i {cluster.identity_file} -o UserKnownHostsFile={cluster.known_hosts_path} "
        f"-p {cluster.hosts[0].port} {cluster.user}@{cluster.hosts[0].address} nvidia-smi -L",
        f"ready: {cluster.root / 'cluster.json'}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.embedded and not sshd_available():
        print("error: OpenSSH server not installed (apt-get install openssh-server), "
              "or use --embedded", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    kind = EmbeddedCluster if args.embedded else EmulatedCluster
    (Path(args.root) / ENV_FILE).unlink(missing_ok=True)  # an earlier run's: not ready yet
    try:
        cluster = kind(args.root, HOST_SETS[args.hosts](args.count), first_address=args.first_address)
        cluster.start()
    except (SshdError, EmbeddedServerError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        print(describe(cluster), flush=True)
        recipe = write_recipe(cluster, cluster.root, demo=args.hosts == "demo")
        shown = recipe.read_text() if len(cluster.hosts) <= 20 else f"({len(cluster.hosts)} connections)\n"
        print(f"\nfor Airflow (. {recipe}):\n{shown}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        cluster.stop()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
