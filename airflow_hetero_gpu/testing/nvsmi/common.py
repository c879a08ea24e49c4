"""What every part of the emulated ``nvidia-smi`` shares: the "no value" text, whole-host
messages, return codes, the refusal error and bus-id helpers."""

from __future__ import annotations

from typing import Any, Mapping

NA = "[N/A]"

DRIVER_NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
NO_DEVICES = "No devices were found"
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."

#: Documented nvidia-smi return codes (man page, "RETURN VALUE").
RC_OK = 0
RC_INVALID_ARGUMENT = 2
RC_NOT_FOUND = 6
RC_DRIVER_NOT_LOADED = 9
RC_GPU_IS_LOST = 15
RC_OTHER = 255


class QueryError(Exception):
    """A ``--query-gpu`` request the real tool refuses; ``str()`` is its stdout text."""

    def __init__(self, message: str, returncode: int = RC_INVALID_ARGUMENT):
        super().__init__(message)
        self.returncode = returncode


def bus_id(gpu: Mapping[str, Any]) -> str:
    return str(gpu.get("pci_bus_id") or "00000000:00:00.0")
