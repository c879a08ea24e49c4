"""The state of one emulated host: what its ``nvidia-smi`` and kernel log report.

A host's state is a JSON file (``<host dir>/state.json``) that the fake tools read on every call,
so a test changes a host by rewriting it (:meth:`EmulatedCluster.update_gpu` and friends do that
atomically). :class:`HostSpec` and :class:`GpuSpec` are the typed way to write the first version.

State file format (every key optional unless noted)::

    {
      "hostname": "dgx-a1",                      # required
      "driver_version": "535.183.01",
      "boot_time": 1735689600,                   # epoch seconds; journalctl timestamps (HostSpec:
                                                 # a minute before the host's last Xid, so its
                                                 # kernel log is recent; see DEFAULT_UPTIME_S)
      "gpus": [ {GPU}, ... ],
      "topology": {"sample": "8x-a100-sxm-nv12-4nic-hgx-2numa"}   # a shipped real sample
               | {"matrix": [["X", "NV12"], ["NV12", "X"]],          # or a generated matrix
                  "cpu_affinity": ["0-31", "0-31"], "numa_affinity": ["0", "0"],
                  "nics": [{"name": "mlx5_0", "links": ["PXB", "SYS", "X"]}],
                  "gpu_numa_id_column": true, "ansi_header": false},
      "xid": [ {"time": 1234.56789, "gpu": 3, "xid": 79, "pid": 1234, "name": "python3"},
               "[ 99.000001] NVRM: Xid (PCI:0000:07:00): 13, ... raw line" ],
      "nvidia_smi_delay_s": 0,                   # every nvidia-smi call sleeps this long first
      "nvidia_smi_wait_for": "/tmp/release",     # ... and waits until this file exists (a stuck driver)
      "unknown_query_fields": ["remapped_rows.failure"],  # refused like an older driver does
      "faults": ["driver_gone" | "no_devices" | "nvidia_smi_missing" | "host_down" | "hang"
                 | "host_key_changed" | "journal_denied" | "dmesg_denied"]
    }

A GPU (``{GPU}``) uses the keys of :class:`GpuSpec`; ``null`` prints ``[N/A]``; ``overrides``
maps a query field name to the raw text to print (``{"temperature.gpu": "[Unknown Error]"}``).

MIG: ``"mig_mode": "Enabled"`` with ``"mig_devices"`` (:func:`mig_devices` builds them: profile,
GPU and compute instance ids, memory, engines, UUID, ``processes``) prints MIG lines under the
GPU in ``-L``, the "MIG devices" block of the table, and ``[N/A]`` utilization;
``"mig_pending"`` differs from ``mig_mode`` while a mode change waits for a GPU reset.
NVLink fabric: ``"fabric": {"state": "Completed", "status": "Success", "clique_id": 1,
"cluster_uuid": "...", "health_summary": "Healthy", "bandwidth": "Full"}`` and
``"tray_index"`` (:func:`nvl72_rack` builds whole racks, in :mod:`.demo`).
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
import uuid as _uuid
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from airflow_hetero_gpu.fsutil import atomic_write

#: Host-level faults; see docs/emulated-cluster.md for what each does.
FAULTS = (
    "driver_gone",         # nvidia-smi: "NVIDIA-SMI has failed ..." exit 9
    "no_devices",          # nvidia-smi: "No devices were found" exit 6
    "nvidia_smi_missing",  # the shell: "nvidia-smi: command not found" exit 127
    "host_down",           # sshd stopped: connection refused
    "hang",                # sshd SIGSTOPped: connections hang before the banner
    "host_key_changed",    # sshd restarted with a new host key absent from known_hosts
    "sshd_killed",         # every sshd process SIGKILLed (listener and sessions); jobs run on
    "network_silent",      # every sshd process SIGSTOPped: open connections go quiet, jobs run on
    "journal_denied",      # journalctl -k: no permission
    "dmesg_denied",        # dmesg: "read kernel buffer failed: Operation not permitted"
    "fish_shell",          # the login shell is fish: a line using $? is refused (embedded only)
)

#: The login shell is not POSIX: fish refuses a command line that uses ``$?``.
FISH_SHELL = "fish_shell"
#: Faults only the embedded server emulates (a real sshd runs every host's commands with the
#: one login shell of the cluster's user).
EMBEDDED_ONLY_FAULTS = (FISH_SHELL,)

#: Faults the fake tools act on by reading the state (the others are process-level).
STATE_FAULTS = ("driver_gone", "no_devices", "journal_denied", "dmesg_denied")

STATE_FILE = "state.json"

#: Uptime of a host whose spec has no kernel-log entries when its state is first written.
DEFAULT_UPTIME_S = 600.0


@dataclass
class GpuSpec:
    """One emulated GPU. ``None`` values print as ``[N/A]``."""

    index: int
    name: str
    memory_total_mib: int
    pci_bus_id: str                      # "00000000:3B:00.0"
    uuid: str = ""                       # filled from host name and index when empty
    serial: str | None = None
    memory_used_mib: int = 0
    memory_reserved_mib: int = 0
    utilization_gpu: int | None = 0
    utilization_memory: int | None = 0
    temperature_c: int | None = 35
    temperature_memory_c: int | None = None
    power_draw_w: float | None = 60.0
    power_limit_w: float | None = 400.0
    ecc_mode: str | None = "Enabled"
    ecc_uncorrected_volatile: int | None = 0
    ecc_corrected_volatile: int | None = 0
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = False
    remapped_rows_failure: bool | None = False
    hw_slowdown: bool | None = False         # clocks_event_reasons.hw_slowdown: Active / Not Active
    pstate: str = "P0"
    compute_cap: str | None = None
    fan_speed: int | None = None
    clock_sm_mhz: int | None = 1410
    clock_sm_max_mhz: int | None = 1410
    clock_mem_mhz: int | None = 1593
    vbios_version: str | None = None
    lost: bool = False
    lost_reason: str = "Unknown Error"
    overrides: dict[str, str] = field(default_factory=dict)
    mig_mode: str | None = None              # "Enabled" / "Disabled"; None: no MIG ([N/A])
    mig_pending: str | None = None           # after the next reset; None: as mig_mode
    mig_devices: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)  # {"pid", "name", "memory_mib"}
    fabric: dict[str, Any] | None = None     # None: no NVLink fabric (bare N/A)
    tray_index: int | None = None

    def to_state(self) -> dict[str, Any]:
        # What dataclasses.asdict gives, without its recursive deep copy of every scalar (the
        # start-up of a 1,000-host fleet spent most of its time there).
        return {name: copy.deepcopy(value) if isinstance(value, (dict, list)) else value
                for name, value in ((f.name, getattr(self, f.name)) for f in _GPU_FIELDS)}


#: Keys a GPU entry of the state may carry (for validation of updates).
_GPU_FIELDS = fields(GpuSpec)
GPU_KEYS = frozenset(f.name for f in _GPU_FIELDS)


@dataclass
class HostSpec:
    """One emulated host: its name, GPUs, topology and kernel log."""

    name: str
    gpus: list[GpuSpec]
    topology: dict[str, Any]
    driver_version: str = "535.183.01"
    xid: list[Any] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    boot_time: int | None = None  # epoch seconds; None: a minute before the last Xid entry

    def default_boot_time(self, now: float | None = None) -> int:
        """A boot time that makes the spec's kernel log recent: the last entry a minute ago."""
        uptimes = [DEFAULT_UPTIME_S]
        for entry in self.xid:
            if isinstance(entry, str):
                match = re.match(r"^\[\s*(\d+\.\d+)\]", entry)
                uptimes.append(float(match.group(1)) if match else 0.0)
            else:
                uptimes.append(float(entry.get("time", 0.0)))
        return int((time.time() if now is None else now) - max(uptimes) - 60)

    def to_state(self) -> dict[str, Any]:
        gpus = []
        for gpu in self.gpus:
            entry = gpu.to_state()
            if not entry["uuid"]:
                entry["uuid"] = gpu_uuid(self.name, gpu.index)
            gpus.append(entry)
        return {
            "hostname": self.name,
            "driver_version": self.driver_version,
            "boot_time": self.boot_time if self.boot_time is not None else self.default_boot_time(),
            "gpus": gpus,
            "topology": dict(self.topology),
            "xid": list(self.xid),
            "faults": list(self.faults),
        }


