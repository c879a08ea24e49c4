"""Ready-made host specs: a small heterogeneous fleet for tests and the demo.

Card names, memory sizes, power limits and clocks are those real drivers report for these cards;
topologies are real ``topo -m`` samples (shipped in ``data/topo/``) or, for the RTX 4090 box, a
4-GPU cut of a real 8x RTX 4090 matrix. PCI bus ids follow the usual layout of those platforms
(GPUs on the first socket below 0x80, matching the samples' NUMA affinity).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from airflow_hetero_gpu.testing.state import GpuSpec, HostSpec, mig_devices


#: The demo fleet's cluster.yaml: the task types its pools support
CLUSTER_YAML = """\
# The demo fleet's task types: the NVSwitch A100 and H200 boxes take pre-training and
# fine-tuning, the RTX 4090 box fine-tuning and vision; the V100s keep their default.
task_types:
  hosts:
    "dgx-a*": [llm-pretrain, finetune]
    "hgx-*": [llm-pretrain, finetune]
  models:
    "RTX 4090": [finetune, cv]
"""

#: The demo fleet's topology.conf: the switches between its hosts
TOPOLOGY_CONF = """\
# Two leaf switches under a spine (Slurm topology.conf syntax)
SwitchName=leaf1 Nodes=dgx-a[1-2],hgx-h200
SwitchName=leaf2 Nodes=dgx1-v100,rtx-box
SwitchName=spine Switches=leaf[1-2]
"""


@dataclass(frozen=True)
class CardModel:
    """What nvidia-smi reports for one card model when idle."""

    name: str
    memory_total_mib: int
    power_limit_w: float
    idle_power_w: float
    compute_cap: str
    clock_sm_max_mhz: int
    clock_mem_mhz: int
    ecc: bool = True
    retired_pages: bool = False    # pre-Ampere page retirement ("No"); Ampere+ remap rows ([N/A])
    serial: bool = True
    vbios: str = ""
    mig: bool = False              # MIG-capable: mig.mode.current prints Disabled, not [N/A]


A100_80 = CardModel("NVIDIA A100-SXM4-80GB", 81920, 400.0, 61.3, "8.0", 1410, 1593, vbios="92.00.36.00.02", mig=True)
V100_32 = CardModel("Tesla V100-SXM2-32GB", 32768, 300.0, 42.8, "7.0", 1530, 877,
                    retired_pages=True, vbios="88.00.80.00.01")
RTX_4090 = CardModel("NVIDIA GeForce RTX 4090", 24564, 450.0, 26.8, "8.9", 3120, 10501,
                     ecc=False, serial=False, vbios="95.02.18.80.5F")
H200 = CardModel("NVIDIA H200", 143771, 700.0, 74.5, "9.0", 1980, 2619, vbios="96.00.A5.00.01", mig=True)
H100_80 = CardModel("NVIDIA H100 80GB HBM3", 81559, 700.0, 98.0, "9.0", 1980, 2619, vbios="96.00.A5.00.01", mig=True)
#: A Grace-Blackwell superchip GPU as a real GB200 tray's table shows it (tests/data/fabric).
GB200 = CardModel("NVIDIA GB200", 189471, 1200.0, 166.0, "10.0", 2062, 3996, vbios="97.00.82.00.0F")

#: The fabric an HGX H100/H200 reports: registered, but no multi-node domain (real allfields row).
HGX_FABRIC = {"state": "Completed", "status": "Success", "clique_id": 0,
              "cluster_uuid": "00000000-0000-0000-0000-000000000000", "health_summary": None, "bandwidth": None}
#: PCI bus ids of the four GPUs of a GB200 compute tray (one PCI domain per GPU, real table).
GB200_TRAY_BUS = ("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0")
#: A GB200 tray's own four GPUs in ``topo -m`` (assumed: NV18 between every pair, as through the
#: rack's NVLink switches; two Grace CPUs of 72 cores each, one NUMA node per CPU).
GB200_TRAY_TOPOLOGY: dict[str, Any] = {
    "matrix": [["X" if i == j else "NV18" for j in range(4)] for i in range(4)],
    "cpu_affinity": ["0-71", "0-71", "72-143", "72-143"],
    "numa_affinity": ["0", "0", "1", "1"],
}


def make_gpus(host: str, model: CardModel, bus_ids: Sequence[str], *,
              load: Sequence[int] | None = None, temps: Sequence[int] | None = None) -> list[GpuSpec]:
    """GPUs of one model at the given bus ids (``"07"`` -> ``00000000:07:00.0``)."""
    gpus = []
    for index, bus in enumerate(bus_ids):
        util = load[index] if load else 0
        used = int(model.memory_total_mib * util / 100 * 0.85) if util else 4
        gpus.append(GpuSpec(
            index=index,
            name=model.name,
            memory_total_mib=model.memory_total_mib,
            pci_bus_id=f"00000000:{bus.upper()}:00.0",
            serial=f"{1650522003800 + sum(map(ord, host)) * 10 + index}" if model.serial else None,
            memory_used_mib=used,
            memory_reserved_mib=0,
            utilization_gpu=util,
            utilization_memory=util // 3,
            temperature_c=(temps[index] if temps else 31 + index % 3 + util // 3),
            temperature_memory_c=(None if not model.ecc else 30 + index % 3),
            power_draw_w=round(model.idle_power_w + (model.power_limit_w - model.idle_power_w) * util / 110, 2),
            power_limit_w=model.power_limit_w,
            ecc_mode="Enabled" if model.ecc else None,
            ecc_uncorrected_volatile=0 if model.ecc else None,
            ecc_corrected_volatile=0 if model.ecc else None,
            retired_pages_pending=False if model.retired_pages else None,
            remapped_rows_pending=None if (model.retired_pages or not model.ecc) else False,
            pstate="P0" if util else "P0",
            compute_cap=model.compute_cap,
            fan_speed=None if model.ecc else 30,
            clock_sm_mhz=model.clock_sm_max_mhz if util else 210,
            clock_sm_max_mhz=model.clock_sm_max_mhz,
            clock_mem_mhz=model.clock_mem_mhz,
            vbios_version=model.vbios or None,
            mig_mode="Disabled" if model.mig else None,
        ))
    return gpus


#: GPU0-3 of the real 8x RTX 4090 matrix (PCIe pairs under one host bridge, NODE between pairs).
RTX4090_4GPU_TOPOLOGY: dict[str, Any] = {
    "matrix": [
        ["X", "PHB", "NODE", "NODE"],
        ["PHB", "X", "NODE", "NODE"],
        ["NODE", "NODE", "X", "PHB"],
        ["NODE", "NODE", "PHB", "X"],
    ],
    "cpu_affinity": ["0-35,72-107"] * 4,
    "numa_affinity": ["0"] * 4,
}

HGX_A100_BUS = ("07", "0F", "47", "4E", "87", "90", "B7", "BD")
DGX1_BUS = ("06", "07", "0A", "0B", "85", "86", "89", "8A")
HGX_H200_BUS = ("19", "3B", "4C", "5D", "9B", "BB", "CB", "DB")
RTX_BOX_BUS = ("18", "1A", "3B", "3D")

#: Index of the faulty GPU on the demo's ``hgx-h200`` host.
FAULTY_GPU = 5


def demo_hosts() -> list[HostSpec]:
    """Five hosts, four card types: two NVSwitch A100 boxes (one half busy), a DGX-1 style V100
    box (hybrid cube mesh), a 4x RTX 4090 PCIe box, and an H200 box with one faulty GPU
    (uncorrectable ECC errors plus the matching Xid 48 in its kernel log)."""
    h200 = make_gpus("hgx-h200", H200, HGX_H200_BUS)
    h200[FAULTY_GPU].ecc_uncorrected_volatile = 2
    h200[FAULTY_GPU].ecc_corrected_volatile = 17
    return [
        HostSpec("dgx-a1", make_gpus("dgx-a1", A100_80, HGX_A100_BUS),
                 {"sample": "8x-a100-sxm-nv12-4nic-hgx-2numa"}),
        HostSpec("dgx-a2", make_gpus("dgx-a2", A100_80, HGX_A100_BUS, load=[97, 95, 99, 96, 0, 0, 0, 0]),
                 {"sample": "8x-a100-sxm-nv12-4nic-hgx-2numa"}),
        HostSpec("dgx1-v100", make_gpus("dgx1-v100", V100_32, DGX1_BUS),
                 {"sample": "dgx1-like-8x-v100-sxm2-hybrid-cube-mesh-1nic"},
                 driver_version="580.173.02"),
        HostSpec("rtx-box", make_gpus("rtx-box", RTX_4090, RTX_BOX_BUS, load=[0, 35, 0, 0]),
                 dict(RTX4090_4GPU_TOPOLOGY), driver_version="550.127.05"),
        HostSpec("hgx-h200", h200, {"sample": "hgx-h200-8gpu-nv18-10nic-ansi"},
                 driver_version="570.133.20",
                 xid=[{"time": 86123.456789, "gpu": FAULTY_GPU, "xid": 48, "pid": None, "name": None}]),
    ]


def small_hosts(count: int = 2, gpus: int = 2) -> list[HostSpec]:
    """``count`` small A100 hosts with ``gpus`` NVLinked GPUs each (fast tests)."""
    matrix = [["X" if i == j else "NV12" for j in range(gpus)] for i in range(gpus)]
    topo = {"matrix": matrix, "cpu_affinity": ["0-31"] * gpus, "numa_affinity": ["0"] * gpus}
    return [
        HostSpec(f"node{n + 1:02d}", make_gpus(f"node{n + 1:02d}", A100_80, HGX_A100_BUS[:gpus]), dict(topo))
        for n in range(count)
    ]


def nvl72_rack(prefix: str = "nvl72-t", trays: int = 18, *, cliques: Sequence[int] | None = None,
               cluster_uuid: str = "9c6f5af3-53bf-49b5-a436-b66766c413c3",
               driver_version: str = "590.48.01") -> list[HostSpec]:
    """One GB200 NVL72 rack: ``trays`` compute trays (hosts ``<prefix>00`` ...) of 4 GPUs, all
    registered in the rack's NVLink fabric. ``cliques`` gives each tray's NVLink partition
    (clique id); default one partition for the whole rack (clique 1). A split rack is two
    partitions, e.g. ``[1] * 9 + [2] * 9``."""
    cliques = list(cliques) if cliques is not None else [1] * trays
    if len(cliques) != trays:
        raise ValueError(f"cliques: expected {trays} entries (one per tray), got {len(cliques)}")
    hosts = []
    for tray, clique in enumerate(cliques):
        name = f"{prefix}{tray:02d}"
        gpus = make_gpus(name, GB200, ["01"] * 4)
        for gpu, bus in zip(gpus, GB200_TRAY_BUS):
            gpu.pci_bus_id = bus
            gpu.tray_index = tray
            gpu.fabric = {"state": "Completed", "status": "Success", "clique_id": clique, "cluster_uuid": cluster_uuid,
                          "health_summary": "Healthy", "bandwidth": "Full"}
        hosts.append(HostSpec(name, gpus, dict(GB200_TRAY_TOPOLOGY), driver_version=driver_version))
    return hosts


def hgx_h100_hosts(names: Sequence[str]) -> list[HostSpec]:
    """8-GPU HGX H100 hosts (NVSwitch inside the host): fabric registered, no multi-node domain."""
    hosts = []
    for name in names:
        gpus = make_gpus(name, H100_80, HGX_H200_BUS)
        for gpu in gpus:
            gpu.fabric = dict(HGX_FABRIC)
        hosts.append(HostSpec(name, gpus, {"sample": "hgx-h200-8gpu-nv18-10nic-ansi"}, driver_version="590.48.01"))
    return hosts


#: The MIG layout the emulation gives a MIG-enabled 80 GB A100/H100: 3g + 2g + 1g + 1g (7 slices).
MIG_LAYOUT = ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")


def enable_mig(host: HostSpec, index: int, profiles: Sequence[str] = MIG_LAYOUT) -> GpuSpec:
    """Turn MIG on for one GPU of a host spec, with one idle MIG device per profile."""
    gpu = next(g for g in host.gpus if g.index == index)
    gpu.mig_mode = "Enabled"
    gpu.mig_devices = mig_devices(host.name, index, list(profiles))
    gpu.utilization_gpu = None
    gpu.memory_used_mib = sum(d["memory_used_mib"] for d in gpu.mig_devices)
    return gpu
