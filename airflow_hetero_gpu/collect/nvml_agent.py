"""The NVML agent: ``nvidia-smi --query-gpu`` output produced through NVML, as one JSON object.

Runs on a GPU host in either of two ways::

    python3 -m airflow_hetero_gpu.collect.nvml_agent          # where the package is installed
    python3 - < nvml_agent.py                                  # piped over SSH, nothing installed

and prints ``{"query_csv": TEXT, "error": null}`` or ``{"query_csv": null, "error": REASON}``.
``TEXT`` is exactly what ``nvidia-smi --query-gpu=<SPEC fields> --format=csv`` prints for the same
GPUs: the same header, units and number formats, the bracketed values (``[N/A]``,
``[Unknown Error]``, ...) where NVML reports an error for one value, and the "Unable to determine
the device handle" lines for GPUs NVML cannot open. ``error`` is set when NVML cannot be used at
all (no ``pynvml``, no driver, no GPU); the SSH collector then falls back to ``nvidia-smi``.

This file must run on its own: it imports the standard library and ``pynvml`` (package
``nvidia-ml-py``) only, and nothing from this package. The formatting code therefore lives here;
:mod:`airflow_hetero_gpu.collect.nvml` is the package-side API over it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Iterable

#: The ``--query-gpu`` fields of SPEC section 2 (``capture.directory.QUERY_FIELDS``) followed by
#: the optional health fields the collector asks nvidia-smi for (``capture.query.
#: EXTRA_HEALTH_FIELDS``), the MIG mode (``MIG_FIELDS``) and the fabric registration (the first
#: four ``FABRIC_FIELDS``; NVML's fabric health mask and the tray index are left to nvidia-smi);
#: repeated because this file may not import the package, and kept equal to those by a test.
FIELDS = (
    "index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used", "utilization.gpu",
    "temperature.gpu", "power.draw", "power.limit", "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure",
    "clocks_event_reasons.hw_slowdown", "mig.mode.current", "mig.mode.pending",
    "fabric.state", "fabric.status", "fabric.cliqueId", "fabric.clusterUuid",
)
#: nvmlGpuFabricState_t as nvidia-smi prints it (0: not supported, which it prints as N/A).
FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}
#: Units nvidia-smi shows in the header (``memory.total [MiB]``) and after each value.
UNITS = {"memory.total": "MiB", "memory.used": "MiB", "utilization.gpu": "%",
         "power.draw": "W", "power.limit": "W"}

#: Where the NVIDIA kernel module lists its GPUs by PCI bus id (to name GPUs NVML cannot open).
PROC_GPUS_DIR = "/proc/driver/nvidia/gpus"

NA = "[N/A]"
NOT_SUPPORTED = "[Not Supported]"
UNKNOWN_ERROR = "[Unknown Error]"
REQUIRES_RESET = "[GPU requires reset]"
NO_PERMISSION = "[Insufficient Permissions]"
MIB = 1024 * 1024
#: nvmlClocksEventReasonHwSlowdown (the same bit as the older nvmlClocksThrottleReasonHwSlowdown).
HW_SLOWDOWN = 0x0000000000000008

# NVML return codes (nvml.h); the numbers are part of NVML's ABI.
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_NO_DATA = 21
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_UNKNOWN = 999

#: How nvidia-smi prints a value NVML could not give. Current drivers print ``[N/A]`` for an
#: unsupported value; drivers before ~2019 printed ``[Not Supported]``, which is what a function
#: missing from an old driver's NVML stands for here.
VALUE_ERRORS = {
    NVML_ERROR_NOT_SUPPORTED: NA,
    NVML_ERROR_NOT_FOUND: NA,
    NVML_ERROR_INVALID_ARGUMENT: NA,
    NVML_ERROR_NO_DATA: NA,
    NVML_ERROR_DEPRECATED: NA,
    NVML_ERROR_FUNCTION_NOT_FOUND: NOT_SUPPORTED,
    NVML_ERROR_NO_PERMISSION: NO_PERMISSION,
    NVML_ERROR_RESET_REQUIRED: REQUIRES_RESET,
    NVML_ERROR_UNKNOWN: UNKNOWN_ERROR,
}
#: What follows "Unable to determine the device handle for GPU <bus id>: " in nvidia-smi.
HANDLE_ERRORS = {
    NVML_ERROR_GPU_IS_LOST: "GPU is lost. Reboot the system to recover this GPU",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}
#: nvidia-smi's whole-host messages for NVML initialisation failures.
DRIVER_NOT_LOADED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                     "Make sure that the latest NVIDIA driver is installed and running.")
LIBRARY_NOT_FOUND = ("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. "
                     "Please make sure that the NVIDIA Display Driver is properly installed and present "
                     "in your system.")
NO_DEVICES = "No devices were found"


class NvmlUnavailable(RuntimeError):
    """NVML cannot report on this host at all; ``str()`` says why (one line)."""


class _DeviceLost(Exception):
    """A GPU went away while its values were read."""


def _code(exc: BaseException) -> int:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else NVML_ERROR_UNKNOWN


def _text(value: Any) -> str:
    """pynvml returns ``str`` in recent releases, ``bytes`` in older ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def format_bus_id(raw: Any) -> str:
    """A bus id as nvidia-smi's ``pci.bus_id`` prints it: ``00000000:3B:00.0``.

    Accepts NVML's form, the kernel's ``0000:3b:00.0`` and ``3b:00.0``; ValueError otherwise.
    """
    parts = _text(raw).strip().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        raise ValueError(f"not a PCI bus id: {raw!r}")
    domain, bus, devfn = parts
    device, _, function = devfn.partition(".")
    return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{int(function or '0', 16):X}"


