"""PCI bus ids as the NVIDIA tools print them, reduced to one canonical spelling.

nvidia-smi prints ``00000000:3B:00.0`` (8-digit domain, upper case, function), the kernel log
prints ``PCI:0000:3b:00`` (4-digit domain, no function), the "Unable to determine the device
handle" message prints ``GPU 0000:0B:00.0`` or ``GPU0000:07:00.0``. They all name the same
device when domain, bus and device agree, so every reader in this package keys GPUs by
``dddd:bb:dd`` in lower case: domain as at least four hex digits, no function number.
"""

from __future__ import annotations

import re

__all__ = ["normalize_bus_id"]

_BUS_ID = re.compile(
    r"""
    (?:PCI:|GPU\s*)?                # prefixes used by the kernel log and nvidia-smi messages
    (?:(?P<domain>[0-9a-f]{1,8}):)? # lspci omits the domain when it is 0
    (?P<bus>[0-9a-f]{1,2}):
    (?P<device>[0-9a-f]{1,2})
    (?:\.(?P<function>[0-7]))?
    """,
    re.IGNORECASE | re.VERBOSE,
)


def normalize_bus_id(s: str) -> str:
    """Return ``s`` as ``dddd:bb:dd`` in lower case (domain, bus, device; function dropped).

    >>> normalize_bus_id("00000000:3B:00.0")
    '0000:3b:00'
    >>> normalize_bus_id("PCI:0000:3b:00")
    '0000:3b:00'
    >>> normalize_bus_id("GPU0000:07:00.0")
    '0000:07:00'

    A domain wider than 16 bits keeps all its digits (``0001a000:01:00.0`` -> ``1a000:01:00``),
    so two different devices never share a key. Raises ``ValueError`` on anything else.
    """
    match = _BUS_ID.fullmatch(s.strip()) if isinstance(s, str) else None
    if match is None:
        raise ValueError(f"not a PCI bus id: {s!r}")
    domain = int(match["domain"] or "0", 16)
    device = int(match["device"], 16)
    if device > 0x1F:  # a PCI device number has 5 bits
        raise ValueError(f"not a PCI bus id (device number {device:#x} > 0x1f): {s!r}")
    return f"{domain:04x}:{int(match['bus'], 16):02x}:{device:02x}"
