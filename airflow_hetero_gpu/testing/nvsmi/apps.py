"""``nvidia-smi --query-compute-apps`` of an emulated host, as the real tool prints it.

Evidence (driver 580.159.04, ``shared/data/nvidia-smi/h200-device``): a header of canonical
names joined by ``", "`` with the memory column headed ``used_gpu_memory [MiB]`` whether it was
asked as ``used_memory`` or ``used_gpu_memory``; one line per process, ``866 MiB`` (``866`` with
``nounits``); the header alone when no process runs. On a MIG-enabled GPU the processes of its
MIG devices are listed under the GPU's UUID.

A process of the state is ``{"pid", "name", "memory_mib"}``: a test may list the pid of a real
process of the test machine, so ``ps`` on the emulated host reads its real owner.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from airflow_hetero_gpu.testing.nvsmi.common import INVALID_ARGS, RC_INVALID_ARGUMENT, QueryError
from airflow_hetero_gpu.testing.nvsmi.query import parse_format

#: asked name -> (header name, unit, reader of (gpu, process))
_FIELDS = {
    "gpu_uuid": ("gpu_uuid", None, lambda g, p: str(g.get("uuid", ""))),
    "gpu_bus_id": ("gpu_bus_id", None, lambda g, p: str(g.get("pci_bus_id", ""))),
    "gpu_name": ("gpu_name", None, lambda g, p: str(g.get("name", ""))),
    "gpu_serial": ("gpu_serial", None, lambda g, p: str(g.get("serial") or "[N/A]")),
    "pid": ("pid", None, lambda g, p: str(int(p["pid"]))),
    "process_name": ("process_name", None, lambda g, p: str(p.get("name", ""))),
    "name": ("process_name", None, lambda g, p: str(p.get("name", ""))),
    "used_memory": ("used_gpu_memory", "MiB", lambda g, p: str(int(p.get("memory_mib", 0)))),
    "used_gpu_memory": ("used_gpu_memory", "MiB", lambda g, p: str(int(p.get("memory_mib", 0)))),
}


def _processes(gpu: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    yield from gpu.get("processes") or []
    for device in gpu.get("mig_devices") or []:
        yield from device.get("processes") or []


def query_compute_apps(host: Mapping[str, Any], fields_spec: str, fmt_spec: str) -> tuple[str, int]:
    """stdout text and exit status of ``nvidia-smi --query-compute-apps=FIELDS --format=FMT``."""
    names = [n.strip() for n in fields_spec.split(",") if n.strip()]
    for name in names:
        if name not in _FIELDS:
            raise QueryError(f'Field "{name}" is not a valid field to query.\n\n', RC_INVALID_ARGUMENT)
    if not names:
        raise QueryError(INVALID_ARGS + "\n\n", RC_INVALID_ARGUMENT)
    header, units = parse_format(fmt_spec)
    lines = []
    if header:
        lines.append(", ".join(f"{_FIELDS[n][0]} [{_FIELDS[n][1]}]" if _FIELDS[n][1] else _FIELDS[n][0]
                               for n in names))
    for gpu in host.get("gpus") or []:
        if gpu.get("lost"):
            continue
        for proc in _processes(gpu):
            cells = []
            for n in names:
                _, unit, read = _FIELDS[n]
                text = read(gpu, proc)
                cells.append(f"{text} {unit}" if unit and units else text)
            lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines), 0


__all__ = ["query_compute_apps"]