def gpu_uuid(host: str, index: int) -> str:
    """A stable, realistic-looking GPU UUID for (host, index)."""
    return "GPU-" + str(_uuid.uuid5(_uuid.NAMESPACE_DNS, f"{host}.gpu{index}.hetero-gpu.invalid"))


def mig_uuid(host: str, index: int, device: int) -> str:
    """A stable MIG device UUID for (host, GPU index, MIG device index), in the R470+ form."""
    return "MIG-" + str(_uuid.uuid5(_uuid.NAMESPACE_DNS, f"{host}.gpu{index}.mig{device}.hetero-gpu.invalid"))


#: What one MIG device of a profile reports on an 80 GB A100/H100 (memory and BAR1 in MiB, SMs,
#: copy engines, encoders, decoders, OFA, JPEG): the 1g.10gb, 2g.20gb and 3g.40gb rows are the
#: real H100 table's (table-h100-mig-4-instances-idle.txt); the others are scaled from them.
MIG_PROFILES: dict[str, dict[str, int]] = {
    "1g.10gb": {"memory_total_mib": 9984, "bar1_total_mib": 6184, "sm": 16, "ce": 1, "enc": 0, "dec": 1, "ofa": 0, "jpg": 1},
    "2g.20gb": {"memory_total_mib": 20096, "bar1_total_mib": 12369, "sm": 32, "ce": 2, "enc": 0, "dec": 2, "ofa": 0, "jpg": 2},
    "3g.40gb": {"memory_total_mib": 40448, "bar1_total_mib": 24739, "sm": 60, "ce": 3, "enc": 0, "dec": 3, "ofa": 0, "jpg": 3},
    "4g.40gb": {"memory_total_mib": 40448, "bar1_total_mib": 24739, "sm": 64, "ce": 4, "enc": 0, "dec": 4, "ofa": 0, "jpg": 4},
    "7g.80gb": {"memory_total_mib": 80896, "bar1_total_mib": 49478, "sm": 132, "ce": 8, "enc": 0, "dec": 7, "ofa": 1, "jpg": 7},
}


