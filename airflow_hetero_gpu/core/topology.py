"""Topology and distances (SPEC §5).

Inside a host: every GPU pair has an edge weighted by its ``topo -m`` link (NV# 1, PIX 2, PXB 3,
PHB 4, NODE 5, SYS/SOC 6); the distance is the weighted shortest path, so on a DGX-1 two GPUs
without a direct NVLink are 2 apart through a third GPU. Between hosts: 10 × the tier of the
lowest switch both hang under (no ``topology.conf``: one tier-1 switch, distance 10; no common
switch: 10 × (highest tier + 1)); but hosts in one multi-node NVLink domain (the GPUs' fabric
clique: GB200/GB300 NVL72 trays of one rack partition) are :data:`NVLINK_DOMAIN_DISTANCE` apart,
the weight of an NVLink inside a host: their GPUs reach each other through one NVLink switch hop,
as the GPUs of an NVSwitch host do, and closer than any network switch.

Distance matrices are computed once per distinct matrix *content* and shared by every host
that has the same wiring, so a 10,000-host fleet of DGX boxes costs one shortest-path run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import combinations
from typing import Iterable, Mapping, Sequence

import networkx as nx
import numpy as np

from airflow_hetero_gpu.capture.topo import link_weight

UNKNOWN_LINK = "SYS"  # a pair the host's matrix does not cover is treated as the farthest link
INTER_HOST_UNIT = 10
#: Distance between GPUs of two hosts in one NVLink domain: an NV# link's weight (SPEC §5).
NVLINK_DOMAIN_DISTANCE = 1
#: The pseudo tier of an NVLink domain among the host groups a multi-host job may span.
DOMAIN_TIER = 0


@dataclass(frozen=True)
class HostWiring:
    """The GPU-to-GPU part of one host's ``topo -m`` matrix, by nvidia-smi index."""

    indices: tuple[int, ...]
    labels: tuple[str, ...]  # row-major upper triangle (i < j) in ``indices`` order

    @classmethod
    def from_links(cls, indices: Iterable[int], links: Mapping[tuple[int, int], str]) -> "HostWiring":
        idx = tuple(sorted(indices))
        labels = tuple(
            links.get((a, b)) or links.get((b, a)) or UNKNOWN_LINK for a, b in combinations(idx, 2)
        )
        return cls(idx, labels)

    def label(self, a: int, b: int) -> str:
        if a == b:
            return "X"
        i, j = sorted((self.indices.index(a), self.indices.index(b)))
        n = len(self.indices)
        return self.labels[i * n - i * (i + 1) // 2 + (j - i - 1)]


class _DistanceRegistry:
    """Interns distance matrices by wiring content; hosts with equal wiring share an id."""

    def __init__(self) -> None:
        self._ids: dict[HostWiring, int] = {}
        self.matrices: list[np.ndarray] = []

    def intern(self, wiring: HostWiring) -> int:
        mid = self._ids.get(wiring)
        if mid is None:
            mid = len(self.matrices)
            self.matrices.append(_shortest_paths(wiring))
            self._ids[wiring] = mid
        return mid


def host_graph(wiring: HostWiring) -> nx.Graph:
    """One host's GPUs as a weighted complete graph (edge attributes ``link`` and ``weight``)."""
    g = nx.Graph()
    g.add_nodes_from(wiring.indices)
    for (a, b), label in zip(combinations(wiring.indices, 2), wiring.labels):
        g.add_edge(a, b, link=label, weight=link_weight(label))
    return g


def _shortest_paths(wiring: HostWiring) -> np.ndarray:
    n = len(wiring.indices)
    if n == 0:
        return np.zeros((0, 0), dtype=np.int64)
    d = nx.floyd_warshall_numpy(host_graph(wiring), nodelist=list(wiring.indices), weight="weight")
    return np.rint(d).astype(np.int64)


REGISTRY = _DistanceRegistry()

_WHOLE_SET = ("(all hosts)", "(no common switch)")  # the names a selection reads as every host


@dataclass
class NetworkTiers:
    """Switch tiers between hosts, from ``topology.conf`` (or one tier-1 switch for all)."""

    # (switch name, tier, hosts under it at any depth); sorted by tier then name
    groups: list[tuple[str, int, frozenset[str]]] = field(default_factory=list)
    max_tier: int = 1
    flat: bool = True  # no topology.conf: every host under one tier-1 switch
    _host_groups: dict[str, list[tuple[int, str]]] = field(default_factory=dict, repr=False)
    # multi-node NVLink domains: host -> domain name, and the hosts of each domain
    domain_of: dict[str, str] = field(default_factory=dict)
    domains: dict[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def single_switch(cls) -> "NetworkTiers":
        return cls()

    @classmethod
    def from_groups(cls, groups: Iterable[tuple[str, int, Iterable[str]]]) -> "NetworkTiers":
        gs = sorted(((n, t, frozenset(h)) for n, t, h in groups), key=lambda g: (g[1], g[0]))
        host_groups: dict[str, list[tuple[int, str]]] = {}
        for name, tier, hosts in gs:
            for h in hosts:
                host_groups.setdefault(h, []).append((tier, name))
        return cls(groups=gs, max_tier=max((t for _, t, _ in gs), default=0), flat=False,
                   _host_groups=host_groups)

    def with_domains(self, domain_of: Mapping[str, str]) -> "NetworkTiers":
        """A copy whose hosts ``domain_of`` names sit in those NVLink domains (host -> domain)."""
        members: dict[str, set[str]] = {}
        for host, domain in domain_of.items():
            members.setdefault(domain, set()).add(host)
        return replace(self, domain_of=dict(domain_of),
                       domains={d: frozenset(h) for d, h in sorted(members.items())})

    def tier(self, a: str, b: str) -> int:
        """Tier of the lowest switch holding both hosts; ``max_tier + 1`` when none does."""
        if self.flat:
            return 1
        ga = self._host_groups.get(a)
        if not ga:
            return self.max_tier + 1
        gb = {name for _, name in self._host_groups.get(b, ())}
        for tier, name in ga:  # sorted by tier
            if name in gb:
                return tier
        return self.max_tier + 1

    def host_distance(self, a: str, b: str) -> int:
        """The distance between two hosts' GPUs (kept per pair: a spanning selection asks it for
        every pair of its hosts, for every group it tries)."""
        kept = self.__dict__.get("_distances")
        if kept is None or kept[0] is not self.groups or kept[1] is not self.domain_of or kept[2] != self.flat:
            kept = self.__dict__["_distances"] = (self.groups, self.domain_of, self.flat, {})
        d = kept[3].get((a, b))
        if d is None:
            if len(kept[3]) >= 100_000:  # about 15 MB
                kept[3].clear()
            d = kept[3][(a, b)] = self._host_distance(a, b)
        return d

    def _host_distance(self, a: str, b: str) -> int:
        domain = self.domain_of.get(a)
        if domain is not None and domain == self.domain_of.get(b):
            return NVLINK_DOMAIN_DISTANCE
        return INTER_HOST_UNIT * self.tier(a, b)

    def groups_of(self, host: str) -> list[str]:
        """The NVLink domain and the switches ``host`` hangs under, closest first."""
        domain = self.domain_of.get(host)
        return ([] if domain is None else [domain]) + [name for _, name in self._host_groups.get(host, ())]

    def spanning_groups(self, hosts: Iterable[str]) -> list[tuple[str, int, frozenset[str]]]:
        """Candidate host groups for a multi-host job, closest first: NVLink domains (tier
        :data:`DOMAIN_TIER`), then switches by tier; the last one, the whole set, stands for
        "no common switch"."""
        everyone = frozenset(hosts)
        domains = [(name, DOMAIN_TIER, members) for name, members in self.domains.items()]
        if self.flat:
            return [*domains, ("(all hosts)", 1, everyone)]
        return [*domains, *self.groups, ("(no common switch)", self.max_tier + 1, everyone)]

    def spanning_groups_among(self, names: Iterable[str]) -> list[tuple[str, int]]:
        """(name, tier) of the :meth:`spanning_groups` a host set can use, in the same order:
        the domains and switches named in ``names`` (the groups its hosts hang under), then the
        whole set. The others hold none of its hosts; at 100,000 GPUs there are thousands of
        them, so this is what a multi-host selection walks instead of every group."""
        kept = self.__dict__.get("_span_order")
        if kept is None or kept[0] is not self.groups or kept[1] is not self.domains or kept[2] != self.flat:
            entries = [(n, DOMAIN_TIER) for n in self.domains] + ([] if self.flat else [(n, t) for n, t, _ in self.groups])
            where: dict[str, list[int]] = {}
            for i, (n, _) in enumerate(entries):
                where.setdefault(n, []).append(i)
            special = [i for i, (n, _) in enumerate(entries) if n in _WHOLE_SET]  # taken as the whole set
            kept = self.__dict__["_span_order"] = (self.groups, self.domains, self.flat, entries, where, special)
        entries, where, special = kept[3], kept[4], kept[5]
        found = set(special)
        for n in names:
            found.update(where.get(n, ()))
        last = ("(all hosts)", 1) if self.flat else ("(no common switch)", self.max_tier + 1)
        return [entries[i] for i in sorted(found)] + [last]


def mean_distance(keys: Sequence[tuple], host_matrix, net: NetworkTiers) -> float:
    """``d(S)``: mean distance over all unordered pairs of ``keys``; 1 for a single GPU.

    ``keys`` are ``(host, index[, instance])``; ``host_matrix(host) -> (row_of_index, matrix)``
    gives a host's distance matrix.
    """
    if len(keys) <= 1:
        return 1.0
    by_host: dict[str, list[int]] = {}
    for key in keys:
        by_host.setdefault(key[0], []).append(key[1])
    total = 0
    for host, idx in by_host.items():
        if len(idx) > 1:
            rows, m = host_matrix(host)
            r = [rows[i] for i in idx]
            sub = m[r][:, r]
            total += int(sub.sum()) // 2
    total += across_hosts([(host, len(idx)) for host, idx in by_host.items()], net)
    k = len(keys)
    return total / (k * (k - 1) / 2)


def across_hosts(shares: Sequence[tuple[str, int]], net: NetworkTiers) -> int:
    """The pair-distance sum of a set's pairs on different hosts: ``shares`` is each host with
    the number of the set's GPUs on it (each host once)."""
    total = 0
    for i, (a, ta) in enumerate(shares):
        for b, tb in shares[i + 1:]:
            total += net.host_distance(a, b) * ta * tb
    return total
