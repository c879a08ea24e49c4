"""A stand-in for ``pynvml`` that answers from an emulated host's state (no GPU on test machines).

It mimics what NVML returns: bytes-valued memory sizes, milliwatts, PCI info structs with an
8-digit-domain ``busId``, the ``NVML_FEATURE_*`` flags for pending retired pages, and the NVML
error codes (``NVMLError.value``) for unsupported values, unknown errors, a GPU that needs a reset
or is lost. State values the emulated ``nvidia-smi`` prints as ``[N/A]`` (``None``) make the
matching NVML call fail with ``NVML_ERROR_NOT_SUPPORTED``; an ``overrides`` entry of the state
that the fake ``nvidia-smi`` prints verbatim (``"[Unknown Error]"``, ``"[GPU requires reset]"``,
``"[N/A]"``) makes the call fail with the error code nvidia-smi shows that way.

Used two ways: ``FakeNvml(state)`` passed to the collector in-process, and as the ``pynvml`` module
of an emulated host (:func:`install_as_pynvml`), so the agent runs over real SSH against it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Mapping

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_UNKNOWN = 999

ERROR_STRINGS = {
    NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}

#: nvidia-smi's printed text -> the NVML error that makes it print so.
OVERRIDE_ERRORS = {
    "[n/a]": NVML_ERROR_NOT_SUPPORTED,
    "[not supported]": NVML_ERROR_FUNCTION_NOT_FOUND,
    "[unknown error]": NVML_ERROR_UNKNOWN,
    "[gpu requires reset]": NVML_ERROR_RESET_REQUIRED,
    "[insufficient permissions]": NVML_ERROR_NO_PERMISSION,
    "[gpu is lost]": NVML_ERROR_GPU_IS_LOST,
}

MIB = 1024 * 1024


class NVMLError(Exception):
    """Like pynvml's: ``value`` is the NVML return code, ``str()`` its text."""

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")