def _handle_bus_id(bus_id: str) -> str:
    """``00000000:3B:00.0`` -> ``0000:3B:00.0``, the form of nvidia-smi's device-handle errors."""
    domain, _, rest = bus_id.partition(":")
    return f"{domain[-4:]}:{rest}"


def proc_bus_ids(proc_dir: str = PROC_GPUS_DIR) -> list[str]:
    """The GPUs the kernel module knows, as ``00000000:3B:00.0``, in PCI order (NVML's order)."""
    try:
        names = os.listdir(proc_dir)
    except OSError:
        return []
    out = []
    for name in names:
        try:
            out.append(format_bus_id(name))
        except ValueError:
            continue
    return sorted(out)


class _Reader:
    """Reads one value with NVML and formats it, turning NVML errors into nvidia-smi's text."""

    def __init__(self, nvml: Any):
        self.nvml = nvml

    def cell(self, read: Callable[[], Any], fmt: Callable[[Any], str] = str) -> str:
        try:
            value = read()
        except self.nvml.NVMLError as exc:
            code = _code(exc)
            if code == NVML_ERROR_GPU_IS_LOST:
                raise _DeviceLost() from exc
            return VALUE_ERRORS.get(code, UNKNOWN_ERROR)
        except AttributeError:  # an older pynvml without this function
            return NOT_SUPPORTED
        return fmt(value)


