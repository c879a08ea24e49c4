"""Readers of the MIG captures: ``mig.txt`` (``nvidia-smi -L``) and ``mig-usage.txt`` (``nvidia-smi``).

A GPU with MIG mode enabled is split into MIG devices (a GPU instance, or a compute instance of
one), each a CUDA device of its own with its own UUID. ``nvidia-smi -L`` lists them under their
GPU::

    GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)
      MIG 3g.40gb     Device  0: (UUID: MIG-00000000-0000-0000-0000-000000000000)
      MIG 2g.20gb     Device  1: (UUID: MIG-00000001-0000-0000-0000-000000000001)

(drivers before R470 print ``MIG-GPU-<GPU uuid>/<GI>/<CI>`` UUIDs; both are accepted and kept
as printed: CUDA takes either in ``CUDA_VISIBLE_DEVICES``). The plain ``nvidia-smi`` table adds
what ``-L`` lacks: per MIG device (GPU index, MIG device index) its GPU instance and compute
instance ids and its memory in use, and per process the GPU, GI and CI it runs on::

    |  0    2   0   0  |              26MiB / 40448MiB    | 60      0 |  3   0    3    0    3 |
    |    0    2    1            12249      C   /root/tools/memhog                     2194MiB |

Only those rows are read from the table; its other parts (GPU rows, borders, the BAR1 line of
each MIG device) are skipped, whatever their widths, so the layouts of R450 to R590 all read.
A ``MIG`` line of ``-L`` or a row of the MIG-devices block that does not fit is an error naming
the file and line: an instance silently dropped would leave a GPU's slices unaccounted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from airflow_hetero_gpu.errors import CaptureError

__all__ = ["MigDevice", "MigListing", "MigProcess", "MigUsage", "MigUsageRow", "parse_mig_list",
           "parse_mig_usage"]

_GPU_LINE = re.compile(r"GPU (?P<index>\d+): (?P<name>.+?) \(UUID: (?P<uuid>[^)\s]+)\)")
_MIG_LINE = re.compile(
    r"MIG (?P<profile>\d+(?:c\.\d+)?g\.\d+gb(?:\+[a-z]+)*)\s+Device\s+(?P<device>\d+): \(UUID: (?P<uuid>MIG-[^)\s]+)\)")
_USAGE_ROW = re.compile(
    r"\|\s*(?P<gpu>\d+)\s+(?P<gi>\d+)\s+(?P<ci>\d+)\s+(?P<dev>\d+)\s*\|\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*\|.*")
_PROCESS_ROW = re.compile(
    r"\|\s*(?P<gpu>\d+)\s+(?P<gi>\d+|N/A)\s+(?P<ci>\d+|N/A)\s+(?P<pid>\d+)\s+(?P<type>C\+G|C|G)\s+(?P<name>.*?)"
    r"\s+(?P<memory>\d+MiB|N/A)\s*\|")


@dataclass(frozen=True)
class MigDevice:
    """One MIG device of ``nvidia-smi -L``: its GPU, MIG device index, profile and UUID."""

    gpu_index: int
    device: int
    profile: str  # "3g.40gb", "1c.3g.71gb" (a compute instance of a 3g GPU instance)
    uuid: str
    line: int


@dataclass
class MigListing:
    """``mig.txt``: the GPUs ``-L`` lists (index -> UUID) and their MIG devices, by GPU index."""

    gpus: dict[int, str] = field(default_factory=dict)
    devices: dict[int, list[MigDevice]] = field(default_factory=dict)

    def of(self, gpu_index: int) -> list[MigDevice]:
        return self.devices.get(gpu_index, [])


def _quote(text: str, limit: int = 80) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def parse_mig_list(text: str, path: str) -> MigListing:
    """Read ``nvidia-smi -L``; ``path`` names the file in errors."""
    out = MigListing()
    current: int | None = None
    for number, raw in enumerate(text.lstrip("\ufeff").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("Unable to determine the device handle"):
            continue
        gpu = _GPU_LINE.fullmatch(line)
        if gpu is not None:
            current = int(gpu["index"])
            out.gpus[current] = gpu["uuid"]
            continue
        if line.startswith("MIG "):
            mig = _MIG_LINE.fullmatch(line)
            if mig is None:
                raise CaptureError(path, f"cannot read this MIG device line: {_quote(line)}", number)
            if current is None:
                raise CaptureError(path, "MIG device listed before any GPU line", number)
            device = MigDevice(current, int(mig["device"]), mig["profile"], mig["uuid"], number)
            listed = out.devices.setdefault(current, [])
            if any(d.device == device.device for d in listed):
                raise CaptureError(path, f"GPU {current} lists MIG device {device.device} twice", number)
            listed.append(device)
            continue
        raise CaptureError(path, f"not nvidia-smi -L output: {_quote(line)}", number)
    if not out.gpus:
        raise CaptureError(path, "no GPU lines (expected nvidia-smi -L output)")
    return out


@dataclass(frozen=True)
class MigUsageRow:
    """One MIG device of the table: GPU, GI, CI, MIG device index and its memory in MiB."""

    gpu_index: int
    gpu_instance: int
    compute_instance: int
    device: int
    memory_used_mib: float
    memory_total_mib: float


@dataclass(frozen=True)
class MigProcess:
    """One process of the table's process list; ``gpu_instance``/``compute_instance`` are None
    on a GPU without MIG (the table prints N/A)."""

    gpu_index: int
    gpu_instance: int | None
    compute_instance: int | None
    pid: int
    kind: str  # "C", "G", "C+G"


@dataclass
class MigUsage:
    """``mig-usage.txt``: the table's MIG devices and processes."""

    devices: dict[tuple[int, int], MigUsageRow] = field(default_factory=dict)  # (GPU, MIG device)
    processes: list[MigProcess] = field(default_factory=list)

    def processes_on(self, row: MigUsageRow) -> list[MigProcess]:
        """The compute processes running on one MIG device (its GPU, GI and CI)."""
        return [p for p in self.processes if "C" in p.kind and p.gpu_index == row.gpu_index
                and p.gpu_instance == row.gpu_instance and p.compute_instance == row.compute_instance]


