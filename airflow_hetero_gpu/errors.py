"""Error types. Every user mistake becomes one of these: one line, naming the file, key or value."""

from __future__ import annotations


class HeteroGpuError(Exception):
    """Base class of every error this package raises on purpose.

    ``str(err)`` is a single line fit to print to a user; the CLI prints it and exits 2.
    """

    def __init__(self, message: str):
        # Keep the message on one line whatever the caller passed.
        super().__init__(" ".join(str(message).split()))


class CaptureError(HeteroGpuError):
    """A raw capture file (query.csv, topo.txt, xid.log, topology.conf) could not be read."""

    def __init__(self, path: str, message: str, line: int | None = None):
        self.path = str(path)
        self.line = line
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


class ConfigError(HeteroGpuError):
    """cluster.yaml (or an equivalent mapping) is invalid; the message names the key."""


class RequestError(HeteroGpuError):
    """A placement request is invalid (gpus <= 0, negative memory, ...)."""
