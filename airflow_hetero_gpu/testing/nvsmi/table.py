"""The plain ``nvidia-smi`` table of an emulated host, in the layout of drivers R545 to R590.

What the collector reads from it is the "MIG devices:" block (each MIG device's GPU instance,
compute instance and memory) and the "Processes:" block (each process's GPU, GI and CI); the
GPU rows around them follow the real layout too, so the whole text equals a real table for the
same state (tests compare with ``table-h100-mig-4-instances-idle.txt``,
``table-h200-mig-load.txt`` and ``table-h100-80gb-hbm3-load.txt``).

State keys read (besides a GPU's ``index``, ``name``, ``pci_bus_id``, memory, utilization,
temperature and power): ``persistence_mode`` ("Enabled"), ``fan_speed``, ``pstate``,
``compute_mode``, ``mig_mode``, ``processes`` (non-MIG GPUs) and ``mig_devices`` (see
:mod:`airflow_hetero_gpu.testing.state`); the host's ``driver_version``, ``cuda_version`` and,
for a fixed header time, ``table_time`` (epoch seconds).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Mapping, Sequence

from airflow_hetero_gpu.testing.nvsmi.common import bus_id

WIDTH = 89  # between the outer bars
FULL = "+" + "-" * WIDTH + "+"
GPU_SEP = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
GPU_HEAD = [
    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
    "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
    "|                                         |                        |               MIG M. |",
    "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
]
MIG_SEP = "+" + "-" * 18 + "+" + "-" * 34 + "+" + "-" * 11 + "+" + "-" * 23 + "+"
MIG_HEAD = [
    "| MIG devices:".ljust(WIDTH + 1) + "|",
    MIG_SEP,
    "| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared         |",
    "|      ID  ID  Dev |                Shared BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |",
    "|                  |                                  |        ECC|                       |",
    "|" + "=" * 18 + "+" + "=" * 34 + "+" + "=" * 11 + "+" + "=" * 23 + "|",
]
PROC_HEAD = [
    "| Processes:".ljust(WIDTH + 1) + "|",
    "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
    "|        ID   ID                                                               Usage      |",
    "|" + "=" * WIDTH + "|",
]


def _mig_on(gpu: Mapping[str, Any]) -> bool:
    return str(gpu.get("mig_mode") or "").lower() == "enabled"


def _header_time(host: Mapping[str, Any]) -> str:
    stamp = host.get("table_time")
    when = _dt.datetime.fromtimestamp(float(stamp)) if stamp is not None else _dt.datetime.now()
    return f"{when:%a %b} {when.day:>2} {when:%H:%M:%S %Y}       "


def _gpu_rows(gpu: Mapping[str, Any]) -> list[str]:
    name = str(gpu.get("name", ""))
    name = name if len(name) <= 31 else name[:28] + "..."
    persistence = "On" if str(gpu.get("persistence_mode", "Enabled")).lower() == "enabled" else "Off"
    mig = _mig_on(gpu)
    ecc = gpu.get("ecc_uncorrected_volatile")
    ecc_text = "On" if mig else ("N/A" if ecc is None else str(ecc))
    fan = "N/A" if gpu.get("fan_speed") is None else f"{gpu['fan_speed']}%"
    temp = "N/A" if gpu.get("temperature_c") is None else f"{gpu['temperature_c']}C"
    draw = gpu.get("power_draw_w")
    cap = gpu.get("power_limit_w")
    power = f"{'N/A' if draw is None else f'{draw:.0f}W'} / {'N/A' if cap is None else f'{cap:.0f}W':>5}"
    used, total = int(gpu.get("memory_used_mib") or 0), int(gpu.get("memory_total_mib") or 0)
    memory = f"{used}MiB / {total:>6}MiB"
    util = gpu.get("utilization_gpu")
    util_text = "N/A" if mig or util is None else f"{util}%"
    mig_text = "N/A" if gpu.get("mig_mode") is None else ("Enabled" if mig else "Disabled")
    return [
        f"| {gpu.get('index'):>3}  {name:<31}{persistence:<3} |   {bus_id(gpu)} Off | {ecc_text:>20} |",
        f"| {fan:<4}{temp:>5}    {gpu.get('pstate', 'P0'):<3}{power:>23} | {memory:>22} | "
        f"{util_text:>7}{str(gpu.get('compute_mode', 'Default')):>13} |",
        f"|{'':41}|{'':24}| {mig_text:>20} |",
        GPU_SEP,
    ]


def _mig_rows(gpu: Mapping[str, Any]) -> list[str]:
    out = []
    for dev, d in enumerate(gpu.get("mig_devices") or []):
        used, total = int(d.get("memory_used_mib", 0)), int(d.get("memory_total_mib", 0))
        bar1 = int(d.get("bar1_total_mib", 0))
        engines = (d.get("ce", 1), d.get("enc", 0), d.get("dec", 1), d.get("ofa", 0), d.get("jpg", 1))
        out.append(f"| {gpu.get('index'):>2}  {d.get('gpu_instance', dev):>3} {d.get('compute_instance', 0):>3} {dev:>3}  |"
                   f"{f'{used}MiB / {total:>5}MiB':>30}    | {d.get('sm', 0):>2}      0 |"
                   f" {engines[0]:>2} {engines[1]:>3} {engines[2]:>4} {engines[3]:>4} {engines[4]:>4} |")
        out.append(f"|{'':18}|{f'0MiB / {bar1:>5}MiB':>30}    |{'':11}|{'':23}|")
        out.append(MIG_SEP)
    return out


def _process_rows(gpus: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = []
    for gpu in gpus:
        if _mig_on(gpu):
            for d in gpu.get("mig_devices") or []:
                for p in d.get("processes") or []:
                    rows.append((gpu.get("index"), str(d.get("gpu_instance")), str(d.get("compute_instance", 0)), p))
        else:
            for p in gpu.get("processes") or []:
                rows.append((gpu.get("index"), "N/A", "N/A", p))
    if not rows:
        return ["|  No running processes found".ljust(WIDTH + 1) + "|"]
    out = []
    for index, gi, ci, p in rows:
        name = str(p.get("name", ""))
        name = name if len(name) <= 35 else "..." + name[-32:]
        ids = f"{'N/A':>6}{'N/A':>5}{p.get('pid'):>16}" if gi == "N/A" else f"{gi:>5}{ci:>5}{p.get('pid'):>17}"
        out.append(f"|{index:>5}{ids}{p.get('type', 'C'):>7}   {name:<35}"
                   f"{str(p.get('memory_mib', 0)) + 'MiB':>11} |")
    return out


def table_text(host: Mapping[str, Any]) -> str:
    """The plain ``nvidia-smi`` output for a host (lost GPUs are left out of the table)."""
    gpus = [g for g in host.get("gpus", []) if not g.get("lost")]
    driver = str(host.get("driver_version", ""))
    cuda = str(host.get("cuda_version", "12.2"))
    lines = [_header_time(host), FULL,
             f"| NVIDIA-SMI {driver:<22} Driver Version: {driver:<14} CUDA Version: {cuda:<8} |",
             GPU_SEP, *GPU_HEAD]
    for gpu in gpus:
        lines.extend(_gpu_rows(gpu))
    mig = [g for g in gpus if _mig_on(g) and g.get("mig_devices")]
    if mig:
        lines += ["", FULL, *MIG_HEAD]
        for gpu in mig:
            lines.extend(_mig_rows(gpu))
    lines += ["", FULL, *PROC_HEAD, *_process_rows(gpus), FULL]
    return "".join(line + "\n" for line in lines)
