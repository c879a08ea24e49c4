"""Latency of one ``plan()`` call on synthetic clusters of 1,000 / 10,000 / 100,000 GPUs.

Hosts of 8 GPUs with real intra-host wirings (DGX-1 V100 hybrid cube mesh, HGX A100 NV12,
HGX H100 NV18, an 8 × RTX 4090 PCIe box), four card types, two task-type rules, ~40 % of the
GPUs loaded, ~1 % unhealthy, hosts in racks of 16 under leaf switches under spines
(topology.conf-style tiers). For each size and each request of 1, 4, 8 and 16 GPUs (any card
type, so every pool is evaluated: the worst case) it prints the median and p95 of ``plan()``
beside a plain first-fit baseline (first k available GPUs of one pool in inventory order)
timed in the same run, and the ratio of the medians.

    python benchmarks/plan_latency.py [--sizes 1000,10000,100000] [--repeat 30] [--baseline REV]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import time

import numpy as np

from airflow_hetero_gpu.core.cluster import build_cluster
from airflow_hetero_gpu.core.config import config_from_mapping
from airflow_hetero_gpu.core.model import Gpu, PlanRequest
from airflow_hetero_gpu.core.planner import cluster_state, plan
from airflow_hetero_gpu.core.topology import HostWiring, NetworkTiers

DGX1 = [
    "X NV1 NV1 NV2 NV2 SYS SYS SYS", "NV1 X NV2 NV1 SYS NV2 SYS SYS", "NV1 NV2 X NV2 SYS SYS NV1 SYS",
    "NV2 NV1 NV2 X SYS SYS SYS NV1", "NV2 SYS SYS SYS X NV1 NV1 NV2", "SYS NV2 SYS SYS NV1 X NV2 NV1",
    "SYS SYS NV1 SYS NV1 NV2 X NV2", "SYS SYS SYS NV1 NV2 NV1 NV2 X",
]
RTX8 = [  # 8 x RTX 4090: PHB pairs, NODE inside a socket, SYS across (cf. topo/8x-rtx4090-pcie-*)
    "X PHB NODE NODE SYS SYS SYS SYS", "PHB X NODE NODE SYS SYS SYS SYS", "NODE NODE X PHB SYS SYS SYS SYS",
    "NODE NODE PHB X SYS SYS SYS SYS", "SYS SYS SYS SYS X PHB NODE NODE", "SYS SYS SYS SYS PHB X NODE NODE",
    "SYS SYS SYS SYS NODE NODE X PHB", "SYS SYS SYS SYS NODE NODE PHB X",
]


def _wiring(rows=None, label=None) -> HostWiring:
    if rows:
        links = {(i, j): c for i, r in enumerate(rows) for j, c in enumerate(r.split()) if i != j}
    else:
        links = {(i, j): label for i in range(8) for j in range(8) if i != j}
    return HostWiring.from_links(range(8), links)


KINDS = [  # card type, memory MiB, wiring
    ("Tesla V100-SXM2-32GB", 32768, _wiring(DGX1)),
    ("NVIDIA A100-SXM4-80GB", 81920, _wiring(label="NV12")),
    ("NVIDIA H100 80GB HBM3", 81559, _wiring(label="NV18")),
    ("NVIDIA GeForce RTX 4090", 24564, _wiring(RTX8)),
]
CONFIG = config_from_mapping({"task_types": {
    "hosts": {"h*[05]": ["llm-pretrain", "finetune"]},
    "models": {"RTX 4090": ["finetune", "cv"]},
}})


def synthetic_cluster(n_gpus: int, seed: int = 7):
    rng = random.Random(seed)
    gpus, wiring = [], {}
    n_hosts = n_gpus // 8
    for h in range(n_hosts):
        host = f"h{h:06d}"
        card, mem, w = KINDS[h % len(KINDS)]
        wiring[host] = w
        for i in range(8):
            loaded = rng.random() < 0.4
            util = rng.choice([0.35, 0.6, 0.95, 1.0]) if loaded else 0.0
            sick = rng.random() < 0.01
            gpus.append(Gpu(host, i, f"GPU-{h}-{i}", card, mem, 0.0, util, 40.0,
                            healthy=not sick, reasons=("ecc",) if sick else ()))
    hosts = sorted(wiring)
    racks = [hosts[i:i + 16] for i in range(0, len(hosts), 16)]
    groups = [(f"leaf{r}", 1, rack) for r, rack in enumerate(racks)]
    for s in range(0, len(racks), 32):
        members = [h for rack in racks[s:s + 32] for h in rack]
        groups.append((f"spine{s // 32}", 2, members))
    return build_cluster(gpus, wiring, NetworkTiers.from_groups(groups), CONFIG)


def first_fit(cluster, request: PlanRequest):
    """Baseline: the first pool in id order with k available GPUs, its first k in inventory order."""
    state = cluster_state(cluster, request)
    for pool in cluster.pools:
        pos = pool.positions[state.available[pool.positions]]
        if len(pos) >= request.gpus:
            return [cluster.gpus[int(p)].key for p in pos[: request.gpus]]
    return None


def timed(fn, repeat: int) -> list[float]:
    fn()  # warm caches (distance matrices, subset cache), as a long-running scheduler would be
    out = []
    gc.disable()
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return out


def p95(xs: list[float]) -> float:
    return float(np.percentile(xs, 95))


def measure(sizes, repeat: int) -> list[dict]:
    rows = []
    for size in sizes:
        t0 = time.perf_counter()
        cluster = synthetic_cluster(size)
        build = time.perf_counter() - t0
        for k in (1, 4, 8, 16):
            req = PlanRequest(k)
            result = plan(cluster, req)
            tp = timed(lambda: plan(cluster, req), repeat)
            tf = timed(lambda: first_fit(cluster, req), repeat)
            placed = f"{result.decision.pool} on {len(result.decision.hosts)} host(s)" if result.decision else "-"
            rows.append({"gpus": size, "k": k, "plan_p50": statistics.median(tp), "plan_p95": p95(tp),
                         "ff_p50": statistics.median(tf), "ff_p95": p95(tf), "placed": placed,
                         "gpus_chosen": [list(g.key) for g in result.decision.gpus] if result.decision else None,
                         "build": build})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--baseline", metavar="REV", help="also time the package at this git revision (same run)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # baseline runs
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.json:
        print(json.dumps(measure(sizes, args.repeat)))
        return
    base = {}
    if args.baseline:
        import baseline
        for row in baseline.run(args.baseline, __file__, ["--sizes", args.sizes, "--repeat", str(args.repeat)]):
            base[(row["gpus"], row["k"])] = row
    rows = measure(sizes, args.repeat)
    print(f"python {platform.python_version()} on {platform.machine()}, repeat {args.repeat}, times in ms")
    extra = f" {'base p50':>9} {'x base':>7}" if base else ""
    print(f"{'GPUs':>7} {'k':>3} {'plan p50':>9} {'plan p95':>9}{extra} {'ff p50':>8} {'ff p95':>8} {'ratio':>6}  placed")
    for row in rows:
        b = base.get((row["gpus"], row["k"]))
        cols = ""
        if b:
            same = "" if b["gpus_chosen"] == row["gpus_chosen"] else "  (baseline chose other GPUs)"
            cols = f" {b['plan_p50'] * 1e3:>9.2f} {row['plan_p50'] / b['plan_p50']:>7.2f}"
            row["placed"] += same
        print(f"{row['gpus']:>7} {row['k']:>3} {row['plan_p50'] * 1e3:>9.2f} {row['plan_p95'] * 1e3:>9.2f}{cols}"
              f" {row['ff_p50'] * 1e3:>8.2f} {row['ff_p95'] * 1e3:>8.2f} {row['plan_p50'] / row['ff_p50']:>6.1f}"
              f"  {row['placed']}")
        if row["k"] == 16:
            print(f"{row['gpus']:>7}     (cluster build, once per collection: {row['build'] * 1e3:.0f} ms)")
    if base:
        print(f"base: the package at {baseline.revision(args.baseline)}, timed in a subprocess of this run")


if __name__ == "__main__":
    main()
