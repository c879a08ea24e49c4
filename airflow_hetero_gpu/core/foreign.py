"""GPUs used outside the scheduler: compute processes the scheduler did not start.

A host's ``apps.csv`` lists every compute process on its GPUs and ``procs.txt`` their owners and
process groups. A GPU that holds a compute process while no live reservation holds it is "in use
outside the scheduler" (unless cluster.yaml says ``thresholds.foreign_processes: ignore``): it is
never placed on or claimed, and its reason names who (``in use outside the scheduler: alice, pid
4242 python3, 1,632 MiB``). A GPU a job holds stays "reserved" whatever runs on it: the job's own
workers run there. A process on it that is not the job's (its environment carries no marker of
the job: ``HETERO_GPU_JOB_ID``, which the launch sets and every worker inherits; ``procs.txt``
says ``job=<id>``) is an *intruder*: the operator warns in the job's log, the page shows it, and
the job runs on. (The launch's process group does not tell the job's processes apart: torchrun
starts every worker in a session of its own.)

A process of a MIG-enabled GPU is placed on its MIG instance by the plain table's process list
(``mig-usage.txt``: GPU, GPU instance, compute instance and pid).
"""

from __future__ import annotations

from typing import Sequence

from airflow_hetero_gpu.capture.directory import HostCapture
from airflow_hetero_gpu.core.model import Gpu, GpuProcess

OUTSIDE = "in use outside the scheduler"


def host_processes(cap: HostCapture) -> dict[str, list[GpuProcess]]:
    """The host's compute processes with their owners, by the UUID of the GPU they run on."""
    out: dict[str, list[GpuProcess]] = {}
    for app in cap.apps or ():
        owner = cap.owners.get(app.pid)
        out.setdefault(app.gpu_uuid, []).append(GpuProcess(
            app.pid, app.name, app.memory_mib, owner.user if owner else None, owner.pgid if owner else None,
            owner.job if owner else None))
    return out


def instance_processes(cap: HostCapture, gpu_index: int, gpu_instance: int, compute_instance: int,
                       processes: Sequence[GpuProcess]) -> tuple[GpuProcess, ...]:
    """Of a MIG-enabled GPU's outside processes, those on one of its MIG instances."""
    if cap.mig_usage is None:
        return ()
    pids = {p.pid for p in cap.mig_usage.processes if p.gpu_index == gpu_index
            and p.gpu_instance == gpu_instance and p.compute_instance == compute_instance}
    return tuple(p for p in processes if p.pid in pids)


def outside_reason(gpu: Gpu) -> str | None:
    """``in use outside the scheduler: alice, pid 4242 python3, 1,632 MiB`` (None: no such process)."""
    if not gpu.outside:
        return None
    return f"{OUTSIDE}: " + "; ".join(p.describe() for p in gpu.outside)


def intruders(gpu: Gpu, job: str) -> tuple[GpuProcess, ...]:
    """The processes on a GPU that ``job`` holds that are not the job's own."""
    return tuple(p for p in gpu.outside if p.job != job)


def intruder_reason(gpu: Gpu, job: str) -> str | None:
    """``in use outside the scheduler beside job j: alice, pid 4242 python3, 1,632 MiB`` (None: none)."""
    found = intruders(gpu, job)
    if not found:
        return None
    return f"{OUTSIDE} beside job {job}: " + "; ".join(p.describe() for p in found)


__all__ = ["OUTSIDE", "host_processes", "instance_processes", "intruder_reason", "intruders", "outside_reason"]
