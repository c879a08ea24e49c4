"""Parallel SSH collection versus one host at a time, on an emulated fleet.

::

    python benchmarks/collect_scaling.py                       # 64 hosts, 0.3 s nvidia-smi, 3 reps
    python benchmarks/collect_scaling.py --hosts 32 --reps 5 --parallel 1,8,16,32

Starts N emulated GPU hosts (a real ``sshd`` each, on 127.0.0.x) whose fake ``nvidia-smi`` sleeps
``--delay`` seconds before answering, as a real one takes 0.1-1 s to talk to the driver. Then, in
the same run and interleaved so that drift hits every mode alike, it collects the whole fleet with
``collect_captures`` at each ``--parallel`` bound, ``--reps`` times, and prints the median wall
time, the speed-up over ``max_parallel=1``, and how busy this machine's CPUs were meanwhile.

Every emulated host runs on this machine, so the remote side's work (sshd forks, key exchange,
three Python-based fake tools per host) competes for the same cores as the collector; on a real
fleet each host does its own share. The script therefore also measures the CPU time both sides
spend per host (the remote side from the sshd listeners' reaped-children counters in /proc, the
collector from ``getrusage``) and prints the floor that CPU work puts under any fan-out on this
machine: total CPU seconds / cores.
"""

from __future__ import annotations

import argparse
import os
import resource
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_hetero_gpu.collect.ssh import collect_captures, paramiko_client_factory  # noqa: E402
from airflow_hetero_gpu.collect.targets import parse_hosts_arg  # noqa: E402
from airflow_hetero_gpu.testing import EmulatedCluster, sshd_available  # noqa: E402
from airflow_hetero_gpu.testing.demo import A100_80, H200, RTX_4090, V100_32, make_gpus  # noqa: E402
from airflow_hetero_gpu.testing.state import HostSpec  # noqa: E402

MODELS = (A100_80, V100_32, RTX_4090, H200)
BUS = ("07", "0F", "47", "4E", "87", "90", "B7", "BD")


def fleet(count: int, gpus: int = 8) -> list[HostSpec]:
    """``count`` hosts of 8 GPUs, the four card models in turn, fully NVLinked matrices."""
    matrix = [["X" if i == j else "NV12" for j in range(gpus)] for i in range(gpus)]
    specs = []
    for n in range(count):
        name = f"gpu{n + 1:03d}"
        model = MODELS[n % len(MODELS)]
        specs.append(HostSpec(name, make_gpus(name, model, BUS[:gpus]),
                              {"matrix": matrix, "cpu_affinity": ["0-31"] * gpus, "numa_affinity": ["0"] * gpus}))
    return specs


