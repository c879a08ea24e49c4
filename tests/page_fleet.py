"""A large emulated fleet as a capture directory, for the cluster page's scale tests.

``write_fleet(root, 1000)``: 1,000 hosts of 8 GPUs, the demo's four platforms in turn (HGX A100,
DGX-1 V100, an 8 x RTX 4090 PCIe box, HGX H200) with their real ``topo -m`` samples; every
seventh host half busy, every 97th with an uncorrectable ECC error on GPU 2, two hosts whose
collection failed; racks of 16 hosts under leaf switches, 16 leaves under each spine, one core
above (``topology.conf``). The files are what the emulated ``nvidia-smi`` prints
(:func:`airflow_hetero_gpu.testing.captures.write_capture_dir`), so the page reads them with the
real parsers. :func:`fleet_records` gives the same collection as the ledger stores it.
"""

from __future__ import annotations

from pathlib import Path

from airflow_hetero_gpu.testing.captures import write_capture_dir
from airflow_hetero_gpu.testing.demo import (
    A100_80, DGX1_BUS, H200, HGX_A100_BUS, HGX_H200_BUS, RTX_4090, V100_32, make_gpus,
)
from airflow_hetero_gpu.testing.state import HostSpec

RTX8_MATRIX = [["X" if i == j else ("PHB" if i // 2 == j // 2 else ("NODE" if i // 4 == j // 4 else "SYS"))
                for j in range(8)] for i in range(8)]
PLATFORMS = (
    (A100_80, HGX_A100_BUS, {"sample": "8x-a100-sxm-nv12-4nic-hgx-2numa"}),
    (V100_32, DGX1_BUS, {"sample": "dgx1-like-8x-v100-sxm2-hybrid-cube-mesh-1nic"}),
    (RTX_4090, ("18", "1A", "3B", "3D", "86", "88", "B1", "B3"),
     {"matrix": RTX8_MATRIX, "cpu_affinity": ["0-35"] * 4 + ["36-71"] * 4, "numa_affinity": ["0"] * 4 + ["1"] * 4}),
    (H200, HGX_H200_BUS, {"sample": "hgx-h200-8gpu-nv18-10nic-ansi"}),
)
RACK = 16
LEAVES_PER_SPINE = 16


def host_name(n: int) -> str:
    return f"gpu-r{n // RACK:03d}-n{n % RACK:02d}"


def fleet_hosts(count: int) -> list[HostSpec]:
    hosts = []
    for n in range(count):
        name = host_name(n)
        card, bus, topology = PLATFORMS[n % len(PLATFORMS)]
        load = [90, 95, 97, 99, 0, 0, 0, 0] if n % 7 == 3 else None
        gpus = make_gpus(name, card, bus, load=load)
        if n % 97 == 5:
            gpus[2].ecc_uncorrected_volatile = 2
        hosts.append(HostSpec(name, gpus, dict(topology)))
    return hosts


def topology_conf(count: int) -> str:
    lines = ["# racks of 16 hosts under leaves, 16 leaves under a spine, the spines under one core"]
    racks = (count + RACK - 1) // RACK
    for r in range(racks):
        members = [host_name(n) for n in range(r * RACK, min(count, (r + 1) * RACK))]
        lines.append(f"SwitchName=leaf{r:03d} Nodes={','.join(members)}")
    spines = (racks + LEAVES_PER_SPINE - 1) // LEAVES_PER_SPINE
    for s in range(spines):
        leaves = [f"leaf{r:03d}" for r in range(s * LEAVES_PER_SPINE, min(racks, (s + 1) * LEAVES_PER_SPINE))]
        lines.append(f"SwitchName=spine{s} Switches={','.join(leaves)}")
    if spines > 1:
        lines.append(f"SwitchName=core Switches={','.join(f'spine{s}' for s in range(spines))}")
    return "\n".join(lines) + "\n"


def write_fleet(root: Path, count: int = 1000) -> Path:
    specs = fleet_hosts(count)
    down = down_hosts(specs)
    return write_capture_dir(root, [s for s in specs if s.name not in down], topology_conf=topology_conf(count),
                             errors=down)


def fleet_records(specs, down: dict[str, str] | None = None):
    """The collection of ``specs`` as the ledger stores it (``down``: host -> why it failed)."""
    from airflow_hetero_gpu.ledger.inventory import HostRecord
    from airflow_hetero_gpu.testing.captures import host_files

    down = down or {}
    return [HostRecord(s.name, False, {}, down[s.name]) if s.name in down else HostRecord(s.name, True, host_files(s))
            for s in specs]


def down_hosts(specs) -> dict[str, str]:
    """Two hosts of a large fleet whose collection fails (as :func:`write_fleet` writes them)."""
    if len(specs) <= 20:
        return {}
    return {specs[11].name: "ssh: connect to host: Connection timed out",
            specs[len(specs) // 2].name: "nvidia-smi: exit status 15: NVIDIA-SMI has failed"}
