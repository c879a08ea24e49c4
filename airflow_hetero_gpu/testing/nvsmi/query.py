"""``nvidia-smi --query-gpu`` and ``-L`` of an emulated host, as the real tool prints them."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from airflow_hetero_gpu.testing.nvsmi.common import (
    INVALID_ARGS,
    NA,
    RC_GPU_IS_LOST,
    RC_INVALID_ARGUMENT,
    RC_OK,
    RC_OTHER,
    QueryError,
)
from airflow_hetero_gpu.testing.nvsmi.common import bus_id as _bus_id



def _na_or(value: Any, fmt: Callable[[Any], str] = str) -> str:
    return NA if value is None else fmt(value)


def _yes_no(value: Any) -> str:
    if value is None:
        return NA
    if isinstance(value, str):
        return value
    return "Yes" if value else "No"


def _active(value: Any) -> str:
    if value is None:
        return NA
    if isinstance(value, str):
        return value
    return "Active" if value else "Not Active"


def _watts(value: Any) -> str:
    return _na_or(value, lambda v: f"{float(v):.2f}")


def _bus_part(gpu: Mapping[str, Any], part: int) -> str:
    # "00000000:3B:00.0" -> domain, bus, device in the hex form the real tool prints.
    domain, bus, devfn = _bus_id(gpu).split(":")
    device = devfn.split(".")[0]
    values = (int(domain, 16), int(bus, 16), int(device, 16))
    widths = (4, 2, 2)
    return f"0x{values[part]:0{widths[part]}X}"


def _memory_free(gpu: Mapping[str, Any]) -> Any:
    total = gpu.get("memory_total_mib")
    if total is None:
        return None
    used = gpu.get("memory_used_mib") or 0
    reserved = gpu.get("memory_reserved_mib") or 0
    return max(0, int(total) - int(used) - int(reserved))


@dataclass(frozen=True)
class Field:
    """One ``--query-gpu`` property: its unit (shown in the header) and how to read it."""

    unit: str | None
    read: Callable[[Mapping[str, Any], Mapping[str, Any]], str]


def _g(key: str, fmt: Callable[[Any], str] = str) -> Callable[[Mapping[str, Any], Mapping[str, Any]], str]:
    return lambda host, gpu: _na_or(gpu.get(key), fmt)


def mig_enabled(gpu: Mapping[str, Any]) -> bool:
    return str(gpu.get("mig_mode") or "").lower() == "enabled"


def _fabric(gpu: Mapping[str, Any], key: str) -> str:
    value = (gpu.get("fabric") or {}).get(key)
    return "N/A" if value is None else str(value)


def _timestamp(host: Mapping[str, Any], gpu: Mapping[str, Any]) -> str:
    now = _dt.datetime.now()
    return now.strftime("%Y/%m/%d %H:%M:%S.") + f"{now.microsecond // 1000:03d}"


#: Canonical field name -> Field. Units and value shapes follow the real allfields captures.
FIELDS: dict[str, Field] = {
    "timestamp": Field(None, _timestamp),
    "driver_version": Field(None, lambda h, g: str(h.get("driver_version", NA))),
    "count": Field(None, lambda h, g: str(len(h.get("gpus", [])))),
    "name": Field(None, _g("name")),
    "serial": Field(None, _g("serial")),
    "uuid": Field(None, _g("uuid")),
    "pci.bus_id": Field(None, lambda h, g: _bus_id(g)),
    "pci.domain": Field(None, lambda h, g: _bus_part(g, 0)),
    "pci.bus": Field(None, lambda h, g: _bus_part(g, 1)),
    "pci.device": Field(None, lambda h, g: _bus_part(g, 2)),
    "pcie.link.gen.current": Field(None, _g("pcie_gen")),
    "pcie.link.gen.max": Field(None, _g("pcie_gen")),
    "pcie.link.width.current": Field(None, _g("pcie_width")),
    "pcie.link.width.max": Field(None, _g("pcie_width")),
    "index": Field(None, _g("index")),
    "persistence_mode": Field(None, lambda h, g: str(g.get("persistence_mode", "Enabled"))),
    "vbios_version": Field(None, _g("vbios_version")),
    "fan.speed": Field("%", _g("fan_speed")),
    "pstate": Field(None, lambda h, g: str(g.get("pstate", "P0"))),
    "memory.total": Field("MiB", _g("memory_total_mib")),
    "memory.reserved": Field("MiB", _g("memory_reserved_mib")),
    "memory.used": Field("MiB", _g("memory_used_mib")),
    "memory.free": Field("MiB", lambda h, g: _na_or(_memory_free(g))),
    "compute_mode": Field(None, lambda h, g: str(g.get("compute_mode", "Default"))),
    "compute_cap": Field(None, _g("compute_cap")),
    # on a MIG-enabled GPU the driver reports no utilization ("not currently supported")
    "utilization.gpu": Field("%", lambda h, g: NA if mig_enabled(g) else _na_or(g.get("utilization_gpu"))),
    "utilization.memory": Field("%", lambda h, g: NA if mig_enabled(g) else _na_or(g.get("utilization_memory"))),
    "ecc.mode.current": Field(None, _g("ecc_mode")),
    "ecc.mode.pending": Field(None, _g("ecc_mode")),
    "ecc.errors.corrected.volatile.total": Field(None, _g("ecc_corrected_volatile")),
    "ecc.errors.corrected.aggregate.total": Field(None, _g("ecc_corrected_aggregate")),
    "ecc.errors.uncorrected.volatile.total": Field(None, _g("ecc_uncorrected_volatile")),
    "ecc.errors.uncorrected.aggregate.total": Field(None, _g("ecc_uncorrected_aggregate")),
    "retired_pages.single_bit_ecc.count": Field(None, _g("retired_pages_sbe")),
    "retired_pages.double_bit.count": Field(None, _g("retired_pages_dbe")),
    "retired_pages.pending": Field(None, lambda h, g: _yes_no(g.get("retired_pages_pending"))),
    "remapped_rows.pending": Field(None, lambda h, g: _yes_no(g.get("remapped_rows_pending"))),
    "remapped_rows.failure": Field(None, lambda h, g: _yes_no(g.get("remapped_rows_failure"))),
    "clocks_event_reasons.hw_slowdown": Field(None, lambda h, g: _active(g.get("hw_slowdown"))),
    "temperature.gpu": Field(None, _g("temperature_c")),
    # The real tool prints a bare "N/A" here where the sensor is absent (L40S, RTX 4080 SUPER).
    "temperature.memory": Field(None, lambda h, g: _na_or(g.get("temperature_memory_c")).replace(NA, "N/A")),
    "power.draw": Field("W", lambda h, g: _watts(g.get("power_draw_w"))),
    "power.draw.average": Field("W", lambda h, g: _watts(g.get("power_draw_w"))),
    "power.draw.instant": Field("W", lambda h, g: _watts(g.get("power_draw_w"))),
    "power.limit": Field("W", lambda h, g: _watts(g.get("power_limit_w"))),
    "enforced.power.limit": Field("W", lambda h, g: _watts(g.get("power_limit_w"))),
    "power.default_limit": Field("W", lambda h, g: _watts(g.get("power_limit_w"))),
    "power.max_limit": Field("W", lambda h, g: _watts(g.get("power_max_limit_w", g.get("power_limit_w")))),
    "power.min_limit": Field("W", lambda h, g: _watts(g.get("power_min_limit_w"))),
    "clocks.current.graphics": Field("MHz", _g("clock_sm_mhz")),
    "clocks.current.sm": Field("MHz", _g("clock_sm_mhz")),
    "clocks.current.memory": Field("MHz", _g("clock_mem_mhz")),
    "clocks.max.graphics": Field("MHz", _g("clock_sm_max_mhz")),
    "clocks.max.sm": Field("MHz", _g("clock_sm_max_mhz")),
    "clocks.max.memory": Field("MHz", _g("clock_mem_mhz")),
    "mig.mode.current": Field(None, lambda h, g: _na_or(g.get("mig_mode"))),
    "mig.mode.pending": Field(None, lambda h, g: _na_or(g.get("mig_pending") or g.get("mig_mode"))),
    # the NVLink fabric: bare "N/A" without one (L40S, RTX); an HGX H100 reports Completed,
    # Success, clique 0 and an all-zero cluster UUID; an NVL72 tray its rack partition
    "fabric.state": Field(None, lambda h, g: _fabric(g, "state")),
    "fabric.status": Field(None, lambda h, g: _fabric(g, "status")),
    "fabric.cliqueId": Field(None, lambda h, g: _fabric(g, "clique_id")),
    "fabric.clusterUuid": Field(None, lambda h, g: _fabric(g, "cluster_uuid")),
    "fabric.health.summary": Field(None, lambda h, g: _fabric(g, "health_summary")),
    "fabric.health.bandwidth": Field(None, lambda h, g: _fabric(g, "bandwidth")),
    "platform.tray_index": Field(None, lambda h, g: str(g.get("tray_index") or 0)),
    "hostname": Field(None, lambda h, g: NA),
}

#: Aliases the real tool accepts and echoes under the canonical name in the header.
ALIASES: dict[str, str] = {
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "clocks.gr": "clocks.current.graphics",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.max.gr": "clocks.max.graphics",
    "clocks.max.mem": "clocks.max.memory",
    "power.draw.avg": "power.draw.average",
    # drivers from the 535 series on accept the older "throttle" names of the clock event reasons
    "clocks_throttle_reasons.hw_slowdown": "clocks_event_reasons.hw_slowdown",
}

#: Every property the real tool knows (name -> header unit), from real allfields captures.
KNOWN_FIELDS_FILE = Path(__file__).resolve().parents[1] / "data" / "query_gpu_fields.tsv"


def _known_fields() -> dict[str, str]:
    known: dict[str, str] = {}
    for line in KNOWN_FIELDS_FILE.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, _, unit = line.partition("\t")
            known[name] = unit
    return known


KNOWN_FIELDS = _known_fields()


def canonical_field(name: str) -> str:
    """The canonical name of a query field, or raise :class:`QueryError` like the real tool.

    Modelled fields read the state; other real fields print ``[N/A]``; unknown names are refused
    with the real message (on stdout) and exit status 2.
    """
    name = name.strip()
    canonical = ALIASES.get(name, name)
    if canonical in FIELDS:
        return canonical
    if canonical in KNOWN_FIELDS:
        unit = KNOWN_FIELDS[canonical] or None
        FIELDS[canonical] = Field(unit, lambda h, g: NA)
        return canonical
    raise QueryError(f'Field "{name}" is not a valid field to query.\n\n', RC_INVALID_ARGUMENT)


def parse_format(spec: str) -> tuple[bool, bool]:
    """``csv[,noheader][,nounits]`` -> (header, units); anything else is refused."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts or parts[0] != "csv" or any(p not in ("noheader", "nounits") for p in parts[1:]):
        raise QueryError(INVALID_ARGS + "\n\n", RC_INVALID_ARGUMENT)
    return "noheader" not in parts, "nounits" not in parts


