"""The simulated cluster: hosts from a node list, each wired like a real server of its GPU model.

Node list columns (Alibaba's ``openb_node_list_gpu_node.csv`` has them): ``sn`` (host name),
``gpu`` (GPU count), ``model`` (card type); an optional ``topo`` column names an
``nvidia-smi topo -m`` file (relative to the list) that wires that host. Hosts without a GPU are
skipped. Without a ``topo`` cell a host is wired by :data:`LAYOUTS`, from real ``topo -m`` outputs
kept in ``sim/topologies/`` (see ``docs/simulation.md`` for their sources):

============================  ===================================================================
8 × V100 (V100M16, V100M32)   DGX-1 hybrid cube mesh (NV1/NV2; pairs without NVLink are 2 apart)
4 × V100                      one NVLink quad of that DGX-1 (GPUs 0-3, all pairs NVLink)
8 × G2 (undisclosed model)    NVSwitch board, all pairs NV12 (HGX/DGX A100 layout) - assumed
8 × G3 (undisclosed model)    PCIe, two switches of four (PIX), PHB between (8 × P100 box) - assumed
4 × any other (T4)            PCIe, NODE pairs, SYS across sockets (a 4-GPU PCIe server)
2 × any (T4, P100)            PCIe, PHB
1 × any                       no links
other counts                  every pair PHB
============================  ===================================================================

Hosts hang under switches in node-list order: ``hosts_per_leaf`` hosts a leaf (tier 1),
``leaves_per_spine`` leaves a spine (tier 2), every spine under one core (tier 3); so two GPUs of
one host are 1-6 apart, of one leaf 10, of one spine 20, else 30 (SPEC §5).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import combinations
from pathlib import Path
from typing import Sequence

from airflow_hetero_gpu.core.cluster import Cluster, build_cluster
from airflow_hetero_gpu.core.model import Gpu
from airflow_hetero_gpu.core.topology import HostWiring, NetworkTiers
from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.sim.csvio import number, open_csv

TOPOLOGIES = Path(__file__).with_name("topologies")
NODE_COLUMNS = ("sn", "gpu", "model")


@dataclass(frozen=True)
class Layout:
    """Where a host's wiring comes from: a ``topo -m`` file (its first ``gpus`` GPUs) or one label."""

    name: str
    file: str | None = None
    label: str | None = None  # every pair gets this label (no file)


# (card type glob, GPU count or None for any) -> layout; first match wins
LAYOUTS: list[tuple[str, int | None, Layout]] = [
    ("v100*", 8, Layout("DGX-1 V100 hybrid cube mesh", "dgx1-v100-8gpu-4x-mlx5-legacy-legend.txt")),
    ("v100*", 4, Layout("DGX-1 NVLink quad (GPUs 0-3)", "dgx1-v100-8gpu-4x-mlx5-legacy-legend.txt")),
    ("g2", 8, Layout("NVSwitch, all pairs NV12 (DGX A100)", "dgx-a100-8gpu-nv12-12nic-8numa.txt")),
    ("g3", 8, Layout("PCIe, PIX quads joined by PHB (8 x P100)", "8x-p100-pcie-pix-phb-chainer-ci.txt")),
    ("*", 4, Layout("PCIe, NODE pairs, SYS across (4-GPU server)", "asus-esc8000a-e12-4x-rtx6000ada-4nic.txt")),
    ("*", 2, Layout("PCIe, PHB (2-GPU box)", "2gpu-pcie-phb-numa-na.txt")),
    ("*", 1, Layout("single GPU", label="PHB")),
    ("*", None, Layout("PCIe, every pair PHB", label="PHB")),
]


@dataclass(frozen=True)
class Node:
    """One row of a node list."""

    name: str
    gpus: int
    model: str
    topo: Path | None = None


@dataclass
class SimCluster:
    """The planner's :class:`~airflow_hetero_gpu.core.cluster.Cluster` plus how it was made."""

    cluster: Cluster
    nodes: list[Node]
    layouts: dict[str, str]  # host -> layout name
    hosts_per_leaf: int
    leaves_per_spine: int
    source: str = ""
    models: dict[str, int] = field(default_factory=dict)  # card type -> GPUs

    @property
    def total_gpus(self) -> int:
        return len(self.cluster.gpus)

    def describe(self) -> dict:
        by_layout: dict[str, dict[str, int]] = {}
        for n in self.nodes:
            key = f"{n.gpus} x {n.model}: {self.layouts[n.name]}"
            d = by_layout.setdefault(key, {"hosts": 0, "gpus": 0})
            d["hosts"] += 1
            d["gpus"] += n.gpus
        return {
            "source": self.source,
            "hosts": len(self.nodes),
            "gpus": self.total_gpus,
            "models": dict(sorted(self.models.items())),
            "layouts": dict(sorted(by_layout.items())),
            "network": f"{self.hosts_per_leaf} hosts a leaf (10), {self.leaves_per_spine} leaves a spine (20), "
                       "spines under one core (30)",
        }


