"""Readers of a host's compute processes: ``apps.csv`` and ``procs.txt``.

``apps.csv`` is ``nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,process_name
--format=csv``: a header line, then one line per process on a GPU (a driver of the 580 series
heads the memory column ``used_gpu_memory [MiB]``, older ones ``used_memory [MiB]``; the header
alone when no process runs)::

    gpu_uuid, pid, used_gpu_memory [MiB], process_name
    GPU-6e841afe-c5b7-9589-9c35-35532d81dc85, 440, 866 MiB, python3

``procs.txt`` is ``ps -o pid=,pgid=,user= -p <those pids>``: who owns each process and its
process group (``  440   436 nobody``), followed by the scheduler's job the process belongs to
as ``job=<id>`` (the ``HETERO_GPU_JOB_ID`` of its environment; nothing when it has none or it
cannot be read: another user's process). Other further columns (``ps``'s ``comm``) are ignored.
A process that ended between the two reads has no line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_hetero_gpu.errors import CaptureError

_COLUMNS = {"gpu_uuid": "gpu_uuid", "pid": "pid", "used_gpu_memory [MiB]": "memory",
            "used_memory [MiB]": "memory", "process_name": "name"}
_MIB = re.compile(r"^(\d+(?:\.\d+)?)\s*MiB$")


@dataclass(frozen=True)
class ComputeApp:
    """One compute process on a GPU: the GPU's UUID, its pid, name and memory (None: ``[N/A]``,
    which a driver prints for processes of other containers)."""

    gpu_uuid: str
    pid: int
    name: str
    memory_mib: float | None


@dataclass(frozen=True)
class Owner:
    """A process's owner and process group, as ``ps`` printed them, and the scheduler's job it
    belongs to (the ``HETERO_GPU_JOB_ID`` of its environment; None: none, or not readable)."""

    pid: int
    pgid: int
    user: str
    job: str | None = None


def parse_apps_csv(text: str, path: str) -> list[ComputeApp]:
    """``apps.csv`` read; CaptureError naming the file and line for anything else."""
    lines = [(n, raw) for n, raw in enumerate(text.lstrip("\ufeff").splitlines(), start=1) if raw.strip()]
    if not lines:
        raise CaptureError(path, "empty (expected the header of nvidia-smi --query-compute-apps)")
    number, header = lines[0]
    names = [c.strip() for c in header.split(",")]
    if any(n not in _COLUMNS for n in names) or {_COLUMNS[n] for n in names} != {"gpu_uuid", "pid", "memory", "name"}:
        raise CaptureError(path, f"not a --query-compute-apps=gpu_uuid,pid,used_memory,process_name header: "
                                 f"{header.strip()[:80]!r}", number)
    fields = [_COLUMNS[n] for n in names]
    out = []
    for number, raw in lines[1:]:
        # the process name is last and may itself hold commas
        values = [v.strip() for v in raw.split(",", len(fields) - 1)]
        if len(values) != len(fields):
            raise CaptureError(path, f"expected {len(fields)} values, got {len(values)}: {raw.strip()[:80]!r}", number)
        row = dict(zip(fields, values))
        if not row["pid"].isdigit():
            raise CaptureError(path, f"pid {row['pid']!r} is not a number", number)
        memory = None
        if not row["memory"].startswith("[N/A]"):
            m = _MIB.match(row["memory"])
            if m is None:
                raise CaptureError(path, f"memory {row['memory']!r} is not a number of MiB", number)
            memory = float(m[1])
        out.append(ComputeApp(row["gpu_uuid"], int(row["pid"]), row["name"], memory))
    return out


def parse_procs(text: str, path: str) -> dict[int, Owner]:
    """``procs.txt`` read: {pid: owner}; CaptureError naming the file and line for anything else."""
    out: dict[int, Owner] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        parts = raw.split()
        if not parts:
            continue
        if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
            raise CaptureError(path, f"expected 'PID PGID USER' (ps -o pid=,pgid=,user=), got {raw.strip()[:80]!r}",
                               number)
        job = parts[3][4:] or None if len(parts) == 4 and parts[3].startswith("job=") else None
        out[int(parts[0])] = Owner(int(parts[0]), int(parts[1]), parts[2], job)
    return out


__all__ = ["ComputeApp", "Owner", "parse_apps_csv", "parse_procs"]