def header_line(fields: Sequence[str]) -> str:
    """The CSV header: canonical names with ``[unit]`` where the field has one."""
    out = []
    for name in fields:
        unit = FIELDS[name].unit
        out.append(f"{name} [{unit}]" if unit else name)
    return ", ".join(out)


def value_text(host: Mapping[str, Any], gpu: Mapping[str, Any], name: str, units: bool) -> str:
    """One cell: an override from the state wins, else the field reader; units appended."""
    overrides = gpu.get("overrides") or {}
    if name in overrides:
        return str(overrides[name])
    raw = FIELDS[name].read(host, gpu)
    unit = FIELDS[name].unit
    if unit and units and not raw.startswith("[") and raw != "N/A":
        return f"{raw} {unit}"
    return raw


def lost_message(gpu: Mapping[str, Any]) -> str:
    """What the real tool prints for a GPU whose device handle cannot be obtained."""
    domain, rest = _bus_id(gpu).split(":", 1)
    bus4 = f"{domain[-4:]}:{rest}"
    reason = gpu.get("lost_reason") or "Unknown Error"
    return f"Unable to determine the device handle for GPU {bus4}: {reason}"


def lost_returncode(gpu: Mapping[str, Any]) -> int:
    reason = str(gpu.get("lost_reason") or "Unknown Error")
    return RC_GPU_IS_LOST if reason.startswith("GPU is lost") else RC_OTHER