def read_nodes(path: str | Path) -> list[Node]:
    """Read a node list (``sn, gpu, model[, topo]``); hosts without GPUs are skipped."""
    path = Path(path)
    header, rows = open_csv(path, NODE_COLUMNS)
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    for n, row in rows:
        name = row["sn"]
        if not name:
            raise HeteroGpuError(f"{path}:{n}: column 'sn': empty value, got ''")
        if name in seen:
            raise HeteroGpuError(f"{path}:{n}: column 'sn': duplicate host of line {seen[name]}, got {name!r}")
        seen[name] = n
        gpus = number(path, n, "gpu", row["gpu"], integer=True, minimum=0)
        if gpus == 0:
            continue
        model = row["model"]
        if not model:
            raise HeteroGpuError(f"{path}:{n}: column 'model': empty value for a host with {gpus} GPUs, got ''")
        topo = None
        if row.get("topo"):
            topo = (path.parent / row["topo"]).resolve()
            if not topo.is_file():
                raise HeteroGpuError(f"{path}:{n}: column 'topo': no such file, got {row['topo']!r}")
        nodes.append(Node(name, gpus, model, topo))
    if not nodes:
        raise HeteroGpuError(f"{path}: no host with a GPU")
    return nodes


@lru_cache(maxsize=64)
def _topo_links(file: Path) -> tuple[tuple[int, ...], dict[tuple[int, int], str]]:
    from airflow_hetero_gpu.capture.topo import parse_topo

    try:
        text = file.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise HeteroGpuError(f"{file}: cannot read: {err}") from None
    matrix = parse_topo(text, str(file))
    return tuple(matrix.gpus), dict(matrix.links)


def layout_for(model: str, gpus: int) -> Layout:
    """The first :data:`LAYOUTS` rule matching the card type and GPU count."""
    for glob, count, layout in LAYOUTS:
        if (count is None or count == gpus) and fnmatch.fnmatchcase(model.lower(), glob):
            return layout
    raise AssertionError("the last layout rule matches everything")


def wiring_for(node: Node) -> tuple[HostWiring, str]:
    """The host's wiring and the name of its layout."""
    indices = tuple(range(node.gpus))
    if node.topo is not None:
        layout = Layout(f"topo file {node.topo.name}", str(node.topo))
        path = node.topo
    else:
        layout = layout_for(node.model, node.gpus)
        path = TOPOLOGIES / layout.file if layout.file else None
    if path is None:
        return HostWiring.from_links(indices, {pair: layout.label for pair in combinations(indices, 2)}), layout.name
    file_gpus, links = _topo_links(path)
    if len(file_gpus) < node.gpus:
        raise HeteroGpuError(f"{path}: wires {len(file_gpus)} GPUs, host {node.name} has {node.gpus}")
    keep = file_gpus[: node.gpus]  # the file's first n GPUs, renumbered 0..n-1
    renum = {g: i for i, g in enumerate(keep)}
    sub = {(renum[a], renum[b]): lab for (a, b), lab in links.items() if a in renum and b in renum}
    return HostWiring.from_links(indices, sub), layout.name


def racks(hosts: Sequence[str], hosts_per_leaf: int, leaves_per_spine: int) -> NetworkTiers:
    """Leaves of ``hosts_per_leaf`` hosts in the given order, spines of ``leaves_per_spine``
    leaves, one core above all spines."""
    if hosts_per_leaf < 1 or leaves_per_spine < 1:
        raise HeteroGpuError("hosts per leaf and leaves per spine must be at least 1")
    leaves = [list(hosts[i:i + hosts_per_leaf]) for i in range(0, len(hosts), hosts_per_leaf)]
    groups: list[tuple[str, int, list[str]]] = [(f"leaf{i:03d}", 1, leaf) for i, leaf in enumerate(leaves)]
    for s in range(0, len(leaves), leaves_per_spine):
        members = [h for leaf in leaves[s:s + leaves_per_spine] for h in leaf]
        groups.append((f"spine{s // leaves_per_spine:02d}", 2, members))
    groups.append(("core", 3, list(hosts)))
    return NetworkTiers.from_groups(groups)


def build_fleet(nodes: Sequence[Node], *, hosts_per_leaf: int = 16, leaves_per_spine: int = 16,
                source: str = "") -> SimCluster:
    """The planner's cluster for a node list: one idle, healthy GPU per slot, real wirings, racks."""
    gpus: list[Gpu] = []
    wiring: dict[str, HostWiring] = {}
    layouts: dict[str, str] = {}
    models: dict[str, int] = {}
    for node in nodes:
        wiring[node.name], layouts[node.name] = wiring_for(node)
        models[node.model] = models.get(node.model, 0) + node.gpus
        gpus.extend(Gpu(node.name, i, f"GPU-{node.name}-{i}", node.model, utilization=0.0) for i in range(node.gpus))
    net = racks([n.name for n in nodes], hosts_per_leaf, leaves_per_spine)
    cluster = build_cluster(gpus, wiring=wiring, net=net)
    return SimCluster(cluster, list(nodes), layouts, hosts_per_leaf, leaves_per_spine, source, models)
