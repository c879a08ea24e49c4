"""A hand-made five-host, three-card-type cluster for the planner scenarios.

* ``a100-1``, ``a100-2``: 8 × NVIDIA A100-SXM4-80GB, every pair NV12
* ``v100``: 8 × Tesla V100-SXM2-32GB, the DGX-1 hybrid cube mesh (NV1/NV2, SYS across)
* ``rtx-1``, ``rtx-2``: 4 × NVIDIA GeForce RTX 4090 on PCIe: 0-1 and 2-3 PHB, SYS across

``topology.conf``: leaf1 = a100-1, v100; leaf2 = a100-2, rtx-1; leaf3 = rtx-2; spine over all
leaves. So a100-1 and a100-2 are 20 apart (tier 2), rtx-1 and rtx-2 too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from airflow_hetero_gpu.testing.captures import write_capture_dir
from airflow_hetero_gpu.testing.state import GpuSpec, HostSpec

A100 = "NVIDIA A100-SXM4-80GB"
V100 = "Tesla V100-SXM2-32GB"
RTX = "NVIDIA GeForce RTX 4090"

DGX1 = [
    "X NV1 NV1 NV2 NV2 SYS SYS SYS",
    "NV1 X NV2 NV1 SYS NV2 SYS SYS",
    "NV1 NV2 X NV2 SYS SYS NV1 SYS",
    "NV2 NV1 NV2 X SYS SYS SYS NV1",
    "NV2 SYS SYS SYS X NV1 NV1 NV2",
    "SYS NV2 SYS SYS NV1 X NV2 NV1",
    "SYS SYS NV1 SYS NV1 NV2 X NV2",
    "SYS SYS SYS NV1 NV2 NV1 NV2 X",
]
RTX_BOX = ["X PHB SYS SYS", "PHB X SYS SYS", "SYS SYS X PHB", "SYS SYS PHB X"]

TOPOLOGY_CONF = """\
# leaves list hosts, the spine lists leaves
SwitchName=leaf1 Nodes=a100-1,v100
SwitchName=leaf2 Nodes=a100-2,rtx-1
SwitchName=leaf3 Nodes=rtx-2
SwitchName=spine Switches=leaf[1-3]
"""


def _matrix(rows: list[str]) -> list[list[str]]:
    return [r.split() for r in rows]


def _nvlink(n: int, label: str) -> list[list[str]]:
    return [["X" if i == j else label for j in range(n)] for i in range(n)]


BUS = ["07", "0F", "47", "4E", "87", "90", "B7", "BD"]


def _gpus(host: str, n: int, name: str, mem: int, loads: Mapping[int, float], faults: Mapping[int, dict]):
    gpus = []
    for i in range(n):
        util = loads.get(i, 0.0)
        g = GpuSpec(index=i, name=name, memory_total_mib=mem, pci_bus_id=f"00000000:{BUS[i]}:00.0",
                    utilization_gpu=int(round(util * 100)), memory_used_mib=0, temperature_c=40)
        for k, v in faults.get(i, {}).items():
            setattr(g, k, v)
        gpus.append(g)
    return gpus


def hosts(loads: Mapping[str, Mapping[int, float]] | None = None,
          faults: Mapping[str, Mapping[int, dict]] | None = None,
          xid: Mapping[str, list] | None = None) -> list[HostSpec]:
    """The five hosts; ``loads[host][index]`` is utilization 0..1, ``faults`` GpuSpec overrides."""
    loads = loads or {}
    faults = faults or {}
    xid = xid or {}

    def spec(name, n, card, mem, matrix):
        return HostSpec(name, _gpus(name, n, card, mem, loads.get(name, {}), faults.get(name, {})),
                        {"matrix": matrix}, xid=list(xid.get(name, [])))

    return [
        spec("a100-1", 8, A100, 81920, _nvlink(8, "NV12")),
        spec("a100-2", 8, A100, 81920, _nvlink(8, "NV12")),
        spec("v100", 8, V100, 32768, _matrix(DGX1)),
        spec("rtx-1", 4, RTX, 24564, _matrix(RTX_BOX)),
        spec("rtx-2", 4, RTX, 24564, _matrix(RTX_BOX)),
    ]


def make_captures(root: Path, *, errors: Mapping[str, str] | None = None, cluster_yaml: str | None = None,
                  **kw) -> Path:
    return write_capture_dir(root, hosts(**kw), topology_conf=TOPOLOGY_CONF, errors=dict(errors or {}),
                             cluster_yaml=cluster_yaml)