def mig_devices(host: str, index: int, profiles: list[str], *, first_gpu_instance: int = 1) -> list[dict[str, Any]]:
    """MIG devices for a GPU's state (``mig_devices``), one per profile, idle, with stable UUIDs."""
    out = []
    for device, profile in enumerate(profiles):
        if profile not in MIG_PROFILES:
            raise ValueError(f"unknown MIG profile {profile!r}; known: {', '.join(MIG_PROFILES)}")
        out.append({"profile": profile, "gpu_instance": first_gpu_instance + device, "compute_instance": 0,
                    "memory_used_mib": 9, "uuid": mig_uuid(host, index, device), "processes": [],
                    **MIG_PROFILES[profile]})
    return out


def validate_state(state: Mapping[str, Any]) -> None:
    """Raise ValueError (naming the key) when a state cannot drive the fake tools."""
    if not isinstance(state.get("hostname"), str) or not state["hostname"]:
        raise ValueError("state: 'hostname' must be a non-empty string")
    indices = set()
    for pos, gpu in enumerate(state.get("gpus", [])):
        unknown = set(gpu) - GPU_KEYS
        if unknown:
            raise ValueError(f"state: gpus[{pos}] has unknown keys {sorted(unknown)}")
        for key in ("index", "name", "memory_total_mib", "pci_bus_id"):
            if key not in gpu:
                raise ValueError(f"state: gpus[{pos}] lacks {key!r}")
        if gpu["index"] in indices:
            raise ValueError(f"state: GPU index {gpu['index']} appears twice")
        indices.add(gpu["index"])
    for fault in state.get("faults", []):
        if fault not in FAULTS:
            raise ValueError(f"state: unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    topology = state.get("topology") or {}
    if "sample" not in topology and "matrix" not in topology:
        raise ValueError("state: 'topology' needs 'sample' or 'matrix'")


def current_uptime(state: Mapping[str, Any], now: float | None = None) -> float:
    """Seconds since the host's boot (``boot_time``) now, rounded to microseconds, and after
    its last kernel-log entry (the log stays in time order)."""
    uptime = round((time.time() if now is None else now) - float(state.get("boot_time", 0)), 6)
    last = max((float(e.get("time", 0.0)) for e in state.get("xid", []) if isinstance(e, Mapping)), default=0.0)
    return max(uptime, round(last + 0.000001, 6))


def read_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def write_state(path: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """Write atomically (temp file + rename): a reader never sees half a state."""
    validate_state(state)
    atomic_write(path, json.dumps(state, indent=2, sort_keys=True) + "\n")
