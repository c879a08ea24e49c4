"""The collector's reads of one connected host: one SSH session for query, topo and the kernel log
(:func:`~airflow_hetero_gpu.collect.command.run_together`) against one session per command.

::

    python benchmarks/host_reads.py                  # real sshd, 4 hosts, 5 reps
    python benchmarks/host_reads.py --embedded --hosts 50

Connects once to each emulated host (the real-sshd :class:`EmulatedCluster` by default: OpenSSH
starts a login shell per session, as a real host does; ``--embedded``: the asyncssh fleet, whose
shell answers in-process), then times :func:`~airflow_hetero_gpu.collect.gather.gather` host after
host, both ways, interleaved within each repetition: ``one-session`` as shipped, ``one-by-one``
the same code with the one-session read reporting no markers (what a host with a fish login shell
gets, less its one refused session). Printed: median / min / max ms per host, the collector's CPU
per host, and the ratio one-by-one / one-session measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_hetero_gpu.collect import gather as gather_module  # noqa: E402
from airflow_hetero_gpu.collect.clients import paramiko_client_factory  # noqa: E402
from airflow_hetero_gpu.collect.targets import SshTarget  # noqa: E402
from airflow_hetero_gpu.testing.demo import small_hosts  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--embedded", action="store_true", help="the asyncssh fleet instead of real sshd")
    args = parser.parse_args(argv)
    if args.embedded:
        from airflow_hetero_gpu.testing.embedded import EmbeddedCluster as Cluster  # noqa: PLC0415
    else:
        from airflow_hetero_gpu.testing.cluster import EmulatedCluster as Cluster  # noqa: PLC0415
    print(f"{args.hosts} hosts ({'embedded asyncssh' if args.embedded else 'real sshd'}), {args.reps} reps, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    real = gather_module.run_together
    modes = {"one-session": real, "one-by-one": lambda *a, **k: None}
    walls: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, float] = {m: 0.0 for m in modes}
    with tempfile.TemporaryDirectory(prefix="host-reads-") as tmp, \
            Cluster(Path(tmp) / "fleet", small_hosts(args.hosts, gpus=8), start_timeout=60) as cluster:
        factory = paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)
        clients = [factory(SshTarget(h.name, h.address, h.port, cluster.user)) for h in cluster.hosts]
        try:
            for _ in range(args.reps):
                for mode, together in modes.items():
                    gather_module.run_together = together
                    before = resource.getrusage(resource.RUSAGE_SELF)
                    started = time.perf_counter()
                    for client in clients:
                        files, _warnings, _source = gather_module.gather(client, 60, True)
                        if "topo.txt" not in files or "xid.log" not in files:
                            raise SystemExit(f"{mode}: incomplete capture {sorted(files)}")
                    walls[mode].append((time.perf_counter() - started) / args.hosts * 1000)
                    after = resource.getrusage(resource.RUSAGE_SELF)
                    cpu[mode] += (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        finally:
            gather_module.run_together = real
            for client in clients:
                client.close()
    base = statistics.median(walls["one-by-one"])
    for mode, values in walls.items():
        med = statistics.median(values)
        print(f"  {mode:<12} median {med:7.1f} ms/host  (min {min(values):.1f}, max {max(values):.1f})  "
              f"collector CPU {1000 * cpu[mode] / args.reps / args.hosts:5.1f} ms/host  "
              f"one-by-one/this {base / med:.2f}x")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
