"""The collector's worker processes of a test's collection, found in /proc (shared by the tests of
the workers and of the health trigger that starts them)."""

from __future__ import annotations

import os
from pathlib import Path


def workers_of(pid: int) -> list[int]:
    """The collector worker processes whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"airflow_hetero_gpu.collect.shard_worker" in cmdline:
            found.append(int(entry))
    return found