def cpu_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def remote_cpu_seconds(cluster: EmulatedCluster) -> float:
    """CPU seconds used so far by every host's sshd and everything it ran and reaped (sessions,
    shells, fake tools): utime + stime + cutime + cstime of the listeners, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in cluster.sshd_pids().values():
        if pid is None:
            continue
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / ticks


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Run:
    """One full collection: wall time, machine CPU busy share, CPU seconds of each side."""

    def __init__(self, wall: float, busy: float, remote_cpu: float, collector_cpu: float, ok: int):
        self.wall, self.busy, self.remote_cpu, self.collector_cpu, self.ok = wall, busy, remote_cpu, collector_cpu, ok


def run_once(cluster: EmulatedCluster, parallel: int, timeout: float) -> Run:
    targets = parse_hosts_arg(cluster.hosts_arg())
    factory = paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)
    with tempfile.TemporaryDirectory(prefix="collect-bench-") as out:
        busy0, total0 = cpu_busy()
        remote0, own0 = remote_cpu_seconds(cluster), own_cpu_seconds()
        started = time.perf_counter()
        report = collect_captures(targets, out, factory, max_parallel=parallel,
                                  connect_timeout=timeout, command_timeout=timeout, retries=0)
        wall = time.perf_counter() - started
        time.sleep(0.2)  # let the listeners reap their last session processes
        remote1, own1 = remote_cpu_seconds(cluster), own_cpu_seconds()
        busy1, total1 = cpu_busy()
    failed = [f"{h.host}: {h.reason}" for h in report.failed]
    if failed:
        print("  failed hosts:", "; ".join(failed[:3]), file=sys.stderr)
    return Run(wall, (busy1 - busy0) / max(1, total1 - total0), remote1 - remote0, own1 - own0, len(report.ok))


def measure(cluster: EmulatedCluster, modes: list[int], reps: int, timeout: float) -> dict[int, list[Run]]:
    runs: dict[int, list[Run]] = {m: [] for m in modes}
    for rep in range(reps):
        for mode in modes:
            run = run_once(cluster, mode, timeout)
            runs[mode].append(run)
            print(f"  rep {rep + 1}/{reps}  max_parallel={mode:<3d} {run.wall:7.2f} s  machine CPU busy "
                  f"{run.busy:4.0%}  remote CPU {run.remote_cpu:6.1f} s  collector CPU {run.collector_cpu:5.1f} s  "
                  f"ok {run.ok}", file=sys.stderr, flush=True)
    return runs


def report(title: str, runs: dict[int, list[Run]], hosts: int) -> None:
    base = statistics.median(r.wall for r in runs[min(runs)])
    cores = os.cpu_count() or 1
    print(title)
    print(f"  {'max_parallel':>12} {'median s':>9} {'min s':>7} {'max s':>7} {'speed-up':>8} {'CPU busy':>8} "
          f"{'remote CPU/host':>15} {'collector CPU/host':>18} {'CPU floor s':>11}")
    for mode, values in runs.items():
        walls = [r.wall for r in values]
        med = statistics.median(walls)
        remote = statistics.median(r.remote_cpu for r in values)
        own = statistics.median(r.collector_cpu for r in values)
        print(f"  {mode:>12} {med:9.2f} {min(walls):7.2f} {max(walls):7.2f} {base / med:7.1f}x "
              f"{statistics.median(r.busy for r in values):8.0%} {1000 * remote / hosts:12.0f} ms "
              f"{1000 * own / hosts:15.0f} ms {(remote + own) / cores:11.1f}")
    # The one-by-one run's CPU is the work itself; wider fan-outs add contention on top of it.
    floor = statistics.median((r.remote_cpu + r.collector_cpu) / cores for r in runs[min(runs)])
    print(f"  CPU floor = (remote + collector CPU seconds of the one-by-one run) / {cores} cores = {floor:.1f} s: "
          f"no fan-out on this machine can beat it, so {base / floor:.1f}x is the most any could show here")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--delay", type=float, default=0.3, help="seconds each fake nvidia-smi call sleeps")
    parser.add_argument("--parallel", default="1,8,16", help="max_parallel values, comma separated")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0, help="connect and command timeout")
    args = parser.parse_args(argv)
    if not sshd_available():
        print("needs the OpenSSH server (apt-get install openssh-server)", file=sys.stderr)
        return 2
    modes = sorted({int(v) for v in args.parallel.split(",")})
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory(prefix="collect-bench-cluster-") as root:
        started = time.perf_counter()
        with EmulatedCluster(Path(root), fleet(args.hosts)) as cluster:
            print(f"{args.hosts} emulated hosts started in {time.perf_counter() - started:.1f} s; "
                  f"each collection: nvidia-smi --query-gpu, nvidia-smi topo -m, journalctl -k per host")
            for host in cluster.hosts:
                cluster.set_state(host.name, nvidia_smi_delay_s=args.delay)
            runs = measure(cluster, modes, args.reps, args.timeout)
            report(f"nvidia-smi delay {args.delay:g} s, {args.reps} reps, {args.hosts} hosts", runs, args.hosts)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
