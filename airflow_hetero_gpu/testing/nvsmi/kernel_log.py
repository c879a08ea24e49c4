"""The kernel log of an emulated host: ``dmesg`` and ``journalctl -k`` with its Xid lines."""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any, Mapping

from airflow_hetero_gpu.testing.nvsmi.common import bus_id as _bus_id


#: Text after "pid=..., name=...," for the Xids the emulation knows by heart.
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x0_00000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008",
    45: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
        "partition 6, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to mark a row for remapping.",
    74: "NVLink: fatal error detected on link 0(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL).",
}


def xid_bus(gpu: Mapping[str, Any]) -> str:
    """``00000000:3B:00.0`` -> ``0000:3b:00`` as the kernel log prints it."""
    domain, bus, devfn = _bus_id(gpu).split(":")
    return f"{domain[-4:]}:{bus}:{devfn.split('.')[0]}".lower()


def xid_message(host: Mapping[str, Any], entry: Mapping[str, Any] | str) -> tuple[float, str]:
    """(uptime seconds, message without timestamp) of one kernel-log entry of the state."""
    if isinstance(entry, str):
        match = re.match(r"^\[\s*(\d+\.\d+)\]\s?(.*)$", entry)
        if match:
            return float(match.group(1)), match.group(2)
        return 0.0, entry
    bus = entry.get("bus")
    if not bus and entry.get("gpu") is not None:
        for gpu in host.get("gpus", []):
            if gpu.get("index") == entry["gpu"]:
                bus = xid_bus(gpu)
    code = int(entry["xid"])
    pid = entry.get("pid")
    name = entry.get("name")
    pid_text = f"pid={pid}" if pid is not None else "pid='<unknown>'"
    name_text = f"name={name}" if name else "name=<unknown>"
    text = entry.get("text") or XID_TEXT.get(code, "")
    message = f"NVRM: Xid (PCI:{bus or '0000:00:00'}): {code}, {pid_text}, {name_text}, {text}".rstrip(", ")
    return float(entry.get("time", 0.0)), message


def kernel_messages(host: Mapping[str, Any]) -> list[tuple[float, str]]:
    """All kernel-log messages of a host (boot noise plus its Xid entries), oldest first."""
    messages = [
        (0.0, "Linux version 6.1.0-emulated (hetero-gpu emulated cluster)"),
        (4.210347, "nvidia: loading out-of-tree module taints kernel."),
        (4.523611, f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {host.get('driver_version', '')}"),
    ]
    messages += [xid_message(host, e) for e in host.get("xid", [])]
    return sorted(messages, key=lambda m: m[0])


def dmesg_text(host: Mapping[str, Any]) -> str:
    """``dmesg`` output: ``[ 1234.567890] message`` lines."""
    out = []
    for seconds, message in kernel_messages(host):
        whole = int(seconds)
        micros = int(round((seconds - whole) * 1_000_000))
        out.append(f"[{whole:5d}.{micros:06d}] {message}\n")
    return "".join(out)


def journal_text(host: Mapping[str, Any], pattern: str | None = None) -> str:
    """``journalctl -k -q`` output (short format), optionally filtered by a ``-g`` regex."""
    boot = _dt.datetime.fromtimestamp(float(host.get("boot_time", 1_735_689_600)))
    hostname = str(host.get("hostname", "localhost"))
    regex = re.compile(pattern) if pattern else None
    out = []
    for seconds, message in kernel_messages(host):
        if regex and not regex.search(message):
            continue
        when = boot + _dt.timedelta(seconds=seconds)
        out.append(f"{when.strftime('%b %d %H:%M:%S')} {hostname} kernel: {message}\n")
    return "".join(out)
