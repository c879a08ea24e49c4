"""Reader of kernel log lines holding NVIDIA Xid events (``xid.log``, SPEC §2, §4).

Accepts any mix of ``dmesg`` (``[ 1234.567890] ...``), ``dmesg -T`` (``[Fri Aug 30 11:43:09
2024] ...``) and ``journalctl -k`` / syslog (``Mar 01 12:00:00 host kernel: ...``) lines: the
prefix before ``NVRM: Xid`` is not interpreted. The event itself looks like

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    NVRM: Xid (0000:03:00): 14, Channel 00000001          (older drivers: no "PCI:")

Lines without ``NVRM: Xid`` are ignored; one with it that does not parse is an error, because a
hardware fault silently dropped would leave a broken GPU in the pools.

:func:`line_time` places a line on the wall clock where its prefix allows (journal and syslog
``Mar 01 12:00:00``, ``short-iso`` ``2026-03-01T12:00:00+0000``, ``dmesg -T``
``[Fri Aug 30 11:43:09 2024]``); plain ``dmesg`` (``[ 1234.567890]``, seconds since boot) gives
no wall-clock time. The inventory's offline Xid rule uses it (``core/inventory.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from airflow_hetero_gpu.capture.busid import normalize_bus_id
from airflow_hetero_gpu.errors import CaptureError

__all__ = ["APPLICATION_XIDS", "XidEvent", "line_time", "parse_xid_log"]

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


_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
# "Mar 01 12:00:00 host kernel: ..." (journalctl's short format, syslog)
_SHORT = re.compile(r"^(?P<mon>[A-Za-z]{3}) +(?P<day>\d{1,2}) (?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})(?:\.\d+)? ")
# "2026-03-01T12:00:00+0000 host kernel: ..." (journalctl -o short-iso / short-iso-precise)
_ISO = re.compile(r"^(?P<stamp>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.\d+)?(?P<tz>[+-]\d{2}:?\d{2}|Z)? ")
# "[Fri Aug 30 11:43:09 2024] ..." (dmesg -T / --ctime)
_CTIME = re.compile(r"^\[(?:[A-Za-z]{3} )?(?P<mon>[A-Za-z]{3}) +(?P<day>\d{1,2}) "
                    r"(?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2}) (?P<year>\d{4})\]")


def line_time(text: str, captured_at: datetime) -> datetime | None:
    """When a kernel-log line was logged, on the clock of ``captured_at``; ``None`` when its
    prefix carries no wall-clock time (plain ``dmesg``: seconds since boot) or none at all.

    A journal or syslog prefix has no year: it is the latest year that does not put the line
    more than a day after ``captured_at`` (a day of slack for a host clock or time zone that
    differs from the reader's). A zone-less time is read in ``captured_at``'s zone; a
    zone-aware ``captured_at`` and an ISO line with an offset are compared as instants.
    """
    match = _ISO.match(text)
    if match is not None:
        stamp = match["stamp"]
        tz = match["tz"]
        when = datetime.fromisoformat(stamp + ("" if tz is None else ("+00:00" if tz == "Z" else
                                                                    tz if ":" in tz else tz[:3] + ":" + tz[3:])))
        if when.tzinfo is None:
            return when.replace(tzinfo=captured_at.tzinfo)
        return when if captured_at.tzinfo is not None else when.astimezone().replace(tzinfo=None)
    match = _CTIME.match(text)
    if match is not None:
        return _build(int(match["year"]), match, captured_at)
    match = _SHORT.match(text)
    if match is not None:
        for year in (captured_at.year + 1, captured_at.year, captured_at.year - 1):
            when = _build(year, match, captured_at)
            if when is not None and when <= captured_at + timedelta(days=1):
                return when
    return None


def _build(year: int, match: re.Match, captured_at: datetime) -> datetime | None:
    month = match["mon"].lower()
    if month not in _MONTHS:
        return None
    try:
        return datetime(year, _MONTHS.index(month) + 1, int(match["day"]), int(match["h"]), int(match["m"]),
                        int(match["s"]), tzinfo=captured_at.tzinfo)
    except ValueError:  # Feb 29 in a year without it, or nonsense
        return None


def _quote(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")
