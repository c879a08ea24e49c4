"""Reader of kernel log lines holding NVIDIA Xid events (``xid.log``, SPEC §2, §4).

Accepts any mix of ``dmesg`` (``[ 1234.567890] ...``), ``dmesg -T`` (``[Fri Aug 30 11:43:09
2024] ...``) and ``journalctl -k`` / syslog (``Mar 01 12:00:00 host kernel: ...``) lines: the
prefix before ``NVRM: Xid`` is not interpreted. The event itself looks like

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    NVRM: Xid (0000:03:00): 14, Channel 00000001          (older drivers: no "PCI:")

Lines without ``NVRM: Xid`` are ignored; one with it that does not parse is an error, because a
hardware fault silently dropped would leave a broken GPU in the pools.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_hetero_gpu.capture.busid import normalize_bus_id
from airflow_hetero_gpu.errors import CaptureError

__all__ = ["APPLICATION_XIDS", "XidEvent", "parse_xid_log"]

# Xids caused by the application rather than the GPU (SPEC §4): they do not make a GPU abnormal.
# 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing,
# 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

_MARKER = "NVRM: Xid"
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f:.]+)\): (?P<xid>[0-9]+)(?:,|$)")


@dataclass(frozen=True)
class XidEvent:
    """One Xid line: the GPU (normalised bus id), the Xid number, where and what was logged."""

    pci_bus_id: str
    xid: int
    line: int
    text: str


def parse_xid_log(text: str, path: str) -> list[XidEvent]:
    """Every ``NVRM: Xid`` event of a kernel log, in file order; ``path`` names it in errors."""
    events: list[XidEvent] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if _MARKER not in line:
            continue
        line = line.strip()
        match = _XID.search(line)
        if match is None:
            raise CaptureError(path, f"cannot read this Xid line: {_quote(line)}", number)
        try:
            bus_id = normalize_bus_id(match["bus"])
        except ValueError as exc:
            raise CaptureError(path, f"Xid line: {exc}", number) from None
        events.append(XidEvent(bus_id, int(match["xid"]), number, line))
    return events


def _quote(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")