def parse_mig_usage(text: str, path: str) -> MigUsage:
    """Read the MIG-devices block and the process list of the plain ``nvidia-smi`` table."""
    out = MigUsage()
    section = None
    saw_table = False
    for number, raw in enumerate(text.lstrip("\ufeff").splitlines(), start=1):
        line = raw.strip()
        if line.startswith("| NVIDIA-SMI "):
            saw_table = True
        if line.startswith("| MIG devices:"):
            section = "mig"
            continue
        if line.startswith("| Processes:"):
            section = "processes"
            continue
        if not line.startswith("|") or set(line) <= set("|=+-: "):
            continue
        if section == "mig":
            cells = line.strip("|").split("|")
            first = cells[0].split() if cells else []
            if not first or not first[0].isdigit():
                continue  # the header rows and each device's BAR1 line
            row = _USAGE_ROW.fullmatch(line)
            if row is None:
                raise CaptureError(path, f"cannot read this MIG device row: {_quote(line)}", number)
            key = (int(row["gpu"]), int(row["dev"]))
            if key in out.devices:
                raise CaptureError(path, f"GPU {key[0]} MIG device {key[1]} appears twice", number)
            out.devices[key] = MigUsageRow(key[0], int(row["gi"]), int(row["ci"]), key[1],
                                           float(row["used"]), float(row["total"]))
        elif section == "processes":
            proc = _PROCESS_ROW.fullmatch(line)
            if proc is None:
                continue  # header rows, "No running processes found"
            gi, ci = proc["gi"], proc["ci"]
            out.processes.append(MigProcess(int(proc["gpu"]), None if gi == "N/A" else int(gi),
                                            None if ci == "N/A" else int(ci), int(proc["pid"]), proc["type"]))
    if not saw_table:
        raise CaptureError(path, "not the nvidia-smi table (no '| NVIDIA-SMI' header line)")
    return out