class FakeNvml:
    """The slice of the ``pynvml`` API the collector uses, answering from a host state."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1
    nvmlMemory_v2 = 0x02000028

    def __init__(self, state: Mapping[str, Any], *, init_error: int | None = None,
                 bytes_strings: bool = False, lost_during_read: set[int] | None = None):
        self.state = state
        self.init_error = init_error
        self.bytes_strings = bytes_strings  # old nvidia-ml-py releases return bytes
        self.lost_during_read = set(lost_during_read or ())
        self.initialised = 0
        self.calls: list[str] = []

    @classmethod
    def from_state_file(cls, path: str | os.PathLike[str]) -> "FakeNvml":
        return cls(json.loads(Path(path).read_text(encoding="utf-8")))

    # -- life cycle ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        if "driver_gone" in self.state.get("faults", []):
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self._need_init()
        self.initialised -= 1

    def _need_init(self) -> None:
        if self.initialised <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    # -- devices ------------------------------------------------------------------------------

    def _gpus(self) -> list[Mapping[str, Any]]:
        if "no_devices" in self.state.get("faults", []):
            return []
        return sorted(self.state.get("gpus", []), key=lambda g: g["index"])

    def nvmlDeviceGetCount(self) -> int:
        self._need_init()
        return len(self._gpus())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Mapping[str, Any]:
        self._need_init()
        gpus = self._gpus()
        if not 0 <= index < len(gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = gpus[index]
        if gpu.get("lost"):
            reason = str(gpu.get("lost_reason") or "Unknown Error")
            raise NVMLError(NVML_ERROR_GPU_IS_LOST if reason.startswith("GPU is lost") else NVML_ERROR_UNKNOWN)
        return gpu

    def _value(self, gpu: Mapping[str, Any], field: str, key: str | None,
               convert: Callable[[Any], Any] = lambda v: v) -> Any:
        """The state's value for a query ``field``, or the NVML error nvidia-smi shows."""
        self._need_init()
        if gpu["index"] in self.lost_during_read and field != "pci.bus_id":
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        override = (gpu.get("overrides") or {}).get(field)
        if override is not None:
            code = OVERRIDE_ERRORS.get(str(override).lower())
            if code is None:
                raise AssertionError(f"the fake NVML cannot produce override {override!r}")
            raise NVMLError(code)
        value = gpu.get(key) if key else None
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return convert(value)

    def _string(self, text: str) -> str | bytes:
        return text.encode() if self.bytes_strings else text

    def nvmlDeviceGetUUID(self, handle: Mapping[str, Any]) -> str | bytes:
        return self._string(self._value(handle, "uuid", "uuid"))

    def nvmlDeviceGetName(self, handle: Mapping[str, Any]) -> str | bytes:
        return self._string(self._value(handle, "name", "name"))

    def nvmlDeviceGetPciInfo(self, handle: Mapping[str, Any]) -> SimpleNamespace:
        bus = self._value(handle, "pci.bus_id", "pci_bus_id")
        return SimpleNamespace(busId=self._string(bus), busIdLegacy=self._string(bus[4:]))

    def nvmlDeviceGetMemoryInfo(self, handle: Mapping[str, Any], version: int | None = None) -> SimpleNamespace:
        total = self._value(handle, "memory.total", "memory_total_mib") * MIB
        used = self._value(handle, "memory.used", "memory_used_mib") * MIB
        reserved = int(handle.get("memory_reserved_mib") or 0) * MIB
        if version is None:  # v1: "used" includes the driver's reserved memory
            return SimpleNamespace(total=total, used=used + reserved, free=total - used - reserved)
        return SimpleNamespace(version=version, total=total, reserved=reserved, used=used,
                               free=total - used - reserved)

    def nvmlDeviceGetUtilizationRates(self, handle: Mapping[str, Any]) -> SimpleNamespace:
        gpu = self._value(handle, "utilization.gpu", "utilization_gpu")
        return SimpleNamespace(gpu=gpu, memory=handle.get("utilization_memory") or 0)

    def nvmlDeviceGetTemperature(self, handle: Mapping[str, Any], sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return int(self._value(handle, "temperature.gpu", "temperature_c"))

    def nvmlDeviceGetPowerUsage(self, handle: Mapping[str, Any]) -> int:
        return self._value(handle, "power.draw", "power_draw_w", lambda w: int(round(float(w) * 1000)))

    def nvmlDeviceGetPowerManagementLimit(self, handle: Mapping[str, Any]) -> int:
        return self._value(handle, "power.limit", "power_limit_w", lambda w: int(round(float(w) * 1000)))

    def nvmlDeviceGetTotalEccErrors(self, handle: Mapping[str, Any], error_type: int, counter: int) -> int:
        assert (error_type, counter) == (self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, self.NVML_VOLATILE_ECC)
        return int(self._value(handle, "ecc.errors.uncorrected.volatile.total", "ecc_uncorrected_volatile"))

    def nvmlDeviceGetRemappedRows(self, handle: Mapping[str, Any]) -> tuple[int, int, int, int]:
        """(corrected rows, uncorrected rows, pending, failure occurred), or NOT_SUPPORTED on cards
        without row remapping (a state with either flag ``None``)."""
        pending = self._value(handle, "remapped_rows.pending", "remapped_rows_pending")
        failure = self._value(handle, "remapped_rows.failure", "remapped_rows_failure")
        return 0, 0, int(bool(pending)), int(bool(failure))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Mapping[str, Any]) -> int:
        slowdown = self._value(handle, "clocks_event_reasons.hw_slowdown", "hw_slowdown")
        return 0x1 | (0x8 if slowdown else 0)  # GPU idle, plus HW slowdown when on

    def nvmlDeviceGetMigMode(self, handle: Mapping[str, Any]) -> list[int]:
        """[current, pending]: 1 enabled, 0 disabled; NOT_SUPPORTED on GPUs without MIG."""
        current = self._value(handle, "mig.mode.current", "mig_mode")
        pending = handle.get("mig_pending") or current
        return [int(str(current).lower() == "enabled"), int(str(pending).lower() == "enabled")]

    class c_nvmlGpuFabricInfo_t:  # noqa: N801 - pynvml's name
        clusterUuid = bytes(16)
        status = 0
        cliqueId = 0
        state = 0

    @staticmethod
    def byref(obj: Any) -> Any:
        return obj

    def nvmlErrorString(self, code: int) -> str:
        return ERROR_STRINGS.get(code, f"NVML Error with code {code}")

    def nvmlDeviceGetGpuFabricInfo(self, handle: Mapping[str, Any], info: Any) -> int:
        """Fills ``info`` from the state's ``fabric``; NOT_SUPPORTED on GPUs without a fabric."""
        fabric = self._value(handle, "fabric.state", "fabric")
        states = {"not started": 1, "in progress": 2, "completed": 3}
        info.state = states[str(fabric["state"]).lower()]
        status = str(fabric.get("status") or "Success")
        info.status = 0 if status == "Success" else next(c for c, t in ERROR_STRINGS.items() if t == status)
        info.cliqueId = int(fabric.get("clique_id") or 0)
        info.clusterUuid = bytes.fromhex(str(fabric.get("cluster_uuid") or "0" * 32).replace("-", ""))
        return 0

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Mapping[str, Any]) -> int:
        pending = self._value(handle, "retired_pages.pending", "retired_pages_pending")
        return self.NVML_FEATURE_ENABLED if pending else self.NVML_FEATURE_DISABLED


def install_as_pynvml(module_dir: Path) -> Path:
    """Write ``module_dir/pynvml.py``: a ``pynvml`` that is a :class:`FakeNvml` over the emulated
    host's state (found through ``$HETERO_GPU_EMU_STATE``, as the fake nvidia-smi finds it)."""
    module_dir.mkdir(parents=True, exist_ok=True)
    tests_dir = Path(__file__).resolve().parent
    (module_dir / "pynvml.py").write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(tests_dir)!r})\n"
        "from fake_pynvml import FakeNvml\n"
        "sys.modules[__name__] = FakeNvml.from_state_file(os.environ['HETERO_GPU_EMU_STATE'])\n",
        encoding="utf-8",
    )
    return module_dir / "pynvml.py"


def install_python3(bin_dir: Path, pythonpath: Path) -> Path:
    """Write ``bin_dir/python3``: this test interpreter, seeing ``pythonpath`` (the fake pynvml)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "python3"
    script.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH={str(pythonpath)!r}\n"
        "export PYTHONPATH\n"
        f"exec {sys.executable!r} \"$@\"\n",
        encoding="utf-8",
    )
    script.chmod(0o755)
    return script
