"""The planner's narrowed host input (core/candidates.py) chooses exactly what the selection
chooses among all hosts: the same GPUs, in the same order, at the same mean distance, on random
fleets with mixed wirings, switch tiers, NVLink domains, uneven hosts and random availability."""

from __future__ import annotations

import random

import numpy as np
import pytest

from airflow_hetero_gpu.core.candidates import host_candidates
from airflow_hetero_gpu.core.cluster import build_cluster
from airflow_hetero_gpu.core.model import Gpu, PlanRequest
from airflow_hetero_gpu.core.planner import cluster_state
from airflow_hetero_gpu.core.selection import select_gpus
from airflow_hetero_gpu.core.topology import HostWiring, NetworkTiers, mean_distance
from airflow_hetero_gpu.core.view import PoolView

LABELS = ["NV1", "NV2", "NV12", "PIX", "PXB", "PHB", "NODE", "SYS"]


def _wiring(rng: random.Random, n: int) -> HostWiring:
    style = rng.randrange(3)
    links = {}
    for i in range(n):
        for j in range(i + 1, n):
            if style == 0:
                label = "NV12"
            elif style == 1:  # two sockets
                label = "PHB" if i // 2 == j // 2 else ("NODE" if (i < n // 2) == (j < n // 2) else "SYS")
            else:
                label = rng.choice(LABELS)
            links[(i, j)] = links[(j, i)] = label
    return HostWiring.from_links(range(n), links)


def _fleet(seed: int):
    rng = random.Random(seed)
    n_hosts = rng.randint(2, 60)
    shapes = [(_wiring(rng, n), n) for n in rng.sample([2, 4, 8, 8, 8, 16], 3)]
    gpus, wiring, hosts = [], {}, []
    for h in range(n_hosts):
        host = f"n{rng.randrange(1000):03d}-{h}"
        w, n = rng.choice(shapes)
        wiring[host] = w
        hosts.append(host)
        for i in range(n):
            load = rng.choice([0.0, 0.0, 0.0, 0.5, 1.0])
            sick = rng.random() < 0.03
            gpus.append(Gpu(host, i, f"GPU-{h}-{i}", "NVIDIA A100-SXM4-80GB", 81920, 0.0, load, 40.0,
                            healthy=not sick, reasons=("ecc",) if sick else ()))
    shape = rng.randrange(4)
    if shape == 0:
        net = NetworkTiers.single_switch()
    else:
        order = hosts[:]
        rng.shuffle(order)
        size = rng.randint(2, 6)
        leaves = [order[i:i + size] for i in range(0, len(order), size)]
        groups = [(f"leaf{i}", 1, leaf) for i, leaf in enumerate(leaves)]
        if shape >= 2:
            for s in range(0, len(leaves), 3):
                groups.append((f"spine{s}", 2, [h for leaf in leaves[s:s + 3] for h in leaf]))
        if shape == 3:  # one leaf left out of every spine, and a top switch over some spines
            groups.append(("top", 3, [h for leaf in leaves[:-1] for h in leaf]))
        net = NetworkTiers.from_groups(groups)
    if rng.random() < 0.4:
        domain_hosts = rng.sample(hosts, min(len(hosts), rng.randint(2, 8)))
        net = net.with_domains({h: f"dom{i % 2}" for i, h in enumerate(domain_hosts)})
    return build_cluster(gpus, wiring, net)


@pytest.mark.parametrize("seed", range(120))
def test_narrowed_hosts_choose_what_all_hosts_choose(seed):
    cluster = _fleet(seed)
    rng = random.Random(seed * 7 + 1)
    checked = 0
    for k in sorted({1, 2, 3, 4, 6, 8, 12, 16, 24, rng.randint(1, 40)}):
        state = cluster_state(cluster, PlanRequest(k))
        for pool in cluster.pools:
            view = PoolView(pool, state)
            full = select_gpus(host_candidates(view, k, narrow=False), k, cluster.matrices, cluster.net)
            narrow = select_gpus(host_candidates(view, k), k, cluster.matrices, cluster.net)
            if full is None:
                assert narrow is None
                continue
            checked += 1
            assert narrow is not None, (seed, k)
            assert narrow.keys == full.keys, (seed, k)
            assert narrow.mean_distance == pytest.approx(full.mean_distance, abs=1e-12)
            # d(S) is what mean_distance() says of the GPUs chosen, to the last bit
            assert full.mean_distance == _d(cluster, full.keys), (seed, k)
    assert checked > 0


def _d(cluster, keys) -> float:
    def host_matrix(host):
        rows = {cluster.gpus[p].index: int(cluster.row_of[p])
                for p in range(int(cluster.host_start[cluster.hosts.index(host)]),
                               int(cluster.host_start[cluster.hosts.index(host) + 1]))}
        return rows, cluster.matrices[cluster.host_matrix_ids[cluster.hosts.index(host)]]

    return mean_distance(keys, host_matrix, cluster.net) if len(keys) > 1 else 1.0


def test_narrowing_hands_on_only_the_chosen_hosts():
    cluster = _fleet(3)
    state = cluster_state(cluster, PlanRequest(2))
    view = PoolView(cluster.pools[0], state)
    assert len(host_candidates(view, 2)) == 1 < len(host_candidates(view, 2, narrow=False))


def test_a_host_under_two_switches_of_one_tier_falls_back_to_every_host():
    cluster = _fleet(5)
    h0, h1 = cluster.hosts[0], cluster.hosts[1]
    net = NetworkTiers.from_groups([("a", 1, [h0, h1]), ("b", 1, [h0])])
    odd = build_cluster(cluster.gpus, cluster.wiring, net)
    total = int(np.sum(cluster.healthy)) + 1  # more than any host holds: the job spans hosts
    state = cluster_state(odd, PlanRequest(min(total, 3 * max(len(w.indices) for w in cluster.wiring.values()))))
    view = PoolView(odd.pools[0], state)
    k = state.request.gpus
    assert host_candidates(view, k) == host_candidates(view, k, narrow=False)
