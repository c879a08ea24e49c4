"""How long the readers of raw outputs take: one host's query CSV and ``topo -m``, a 10,000-host
``topology.conf``, the inventory of a whole fleet read back from the ledger's texts.

Each figure is the median (and p95) of ``--repeat`` timed calls, beside a baseline timed in the
same run: Python's own ``csv`` module splitting the same text (what reading the bytes costs
at least), so the ratio says what the validation and interpretation add.

    python benchmarks/capture_parse.py [--repeat 50] [--hosts 1000]
"""

from __future__ import annotations

import argparse
import csv
import io
import platform
import statistics
import time

from airflow_hetero_gpu.capture.directory import parse_host
from airflow_hetero_gpu.capture.query import parse_query_csv
from airflow_hetero_gpu.capture.slurm import parse_topology_conf
from airflow_hetero_gpu.capture.topo import parse_topo
from airflow_hetero_gpu.testing.captures import host_files
from airflow_hetero_gpu.testing.demo import small_hosts



def timed(fn, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.95 * len(times)))]


def split(text: str) -> None:
    list(csv.reader(io.StringIO(text)))


def row(name: str, fn, baseline, repeat: int) -> str:
    med, p95 = timed(fn, repeat)
    base, _ = timed(baseline, repeat)
    return f"{name:<44} {med * 1e3:9.3f} ms  p95 {p95 * 1e3:9.3f} ms   csv split {base * 1e3:8.3f} ms   ratio {med / base:6.1f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--hosts", type=int, default=1000, help="hosts in the fleet read back from texts")
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {args.repeat} repetitions, medians")

    spec = small_hosts(1, gpus=8)[0]
    files = host_files(spec)
    query, topo = files["query.csv"], files["topo.txt"]
    print(row("query CSV, 8 GPUs", lambda: parse_query_csv(query, "query.csv"), lambda: split(query), args.repeat))
    print(row("topo -m, 8 GPUs", lambda: parse_topo(topo, "topo.txt"), lambda: split(topo), args.repeat))

    leaves = "\n".join(f"SwitchName=leaf{i} Nodes=n{i}-[000-099]" for i in range(100))
    spines = "\n".join(f"SwitchName=spine{j} Switches=leaf[{10 * j}-{10 * j + 9}]" for j in range(10))
    conf = f"{leaves}\n{spines}\nSwitchName=core Switches=spine[0-9]\n"
    repeat = max(3, args.repeat // 10)
    print(row("topology.conf, 10,000 hosts, 3 tiers", lambda: parse_topology_conf(conf, "topology.conf"),
              lambda: split(conf), repeat))

    fleet = [host_files(s) for s in small_hosts(args.hosts, gpus=8)]
    joined = "".join(f["query.csv"] + f["topo.txt"] for f in fleet)

    def read_fleet():
        for i, f in enumerate(fleet):
            parse_host(f"n{i}", f, f"n{i}")

    print(row(f"a fleet's texts, {args.hosts} hosts x 8 GPUs", read_fleet, lambda: split(joined), repeat))


if __name__ == "__main__":
    main()
