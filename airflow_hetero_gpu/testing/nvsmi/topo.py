"""``nvidia-smi topo -m`` of an emulated host: a shipped real sample or a generated matrix."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Sequence

#: Topology samples shipped with the package (``"topology": {"sample": NAME}``).
TOPO_SAMPLE_DIR = Path(__file__).resolve().parents[1] / "data" / "topo"

LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""

ANSI_UNDERLINE = "\x1b[4m"
ANSI_RESET = "\x1b[0m"

LINK_LABEL = re.compile(r"^(X|SYS|SOC|NODE|PHB|PXB|PIX|NV\d+)$")



def sample_names() -> list[str]:
    """Names of the shipped real ``topo -m`` samples."""
    return sorted(p.stem for p in TOPO_SAMPLE_DIR.glob("*.txt"))


def read_sample(name: str) -> str:
    path = TOPO_SAMPLE_DIR / f"{name}.txt"
    if not path.is_file():
        raise ValueError(f"unknown topo sample {name!r}; shipped: {', '.join(sample_names())}")
    return path.read_text(encoding="utf-8")


def validate_matrix(matrix: Sequence[Sequence[str]], what: str = "matrix") -> None:
    """A square matrix of link labels with ``X`` on the diagonal, symmetric."""
    n = len(matrix)
    for i, row in enumerate(matrix):
        if len(row) != n:
            raise ValueError(f"{what}: row {i} has {len(row)} cells, expected {n}")
        for j, cell in enumerate(row):
            cell = str(cell).strip()
            if (i == j) != (cell == "X"):
                raise ValueError(f"{what}: cell ({i},{j}) is {cell!r}; X belongs on the diagonal only")
            if not LINK_LABEL.match(cell):
                raise ValueError(f"{what}: cell ({i},{j}) {cell!r} is not a link label")
            if str(matrix[j][i]).strip() != cell:
                raise ValueError(f"{what}: not symmetric at ({i},{j})")


def render_topo(topology: Mapping[str, Any]) -> str:
    """``nvidia-smi topo -m`` for a generated topology, in the layout of recent drivers.

    ``topology`` keys: ``matrix`` (GPU x GPU labels), ``cpu_affinity`` and ``numa_affinity``
    (one string per GPU), optional ``gpu_numa_id`` (default ``N/A``), ``nics`` (list of
    ``{"name": "mlx5_0", "links": [labels to every GPU then every NIC]}``), ``gpu_numa_id_column``
    (default True) and ``ansi_header`` (default False; drivers >= 590 underline the header).
    """
    matrix = [[str(c).strip() for c in row] for row in topology["matrix"]]
    validate_matrix(matrix)
    n = len(matrix)
    nics = list(topology.get("nics") or [])
    cpu = list(topology.get("cpu_affinity") or ["N/A"] * n)
    numa = list(topology.get("numa_affinity") or ["N/A"] * n)
    gpu_numa = list(topology.get("gpu_numa_id") or ["N/A"] * n)
    with_gpu_numa = bool(topology.get("gpu_numa_id_column", True))
    columns = [f"GPU{i}" for i in range(n)] + [f"NIC{k}" for k in range(len(nics))]
    columns += ["CPU Affinity", "NUMA Affinity"] + (["GPU NUMA ID"] if with_gpu_numa else [])
    head = "\t".join(columns)
    if topology.get("ansi_header"):
        head = ANSI_UNDERLINE + head + ANSI_RESET
    lines = ["\t" + head]

    def cell(label: str) -> str:
        return " X " if label == "X" else label

    for i in range(n):
        links = [cell(matrix[i][j]) for j in range(n)]
        links += [cell(str(nic["links"][i]).strip()) for nic in nics]
        tail = [cpu[i], numa[i]] + (["", gpu_numa[i]] if with_gpu_numa else [])
        lines.append("\t".join([f"GPU{i}"] + links + tail))
    for k, nic in enumerate(nics):
        links = [cell(str(v).strip()) for v in nic["links"]]
        if len(links) != n + len(nics):
            raise ValueError(f"NIC{k}: expected {n + len(nics)} links, got {len(links)}")
        pad = "\t" * (4 if with_gpu_numa else 2)
        lines.append("\t".join([f"NIC{k}"] + links) + pad)
    text = "\n".join(lines) + "\n\n" + LEGEND
    if nics:
        text += "\nNIC Legend:\n\n"
        text += "".join(f"  NIC{k}: {nic['name']}\n" for k, nic in enumerate(nics)) + "\n"
    return text


def topo_text(host: Mapping[str, Any]) -> str:
    """``topo -m`` text for a host: the stored real sample, or the generated matrix."""
    topology = host.get("topology") or {}
    if "sample" in topology:
        return read_sample(str(topology["sample"]))
    return render_topo(topology)