def select_gpus(host: Mapping[str, Any], ids: str | None) -> list[Mapping[str, Any]]:
    """The GPUs named by ``-i/--id`` (indices, UUIDs or bus ids, comma separated), else all."""
    gpus = list(host.get("gpus", []))
    if not ids:
        return gpus
    wanted = [w.strip() for w in ids.split(",") if w.strip()]
    picked = []
    for gpu in gpus:
        keys = {str(gpu.get("index")), str(gpu.get("uuid")), _bus_id(gpu), _bus_id(gpu)[4:]}
        if any(w in keys for w in wanted):
            picked.append(gpu)
    return picked


def query_gpu(host: Mapping[str, Any], fields_spec: str, fmt_spec: str,
              ids: str | None = None) -> tuple[str, int]:
    """stdout text and exit status of ``nvidia-smi --query-gpu=FIELDS --format=FMT``.

    Lost GPUs get the real error line instead of a row; the error lines come first, before the
    header, as the real tool enumerates device handles before printing (see the docs).
    """
    # An older driver refuses fields it does not know yet (the state's "unknown_query_fields").
    unknown = set(host.get("unknown_query_fields") or ())
    for name in (f.strip() for f in fields_spec.split(",")):
        if name in unknown:
            return f'Field "{name}" is not a valid field to query.\n\n', RC_INVALID_ARGUMENT
    fields = [canonical_field(f) for f in fields_spec.split(",") if f.strip()]
    if not fields:
        raise QueryError(INVALID_ARGS + "\n\n", RC_INVALID_ARGUMENT)
    header, units = parse_format(fmt_spec)
    gpus = select_gpus(host, ids)
    errors = [lost_message(g) for g in gpus if g.get("lost")]
    rows = [
        ", ".join(value_text(host, g, f, units) for f in fields)
        for g in gpus if not g.get("lost")
    ]
    lines = errors + ([header_line(fields)] if header else []) + rows
    rc = RC_OK
    for g in gpus:
        if g.get("lost"):
            rc = lost_returncode(g)
            break
    return "".join(line + "\n" for line in lines), rc


def list_gpus(host: Mapping[str, Any]) -> tuple[str, int]:
    """stdout text and exit status of ``nvidia-smi -L``."""
    lines, rc = [], RC_OK
    for gpu in host.get("gpus", []):
        if gpu.get("lost"):
            lines.append(lost_message(gpu))
            rc = lost_returncode(gpu)
        else:
            lines.append(f"GPU {gpu.get('index')}: {gpu.get('name')} (UUID: {gpu.get('uuid')})")
            if mig_enabled(gpu):
                for device, mig in enumerate(gpu.get("mig_devices") or []):
                    lines.append(f"  MIG {mig.get('profile'):<12}Device {device:>2}: (UUID: {mig.get('uuid')})")
    return "".join(line + "\n" for line in lines), rc





def iter_field_names() -> Iterable[str]:
    """Every field name the emulation accepts (canonical names and aliases)."""
    yield from FIELDS
    yield from ALIASES
