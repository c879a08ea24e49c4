"""The cluster as the planner sees it: inventory + topology + candidate pools (SPEC §4-§6.1).

Built once per collection; :func:`airflow_hetero_gpu.core.planner.plan` then runs against it
many times (one call per request, with the ledger's reservations and evictions of the moment).
Per-GPU facts are kept in numpy arrays so a plan over 100,000 GPUs stays in milliseconds.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Mapping

import networkx as nx
import numpy as np

from airflow_hetero_gpu.core.config import ClusterConfig
from airflow_hetero_gpu.core.model import Gpu, GpuKey
from airflow_hetero_gpu.core.topology import REGISTRY, HostWiring, NetworkTiers, link_weight, mean_distance


@dataclass(frozen=True)
class Pool:
    """A candidate pool (S3): GPUs of one card type supporting the same set of task types.

    ``mig``: its members are MIG instances (card type ``<GPU name> MIG <profile>``), which serve
    1-GPU jobs only.
    """

    id: str
    card_type: str
    task_types: tuple[str, ...]
    positions: np.ndarray  # positions of its GPUs in Cluster.gpus
    mig: bool = False

    @staticmethod
    def make_id(card_type: str, task_types: tuple[str, ...]) -> str:
        if task_types == (card_type,):
            return card_type
        return "+".join(sorted(task_types)) + "@" + card_type


def _with_task_types(g: Gpu, task_types: tuple[str, ...]) -> Gpu:
    """``replace(g, task_types=...)`` for a frozen Gpu, without dataclasses.replace's per-field
    work (it dominated building a 100,000-GPU cluster)."""
    if g.task_types == task_types:
        return g
    new = object.__new__(type(g))  # a copy of its fields (copy.copy goes through __reduce_ex__)
    new.__dict__.update(g.__dict__)
    new.__dict__["task_types"] = task_types
    return new


@dataclass
class Cluster:
    gpus: list[Gpu]
    wiring: dict[str, HostWiring]
    net: NetworkTiers
    config: ClusterConfig
    host_errors: dict[str, str] = field(default_factory=dict)
    host_notes: dict[str, list[str]] = field(default_factory=dict)
    duplicates: dict[str, str] = field(default_factory=dict)  # a second name of a machine -> its first

    def __post_init__(self) -> None:
        self.gpus = sorted(self.gpus, key=lambda g: (g.host, g.index, -1 if g.instance is None else g.instance))
        # task types come from the config (cluster.yaml's rules); stamp them on the GPUs
        types: dict[tuple[str, str], tuple[str, ...]] = {}  # the rules match a host and a card type
        for i, g in enumerate(self.gpus):
            which = (g.host, g.name)
            found = types.get(which)
            if found is None:
                found = types[which] = self.config.task_types_for(g.host, g.name)
            self.gpus[i] = _with_task_types(g, found)
        self.keys = [g.key for g in self.gpus]  # GpuKey by position
        self.position = {k: i for i, k in enumerate(self.keys)}
        if len(self.position) != len(self.gpus):
            seen: set[GpuKey] = set()
            dup = next(g.key for g in self.gpus if g.key in seen or seen.add(g.key))
            raise ValueError(f"GPU {dup} appears twice in the inventory")
        self.hosts = sorted({g.host for g in self.gpus} | set(self.host_errors))
        host_id = {h: i for i, h in enumerate(self.hosts)}
        n = len(self.gpus)
        self.host_of = np.fromiter((host_id[g.host] for g in self.gpus), dtype=np.int64, count=n)
        unknown = self.config.thresholds.unknown_utilization
        self.base_load = np.fromiter((g.load(unknown) for g in self.gpus), dtype=np.float64, count=n)
        self.healthy = np.fromiter((g.healthy for g in self.gpus), dtype=bool, count=n)
        # never handed out although healthy: a MIG-enabled GPU (its instances are), a pending
        # MIG mode change (Gpu.unschedulable says why)
        self.schedulable = np.fromiter((not g.unschedulable for g in self.gpus), dtype=bool, count=n)
        # holds a compute process (core/foreign.py): "in use outside the scheduler" unless reserved
        self.has_processes = np.fromiter((bool(g.outside) for g in self.gpus), dtype=bool, count=n)
        self.instances_of: dict[GpuKey, list[GpuKey]] = {}
        for g in self.gpus:
            if g.instance is not None:
                self.instances_of.setdefault(g.key.gpu, []).append(g.key)
        self.memory_free = np.fromiter(
            (np.nan if g.memory_free_mib is None else g.memory_free_mib for g in self.gpus),
            dtype=np.float64, count=n,
        )
        self.index_of = np.fromiter((g.index for g in self.gpus), dtype=np.int64, count=n)
        # per-host distance matrices, interned by content
        self.matrix_id: dict[str, int] = {}
        self.matrix_row: dict[str, dict[int, int]] = {}
        by_host: dict[str, list[int]] = {}
        for g in self.gpus:
            if g.instance is None:
                by_host.setdefault(g.host, []).append(g.index)
            else:  # a MIG instance sits where its GPU sits
                by_host.setdefault(g.host, [])
        for g in self.gpus:
            if g.instance is not None and g.index not in by_host[g.host]:
                by_host[g.host].append(g.index)
        for host, indices in by_host.items():
            w = self.wiring.get(host)
            if w is None or set(indices) - set(w.indices):
                links = {} if w is None else {
                    (a, b): w.label(a, b) for a in w.indices for b in w.indices if a < b
                }
                w = HostWiring.from_links(indices, links)
                self.wiring[host] = w
            self.matrix_id[host] = REGISTRY.intern(w)
            self.matrix_row[host] = {idx: r for r, idx in enumerate(w.indices)}
        self.matrices = REGISTRY.matrices
        self.host_matrix_ids = [self.matrix_id.get(h, -1) for h in self.hosts]
        self.host_matrix_id_array = np.asarray(self.host_matrix_ids, dtype=np.int64)
        self.is_whole_gpu = np.fromiter((g.instance is None for g in self.gpus), dtype=bool, count=n)
        self.row_of = np.fromiter((self.matrix_row[g.host][g.index] for g in self.gpus), dtype=np.int64, count=n)
        # candidate pools (S3)
        groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for i, g in enumerate(self.gpus):
            groups.setdefault((g.name, g.task_types), []).append(i)
        self.pools = sorted(
            (Pool(Pool.make_id(ct, tt), ct, tt, np.array(pos, dtype=np.int64),
                  mig=self.gpus[pos[0]].instance is not None) for (ct, tt), pos in groups.items()),
            key=lambda p: p.id,
        )
        self.pool_of = np.zeros(n, dtype=np.int64)
        for pi, p in enumerate(self.pools):
            self.pool_of[p.positions] = pi
        self.pool_by_id = {p.id: p for p in self.pools}
        # host h owns positions host_start[h] .. host_start[h + 1] - 1 (GPUs are sorted by host)
        self.host_start = np.searchsorted(self.host_of, np.arange(len(self.hosts) + 1))
        whole = np.bincount(self.host_of[[g.instance is None for g in self.gpus]], minlength=len(self.hosts)) \
            if n else np.zeros(len(self.hosts), dtype=np.int64)
        self.max_host_gpus = int(whole.max(initial=0))
        # multi-node NVLink domains (GB200/GB300 NVL72 partitions), from the GPUs' fabric
        self.host_domain_notes: dict[str, str] = {}
        self.net = self.net.with_domains(self._host_domains())

    def _host_domains(self) -> dict[str, str]:
        """host -> NVLink domain: the one domain every GPU of the host that has one reports.

        A host whose GPUs report different domains gets none (and a note): distances are kept
        per host pair, and guessing one domain could put a job's ranks across two partitions.
        """
        seen: dict[str, set[str]] = {}
        for g in self.gpus:
            if g.instance is None and g.nvlink_domain is not None:
                seen.setdefault(g.host, set()).add(g.nvlink_domain)
        out = {}
        for host, domains in seen.items():
            if len(domains) == 1:
                out[host] = next(iter(domains))
            else:
                self.host_domain_notes[host] = (f"GPUs in {len(domains)} NVLink domains ({', '.join(sorted(domains))}): "
                                                "the host is placed by its network switches only")
        return out

    # --- lookups -----------------------------------------------------------------------------
    def gpu(self, key: tuple[str, int]) -> Gpu:
        return self.gpus[self.position[GpuKey(*key)]]

    def host_matrix(self, host: str):
        return self.matrix_row[host], self.matrices[self.matrix_id[host]]

    def nvlink_domains(self) -> dict[str, list[str]]:
        """Every multi-node NVLink domain (``<cluster UUID>/<clique id>``) with its hosts."""
        return {name: sorted(hosts) for name, hosts in self.net.domains.items()}

    def mean_distance(self, keys) -> float:
        """``d(S)`` of SPEC §5 for any set of GPUs of this cluster."""
        return mean_distance([tuple(k) for k in keys], self.host_matrix, self.net)

    def distance(self, a: tuple, b: tuple) -> int:
        if a[0] == b[0]:
            rows, m = self.host_matrix(a[0])
            return int(m[rows[a[1]], rows[b[1]]])
        return self.net.host_distance(a[0], b[0])

    def pool_of_gpu(self, key: tuple[str, int]) -> Pool:
        return self.pools[int(self.pool_of[self.position[GpuKey(*key)]])]

    @cached_property
    def host_ids(self) -> dict[str, int] | None:
        """Host name -> host number when every position is ``host_start[host] + index`` (whole
        GPUs only, each host's indices 0, 1, ... in order): a key's position is then arithmetic,
        no tuple hashed (:meth:`positions_of`). None otherwise."""
        n = len(self.gpus)
        if n == 0 or not self.is_whole_gpu.all():
            return None
        if not np.array_equal(self.index_of, np.arange(n) - self.host_start[self.host_of]):
            return None
        return {h: i for i, h in enumerate(self.hosts)}

    def positions_of(self, keys: list) -> np.ndarray:
        """Each key's position (-1: a GPU the cluster does not list), as ``position.get`` gives it."""
        ids, n = self.host_ids, len(keys)
        if ids is not None and n:
            try:  # C-level maps; an index that is not an integer (operator.index) takes the slow way
                size = np.fromiter(map(len, keys), dtype=np.int64, count=n)
                idx = np.fromiter(map(operator.index, map(operator.itemgetter(1), keys)), dtype=np.int64, count=n)
                host = np.fromiter(map(ids.get, map(operator.itemgetter(0), keys), itertools.repeat(-1)),
                                   dtype=np.int64, count=n)
            except (TypeError, ValueError, IndexError, OverflowError):
                size = None
            if size is not None:
                start = self.host_start[host]
                ok = (size == 2) & (host >= 0) & (idx >= 0) & (idx < self.host_start[host + 1] - start)
                return np.where(ok, start + idx, -1)
        found = list(map(self.position.get, keys))
        if None in found:
            found = [p if p is not None else self.position.get(GpuKey(*k)) for p, k in zip(found, keys)]
            found = [-1 if p is None else p for p in found]
        return np.array(found, dtype=np.int64)

    @cached_property
    def memory_total(self) -> np.ndarray:
        """Each GPU's total memory in MiB (nan: unknown), read-only."""
        total = np.fromiter((np.nan if g.memory_total_mib is None else g.memory_total_mib for g in self.gpus),
                            dtype=np.float64, count=len(self.gpus))
        total.flags.writeable = False
        return total

    # --- the networkx view (S2) --------------------------------------------------------------
    @cached_property
    def memory_known(self) -> np.ndarray:
        """Whether each GPU's total memory is known (read-only)."""
        known = ~np.isnan(self.memory_total)
        known.flags.writeable = False
        return known

    @cached_property
    def graph(self) -> nx.Graph:
        """The cluster's GPU topology graph.

        Nodes: every GPU ``GpuKey(host, index)`` and MIG instance ``GpuKey(host, index,
        instance)`` (attributes from the inventory), every host ``("host", name)``, every switch
        ``("switch", name)`` and every multi-node NVLink domain ``("nvlink-domain", name)``.
        GPU-GPU edges inside a host carry the ``topo -m`` label (``link``) and its weight;
        ``uplink`` edges join GPUs to their host, hosts to their tier-1 switch and switches to
        their parents; ``mig`` edges join a MIG instance to its GPU; ``nvlink-domain`` edges join
        the hosts of a domain to it. Distances between hosts are 10 × the tier of the lowest common
        switch (SPEC §5), or the NVLink distance inside a domain, see :meth:`distance`.
        """
        g = nx.Graph()
        for gpu in self.gpus:
            g.add_node(gpu.key, kind="mig" if gpu.instance is not None else "gpu", **gpu.to_json(),
                       pool=self.pool_of_gpu(gpu.key).id)
            if gpu.instance is not None:
                g.add_edge(gpu.key.gpu, gpu.key, kind="mig")
        for host in self.hosts:
            g.add_node(("host", host), kind="host", error=self.host_errors.get(host),
                       nvlink_domain=self.net.domain_of.get(host))
        for name, members in self.net.domains.items():
            g.add_node(("nvlink-domain", name), kind="nvlink-domain")
            for host in sorted(members):
                g.add_edge(("host", host), ("nvlink-domain", name), kind="nvlink-domain")
        for host, w in self.wiring.items():
            for a in w.indices:
                if GpuKey(host, a) in self.position:
                    g.add_edge(("host", host), GpuKey(host, a), kind="uplink")
            for i, a in enumerate(w.indices):
                for b in w.indices[i + 1:]:
                    if GpuKey(host, a) in self.position and GpuKey(host, b) in self.position:
                        label = w.label(a, b)
                        g.add_edge(GpuKey(host, a), GpuKey(host, b), kind="link", link=label, weight=link_weight(label))
        if self.net.flat:
            g.add_node(("switch", "(all hosts)"), kind="switch", tier=1)
            for host in self.hosts:
                g.add_edge(("host", host), ("switch", "(all hosts)"), kind="uplink")
        else:
            for name, tier, members in self.net.groups:
                g.add_node(("switch", name), kind="switch", tier=tier)
            for name, tier, members in self.net.groups:
                # parent: the lowest-tier group strictly above that contains all members
                parents = [p for p, t, m in self.net.groups if t > tier and members <= m]
                if parents:
                    g.add_edge(("switch", name), ("switch", parents[0]), kind="uplink")
                if tier == 1:
                    for host in members:
                        if host in self.hosts:
                            g.add_edge(("host", host), ("switch", name), kind="uplink")
        return g


def build_cluster(
    gpus: Iterable[Gpu],
    wiring: Mapping[str, HostWiring] | None = None,
    net: NetworkTiers | None = None,
    config: ClusterConfig | None = None,
    host_errors: Mapping[str, str] | None = None,
) -> Cluster:
    return Cluster(
        gpus=list(gpus),
        wiring=dict(wiring or {}),
        net=net or NetworkTiers.single_switch(),
        config=config or ClusterConfig(),
        host_errors=dict(host_errors or {}),
    )
