"""Writing a capture directory (SPEC §2) from stored raw outputs, e.g. the ledger's inventory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_hetero_gpu.fsutil import atomic_write


def write_capture_dir(out: str | Path, inventory: Any) -> int:
    """Write ``inventory`` (hosts with their raw ``files``, ``error`` and ``ok``, and the fleet's
    ``cluster.yaml`` / ``topology.conf``) as a capture directory; returns the hosts written.

    A host whose last collection failed gets its last good files and an ``error.txt``, exactly
    as a collection into a directory leaves it.
    """
    root = Path(out)
    for name, text in inventory.fleet_files.items():
        atomic_write(root / name, text)
    for name, row in sorted(inventory.hosts.items()):
        host_dir = root / "hosts" / name
        host_dir.mkdir(parents=True, exist_ok=True)
        for file_name, text in row.files.items():
            atomic_write(host_dir / file_name, text)
        error = host_dir / "error.txt"
        if row.ok:
            error.unlink(missing_ok=True)
        else:
            atomic_write(error, (row.error or "collection failed") + "\n")
    (root / "hosts").mkdir(parents=True, exist_ok=True)
    return len(inventory.hosts)
