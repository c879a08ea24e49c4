"""Host specs for large emulated fleets (scale tests and benchmarks).

:func:`scale_hosts` gives ``count`` hosts of 8 GPUs, the demo's four card models in turn (A100
HGX, DGX-1 V100, RTX 4090 box, H200 HGX), each with the real ``topo -m`` sample or matrix of its
platform and the bus ids those platforms use, a few of them loaded; names ``node0001``, ...
"""

from __future__ import annotations

from airflow_hetero_gpu.testing.demo import (
    A100_80,
    DGX1_BUS,
    H200,
    HGX_A100_BUS,
    HGX_H200_BUS,
    RTX_4090,
    V100_32,
    make_gpus,
)
from airflow_hetero_gpu.testing.state import HostSpec

#: (card, bus ids, topology, driver) per platform, used in turn.
_PLATFORMS = (
    (A100_80, HGX_A100_BUS, {"sample": "8x-a100-sxm-nv12-4nic-hgx-2numa"}, "535.183.01"),
    (V100_32, DGX1_BUS, {"sample": "dgx1-like-8x-v100-sxm2-hybrid-cube-mesh-1nic"}, "580.173.02"),
    (RTX_4090, ("18", "1A", "3B", "3D", "86", "88", "B1", "B3"),
     {"matrix": [["X" if i == j else ("PHB" if i // 2 == j // 2 else ("NODE" if i // 4 == j // 4 else "SYS"))
                  for j in range(8)] for i in range(8)],
      "cpu_affinity": ["0-35,72-107"] * 4 + ["36-71,108-143"] * 4, "numa_affinity": ["0"] * 4 + ["1"] * 4},
     "550.127.05"),
    (H200, HGX_H200_BUS, {"sample": "hgx-h200-8gpu-nv18-10nic-ansi"}, "570.133.20"),
)


def scale_hosts(count: int, *, width: int = 4) -> list[HostSpec]:
    """``count`` 8-GPU hosts of four platforms in turn; every seventh host half busy."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    width = max(width, len(str(count)))
    hosts = []
    for n in range(count):
        name = f"node{n + 1:0{width}d}"
        card, bus, topology, driver = _PLATFORMS[n % len(_PLATFORMS)]
        load = [90, 95, 97, 99, 0, 0, 0, 0] if n % 7 == 3 else None
        hosts.append(HostSpec(name, make_gpus(name, card, bus, load=load), dict(topology),
                              driver_version=driver))
    return hosts


__all__ = ["scale_hosts"]
