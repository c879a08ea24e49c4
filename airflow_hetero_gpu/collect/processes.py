"""The collector's read of the GPUs' compute processes: constant command lines (standard library
only: the embedded emulated fleet answers them in-process, :mod:`airflow_hetero_gpu.testing.embedded.shell`).
"""

from __future__ import annotations

from typing import Iterable

#: The GPUs' compute processes (``apps.csv``), and the owners, process groups and job markers of
#: those processes (``procs.txt``: ``ps -o pid=,pgid=,user=`` and the ``HETERO_GPU_JOB_ID`` of the
#: process's environment as ``job=<id>``, nothing where it has none or it cannot be read:
#: another user's process).
#: In the one-session read the listing is kept in a shell variable so that ``ps`` asks about
#: exactly the pids it holds; run one by one (a host whose shell is not POSIX), ``ps`` gets the
#: pids parsed from the listing.
APPS_COMMAND = "nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,process_name --format=csv"
APPS_TOGETHER = f"hgpu_apps=$({APPS_COMMAND}); hgpu_rc=$?; printf '%s\\n' \"$hgpu_apps\"; (exit $hgpu_rc)"
_OWNERS = ("ps -o pid=,pgid=,user:32= -p \"$hgpu_pids\" | while read -r p g u; do "
           "j=$( (tr '\\000' '\\n' < /proc/$p/environ) 2>/dev/null | sed -n 's/^HETERO_GPU_JOB_ID=//p' | head -n 1); "
           "printf '%s %s %s %s\\n' \"$p\" \"$g\" \"$u\" \"${j:+job=$j}\"; done")
PROCS_TOGETHER = ("hgpu_pids=$(printf '%s\\n' \"$hgpu_apps\" | sed 1d | cut -d, -f2 | tr -d ' ' | paste -sd, -); "
                   f"if [ -n \"$hgpu_pids\" ]; then {_OWNERS}; else true; fi")


def procs_command(pids: Iterable[int]) -> str:
    """The owners' read for the given pids (integers parsed from ``apps.csv``: nothing else is
    interpolated)."""
    return "hgpu_pids=" + ",".join(str(int(p)) for p in pids) + "; " + _OWNERS


__all__ = ["APPS_COMMAND", "APPS_TOGETHER", "PROCS_TOGETHER", "procs_command"]
