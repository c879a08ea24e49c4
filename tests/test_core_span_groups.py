"""``NetworkTiers.spanning_groups_among``: the groups a multi-host selection walks are exactly the
entries of ``spanning_groups`` that hold one of its hosts (or stand for every host), in the same
order, so the selection chooses as it did when it walked every group."""

from __future__ import annotations

import random

import pytest

from airflow_hetero_gpu.core.topology import NetworkTiers


def _tree(rng: random.Random, hosts: list[str]) -> NetworkTiers:
    leaves = [(f"leaf{i}", 1, hosts[i::7]) for i in range(7)]
    spines = [(f"spine{i}", 2, [h for leaf in leaves[i::2] for h in leaf[2]]) for i in range(2)]
    net = NetworkTiers.from_groups(leaves + spines)
    if rng.random() < 0.5:
        net = net.with_domains({h: f"nvl{i % 3}" for i, h in enumerate(hosts[:12])})
    return net


def _expected(net: NetworkTiers, names: set[str]) -> list[tuple[str, int]]:
    rows = net.spanning_groups(())
    inner = [(n, t) for n, t, _ in rows[:-1] if n in names or n in ("(all hosts)", "(no common switch)")]
    return inner + [(rows[-1][0], rows[-1][1])]


@pytest.mark.parametrize("seed", range(20))
def test_the_groups_walked_are_those_holding_a_host_in_spanning_order(seed):
    rng = random.Random(seed)
    hosts = [f"h{i:02d}" for i in range(40)]
    net = _tree(rng, hosts) if seed % 4 else NetworkTiers.single_switch().with_domains({"h01": "d", "h02": "d"})
    chosen = rng.sample(hosts, rng.randint(1, 10))
    names = {g for h in chosen for g in net.groups_of(h)}
    assert net.spanning_groups_among(names) == _expected(net, names)
    assert net.spanning_groups_among(set()) == _expected(net, set())  # the whole set alone


def test_a_group_replaced_on_the_network_is_seen():
    net = NetworkTiers.from_groups([("a", 1, ["x"]), ("b", 1, ["y"])])
    assert net.spanning_groups_among({"a"}) == [("a", 1), ("(no common switch)", 2)]
    net.groups = [("b", 1, frozenset({"y"}))]  # a new list: the kept order is rebuilt
    assert net.spanning_groups_among({"a", "b"}) == [("b", 1), ("(no common switch)", 2)]