def _memory(nvml: Any, handle: Any) -> Any:
    """Memory info, v2 (``used`` without the driver's reserved memory, as nvidia-smi >= R510)."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
        except nvml.NVMLError as exc:
            if _code(exc) not in (NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                                  NVML_ERROR_NOT_SUPPORTED):
                raise
    return nvml.nvmlDeviceGetMemoryInfo(handle)


def _clock_event_reasons(nvml: Any, handle: Any) -> int:
    """The current clock event reasons bit mask (the older "throttle" call on older pynvml/drivers)."""
    current = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if current is not None:
        try:
            return int(current(handle))
        except nvml.NVMLError as exc:
            if _code(exc) != NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
    return int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))


def _watts(milliwatts: Any) -> str:
    return f"{int(milliwatts) / 1000:.2f} W"


def _yes_no(state: Any) -> str:
    return "Yes" if int(state) else "No"


def _active(mask: Any) -> str:
    return "Active" if int(mask) & HW_SLOWDOWN else "Not Active"


def _enabled(mode: Any) -> str:
    return "Enabled" if int(mode) else "Disabled"


def _bare_na(text: str) -> str:
    """nvidia-smi prints the fabric fields of a GPU without a fabric as a bare ``N/A``."""
    return "N/A" if text in (NA, NOT_SUPPORTED) else text


def _cluster_uuid(raw: Any) -> str:
    data = bytes(raw)
    h = data.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def device_row(nvml: Any, index: int, handle: Any) -> tuple[str, str | None]:
    """(CSV row, bus id) of one opened GPU; raises _DeviceLost when it goes away meanwhile."""
    r = _Reader(nvml)
    bus_id: list[str] = []

    def read_bus() -> str:
        bus_id.append(format_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId))
        return bus_id[0]

    memory: list[Any] = []

    def mem(attr: str) -> Callable[[], Any]:
        def read() -> Any:
            if not memory:
                memory.append(_memory(nvml, handle))
            return getattr(memory[0], attr)
        return read

    remap: list[Any] = []

    def remapped(position: int) -> Callable[[], Any]:
        # (corrected rows, uncorrected rows, pending, failure occurred): one call for both cells
        def read() -> Any:
            if not remap:
                remap.append(tuple(nvml.nvmlDeviceGetRemappedRows(handle)))
            return remap[0][position]
        return read

    mig: list[Any] = []

    def mig_mode(position: int) -> Callable[[], Any]:
        def read() -> Any:
            if not mig:
                mig.append(tuple(nvml.nvmlDeviceGetMigMode(handle)))  # (current, pending)
            return mig[0][position]
        return read

    fabric: list[Any] = []

    def fab(attr: str) -> Callable[[], Any]:
        def read() -> Any:
            if not fabric:
                info = nvml.c_nvmlGpuFabricInfo_t()
                nvml.nvmlDeviceGetGpuFabricInfo(handle, nvml.byref(info))
                if int(info.state) not in FABRIC_STATES:  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
                    raise nvml.NVMLError(NVML_ERROR_NOT_SUPPORTED)
                fabric.append(info)
            info = fabric[0]
            if attr == "state":
                return FABRIC_STATES[int(info.state)]
            if attr == "status":  # valid once the registration completed
                if int(info.state) != 3:
                    return "N/A"
                return "Success" if int(info.status) == 0 else _text(nvml.nvmlErrorString(int(info.status)))
            if attr == "cliqueId":
                return str(int(info.cliqueId))
            return _cluster_uuid(info.clusterUuid)
        return read

    cells = [
        str(index),
        r.cell(lambda: _text(nvml.nvmlDeviceGetUUID(handle))),
        r.cell(lambda: _text(nvml.nvmlDeviceGetName(handle))),
        r.cell(read_bus),
        r.cell(mem("total"), lambda v: f"{int(v) // MIB} MiB"),
        r.cell(mem("used"), lambda v: f"{int(v) // MIB} MiB"),
        r.cell(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu, lambda v: f"{int(v)} %"),
        r.cell(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU), lambda v: str(int(v))),
        r.cell(lambda: nvml.nvmlDeviceGetPowerUsage(handle), _watts),
        r.cell(lambda: nvml.nvmlDeviceGetPowerManagementLimit(handle), _watts),
        r.cell(lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC), lambda v: str(int(v))),
        r.cell(lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle), _yes_no),
        r.cell(remapped(2), _yes_no),
        r.cell(remapped(3), _yes_no),
        r.cell(lambda: _clock_event_reasons(nvml, handle), _active),
        r.cell(mig_mode(0), _enabled),
        r.cell(mig_mode(1), _enabled),
        *(_bare_na(r.cell(fab(attr))) for attr in ("state", "status", "cliqueId", "clusterUuid")),
    ]
    return ", ".join(cells), (bus_id[0] if bus_id else None)


def header_line() -> str:
    """The header nvidia-smi prints for :data:`FIELDS`."""
    return ", ".join(f"{f} [{UNITS[f]}]" if f in UNITS else f for f in FIELDS)


def _init_failure(nvml: Any, exc: BaseException) -> NvmlUnavailable:
    code = _code(exc)
    if code == NVML_ERROR_DRIVER_NOT_LOADED:
        return NvmlUnavailable(f"NVML: {DRIVER_NOT_LOADED}")
    if code == NVML_ERROR_LIBRARY_NOT_FOUND:
        return NvmlUnavailable(f"NVML: {LIBRARY_NOT_FOUND}")
    return NvmlUnavailable(f"Failed to initialize NVML: {exc}")


def render_query_csv(nvml: Any, proc_dir: str = PROC_GPUS_DIR) -> str:
    """``nvidia-smi --query-gpu=<FIELDS> --format=csv`` text for this host, from NVML.

    ``nvml`` is the ``pynvml`` module (or anything with its API). Raises :class:`NvmlUnavailable`
    when NVML cannot be initialised or sees no GPU. GPUs whose handle cannot be opened, or that
    are lost while being read, become "Unable to determine the device handle" lines before the
    header, as nvidia-smi prints them; their bus ids come from ``proc_dir`` (the kernel module's
    list), since NVML cannot say.
    """
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise _init_failure(nvml, exc) from None
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML: cannot count GPUs: {exc}") from None
        if count == 0:
            raise NvmlUnavailable(f"NVML: {NO_DEVICES}")
        rows: list[str] = []
        seen_bus: list[str] = []
        lost: list[tuple[int, str | None, str]] = []  # index, bus id if known, message
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as exc:
                lost.append((index, None, HANDLE_ERRORS.get(_code(exc), str(exc))))
                continue
            try:
                row, bus = device_row(nvml, index, handle)
            except _DeviceLost:
                bus = _bus_or_none(nvml, handle)
                lost.append((index, bus, HANDLE_ERRORS[NVML_ERROR_GPU_IS_LOST]))
                continue
            rows.append(row)
            if bus:
                seen_bus.append(bus)
        lines = _lost_lines(lost, seen_bus, proc_dir) + [header_line()] + rows
        return "".join(line + "\n" for line in lines)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _bus_or_none(nvml: Any, handle: Any) -> str | None:
    try:
        return format_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
    except (nvml.NVMLError, ValueError):
        return None


def _lost_lines(lost: Iterable[tuple[int, str | None, str]], seen_bus: list[str], proc_dir: str) -> list[str]:
    """One nvidia-smi line per GPU that could not be read; unknown bus ids are taken, in PCI
    order, from the kernel module's GPUs that NVML did not report."""
    lost = list(lost)
    if not lost:
        return []
    known = set(seen_bus) | {bus for _, bus, _ in lost if bus}
    spare = iter(b for b in proc_bus_ids(proc_dir) if b not in known)
    lines = []
    for _index, bus, message in lost:
        bus = bus or next(spare, "00000000:00:00.0")
        lines.append(f"Unable to determine the device handle for GPU {_handle_bus_id(bus)}: {message}")
    return lines


def collect(proc_dir: str = PROC_GPUS_DIR) -> dict[str, str | None]:
    """The agent's answer: ``{"query_csv": ..., "error": ...}`` (exactly one is set)."""
    try:
        import pynvml  # noqa: PLC0415 - optional: hosts without it get an error, not a crash
    except ImportError as exc:
        return {"query_csv": None, "error": f"pynvml is not installed ({exc}): pip install nvidia-ml-py"}
    try:
        return {"query_csv": render_query_csv(pynvml, proc_dir), "error": None}
    except NvmlUnavailable as exc:
        return {"query_csv": None, "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - any NVML surprise must still answer in JSON
        return {"query_csv": None, "error": f"NVML agent failed: {type(exc).__name__}: {exc}"}


def main() -> int:
    """Print the agent's JSON answer on stdout; exit 0 (the answer says whether it worked)."""
    sys.stdout.write(json.dumps(collect()) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
