"""Reader of ``nvidia-smi --query-gpu=<fields> --format=csv`` output (SPEC §2, §4).

The reader goes by the header line, so the fields may come in any order, extra fields are
ignored, and only ``index``, ``name`` and ``memory.total`` are required. Values may carry units
(``81920 MiB``) or not (``nounits``). Bracketed values are nvidia-smi's way of saying "no value":
``[N/A]``, ``[Not Supported]`` and friends become ``None``; ``[Unknown Error]`` and
``[GPU requires reset]`` also flag the row (the planner marks such a GPU ``lost``).

Besides CSV, nvidia-smi prints two kinds of failure on stdout, both recognised here:

* a whole-host failure ("No devices were found", "NVIDIA-SMI has failed because it couldn't
  communicate with the NVIDIA driver...", "Failed to initialize NVML: ...") instead of any CSV:
  the result carries it as ``host_error`` and no rows;
* "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost..." lines among the
  CSV rows, one per GPU that fell off the bus: each becomes a :class:`LostDevice`.

Anything else that does not fit raises :class:`~airflow_hetero_gpu.errors.CaptureError` naming
the file and line.
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from airflow_hetero_gpu.capture.busid import normalize_bus_id
from airflow_hetero_gpu.errors import CaptureError

__all__ = ["EXTRA_HEALTH_FIELDS", "FABRIC_FIELDS", "MIG_FIELDS", "OPTIONAL_FIELDS", "REQUIRED_FIELDS",
           "LostDevice", "QueryResult", "QueryRow", "field_group", "parse_query_csv"]

REQUIRED_FIELDS = ("index", "name", "memory.total")

# Alternative spellings nvidia-smi accepts on the command line; the header normally echoes the
# canonical name, but hand-written captures may use either.
FIELD_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id",
                 # drivers before the 535 series only know the "throttle" spelling
                 "clocks_throttle_reasons.hw_slowdown": "clocks_event_reasons.hw_slowdown"}

#: Health fields beyond SPEC §2 that the collector asks for when the driver knows them
#: (row remapping: A100 and later; the slowdown flag: every driver, under two names).
EXTRA_HEALTH_FIELDS = ("remapped_rows.pending", "remapped_rows.failure", "clocks_event_reasons.hw_slowdown")
#: MIG mode now and after the next GPU reset ("Enabled", "Disabled"; [N/A] on GPUs without MIG).
MIG_FIELDS = ("mig.mode.current", "mig.mode.pending")
#: The GPU's NVLink fabric registration (multi-node NVLink domains, GB200/GB300 NVL72) and the
#: compute tray it sits in; bare ``N/A`` on GPUs without an NVLink fabric.
FABRIC_FIELDS = ("fabric.state", "fabric.status", "fabric.cliqueId", "fabric.clusterUuid",
                 "fabric.health.summary", "fabric.health.bandwidth", "platform.tray_index")
#: Every field beyond SPEC §2 the collector asks for where the driver knows it.
OPTIONAL_FIELDS = EXTRA_HEALTH_FIELDS + MIG_FIELDS + FABRIC_FIELDS
#: Fields that drivers learnt together: a driver that refuses one refuses the others, so the
#: collector leaves out the whole group at once (one query less per field on an older driver).
FIELD_GROUPS: tuple[tuple[str, ...], ...] = (
    MIG_FIELDS, FABRIC_FIELDS[:4], FABRIC_FIELDS[4:6], FABRIC_FIELDS[6:],
)


def field_group(name: str) -> tuple[str, ...]:
    """The optional fields that go with ``name`` (just ``name`` for the health fields)."""
    return next((g for g in FIELD_GROUPS if name in g), (name,))

PROBLEM_VALUES = {"[unknown error]": "unknown-error", "[gpu requires reset]": "requires-reset"}

_HEADER_CELL = re.compile(r"(?P<field>[A-Za-z_][A-Za-z0-9_.]*)(?:\s*\[(?P<unit>[^\]]*)\])?")
_NUMBER = re.compile(r"(?P<number>\d+(?:\.\d+)?)(?:\s*(?P<unit>[A-Za-z%]+))?")
_LOST = re.compile(
    r"Unable to determine the device handle for (?:GPU)?\s*(?P<bus>[0-9A-Fa-f:.]+):\s*(?P<message>.*)",
    re.IGNORECASE,
)
_HOST_ERROR = re.compile(
    r"No devices were found\b.*"
    r"|NVIDIA-SMI has failed\b.*"
    r"|Failed to initialize NVML\b.*"
    r"|NVIDIA-SMI couldn't find libnvidia-ml\.so\b.*",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class QueryRow:
    """One GPU as ``--query-gpu`` reported it; ``None`` where the field is absent or N/A."""

    index: int
    uuid: str | None
    name: str
    pci_bus_id: str | None
    memory_total_mib: float | None
    memory_used_mib: float | None
    utilization_pct: float | None
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    ecc_uncorrected: int | None
    retired_pages_pending: bool | None
    problems: frozenset[str]
    line: int
    # Optional fields (OPTIONAL_FIELDS); None when not collected or N/A.
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    hw_slowdown: bool | None = None
    mig_mode_current: str | None = None   # "Enabled" / "Disabled"
    mig_mode_pending: str | None = None
    fabric_state: str | None = None       # "Not Started", "In Progress", "Completed"
    fabric_status: str | None = None      # "Success" or an error (valid when Completed)
    fabric_clique_id: int | None = None
    fabric_cluster_uuid: str | None = None
    fabric_health_summary: str | None = None  # "Healthy", "Unhealthy", "Limited Capacity"
    fabric_health_bandwidth: str | None = None  # "Full", "Degraded"
    tray_index: int | None = None


@dataclass(frozen=True)
class LostDevice:
    """A GPU nvidia-smi could not open ("Unable to determine the device handle for GPU ...")."""

    pci_bus_id: str
    message: str
    line: int


@dataclass(frozen=True)
class QueryResult:
    """Everything one ``query.csv`` says: GPU rows, lost GPUs, or a whole-host failure."""

    rows: list[QueryRow]
    lost: list[LostDevice]
    host_error: str | None = None


def _quote(text: str, limit: int = 60) -> str:
    """``text`` in quotes, shortened to ``limit`` characters, for one-line error messages."""
    text = text.strip()
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


# --- value converters: raw cell text (units allowed) -> Python value ------------------------


def _number(unit: str | None) -> Callable[[str], float]:
    """Converter for a non-negative number that may carry ``unit`` (``81920 MiB``)."""

    def convert(raw: str) -> float:
        match = _NUMBER.fullmatch(raw)
        if match is None:
            raise ValueError(f"not a number: {_quote(raw)}")
        if match["unit"] is not None and match["unit"] != unit:
            raise ValueError(f"unexpected unit {match['unit']!r} in {_quote(raw)} (expected {unit or 'none'})")
        return float(match["number"])

    return convert


def _percent(raw: str) -> float:
    """A percentage, 0 to 100 (``35 %``): nvidia-smi never reports more."""
    value = _PERCENT_NUMBER(raw)
    if value > 100:
        raise ValueError(f"{_quote(raw)} is above 100 %")
    return value


_PERCENT_NUMBER = _number("%")


def _integer(raw: str) -> int:
    if not raw.isascii() or not raw.isdigit():
        raise ValueError(f"not a non-negative integer: {_quote(raw)}")
    return int(raw)


def _yes_no(raw: str) -> bool:
    answer = {"yes": True, "no": False}.get(raw.lower())
    if answer is None:
        raise ValueError(f"expected Yes or No, got {_quote(raw)}")
    return answer


def _active(raw: str) -> bool:
    answer = {"active": True, "not active": False}.get(" ".join(raw.lower().split()))
    if answer is None:
        raise ValueError(f"expected Active or Not Active, got {_quote(raw)}")
    return answer


def _text(raw: str) -> str:
    return raw


@dataclass(frozen=True)
class _Field:
    attr: str
    convert: Callable[[str], object]
    unit: str | None = None  # the unit nvidia-smi prints in the header and after values


_FIELDS: dict[str, _Field] = {
    "index": _Field("index", _integer),
    "uuid": _Field("uuid", _text),
    "name": _Field("name", _text),
    "pci.bus_id": _Field("pci_bus_id", normalize_bus_id),
    "memory.total": _Field("memory_total_mib", _number("MiB"), "MiB"),
    "memory.used": _Field("memory_used_mib", _number("MiB"), "MiB"),
    "utilization.gpu": _Field("utilization_pct", _percent, "%"),
    "temperature.gpu": _Field("temperature_c", _number("C"), "C"),
    "power.draw": _Field("power_w", _number("W"), "W"),
    "power.limit": _Field("power_limit_w", _number("W"), "W"),
    "ecc.errors.uncorrected.volatile.total": _Field("ecc_uncorrected", _integer),
    "retired_pages.pending": _Field("retired_pages_pending", _yes_no),
    "remapped_rows.pending": _Field("remapped_rows_pending", _yes_no),
    "remapped_rows.failure": _Field("remapped_rows_failure", _yes_no),
    "clocks_event_reasons.hw_slowdown": _Field("hw_slowdown", _active),
    "mig.mode.current": _Field("mig_mode_current", _text),
    "mig.mode.pending": _Field("mig_mode_pending", _text),
    "fabric.state": _Field("fabric_state", _text),
    "fabric.status": _Field("fabric_status", _text),
    "fabric.cliqueId": _Field("fabric_clique_id", _integer),
    "fabric.clusterUuid": _Field("fabric_cluster_uuid", _text),
    "fabric.health.summary": _Field("fabric_health_summary", _text),
    "fabric.health.bandwidth": _Field("fabric_health_bandwidth", _text),
    "platform.tray_index": _Field("tray_index", _integer),
}


# --- the file, line by line ------------------------------------------------------------------


def _numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    """Non-blank lines with their 1-based numbers, stripped (BOM and CR included)."""
    for number, line in enumerate(text.lstrip("\ufeff").splitlines(), start=1):
        line = line.strip()
        if line:
            yield number, line


def _lost_device(line: str, number: int, path: str) -> LostDevice | None:
    match = _LOST.fullmatch(line)
    if match is None:
        return None
    try:
        bus_id = normalize_bus_id(match["bus"])
    except ValueError as exc:
        raise CaptureError(path, str(exc), number) from None
    return LostDevice(bus_id, match["message"].strip() or line, number)


#: Header lines read before, and their columns: a fleet's hosts print the same few headers.
_HEADERS: dict[str, dict[str, int]] = {}


def _read_header(line: str, number: int, path: str) -> dict[str, int]:
    """Map each known field to its column; check the header is one and names the required ones.

    The mapping returned is shared between the files with the same header: read it, never change it."""
    known = _HEADERS.get(line)
    if known is not None:
        return known
    cells = [cell.strip() for cell in line.split(",")]
    matches = [_HEADER_CELL.fullmatch(cell) for cell in cells]
    if not all(matches):
        raise CaptureError(
            path,
            f"no header line: the first line {_quote(line)} holds values, not field names; "
            "collect with --format=csv (with header), not noheader",
            number,
        )
    columns: dict[str, int] = {}
    for column, match in enumerate(matches):
        assert match is not None
        field = FIELD_ALIASES.get(match["field"], match["field"])
        spec = _FIELDS.get(field)
        if spec is None or field in columns:
            continue  # extra field, or a repeat of one already mapped
        unit = match["unit"]
        if unit is not None and unit != spec.unit:
            raise CaptureError(path, f"field {field} is in [{unit}], expected [{spec.unit or 'no unit'}]", number)
        columns[field] = column
    missing = [field for field in REQUIRED_FIELDS if field not in columns]
    if missing:
        raise CaptureError(
            path,
            f"header lacks required field(s) {', '.join(missing)}; "
            "collect with --query-gpu=index,name,memory.total,... --format=csv",
            number,
        )
    if len(_HEADERS) >= 64:
        _HEADERS.clear()
    _HEADERS[line] = columns
    return columns


#: Every field's attribute, None: a row's starting point.
_NO_VALUES: dict[str, object] = {spec.attr: None for spec in _FIELDS.values()}
#: What a cell holds when nvidia-smi printed no value there ([N/A], [Not Supported], N/A, ...).
_NO_VALUE = object()


class _EmptyCell(ValueError):
    pass


@functools.lru_cache(maxsize=16384)
def _cell(field: str, raw: str) -> object:
    """The value of one cell of ``field``, or ``_NO_VALUE``: a pure function of the two, so the
    values that repeat across GPUs and hosts (a model name, a power limit, ``N/A``) are read once.
    Raises _EmptyCell, or ValueError naming what is wrong."""
    if (raw.startswith("[") and raw.endswith("]")) or raw.upper() == "N/A":
        return _NO_VALUE
    if not raw:
        raise _EmptyCell(field)
    return _FIELDS[field].convert(raw)


def _read_row(cells: list[str], columns: dict[str, int], number: int, path: str, line: str) -> QueryRow:
    """Convert one CSV row (``line``, split into ``cells`` of the header's length)."""
    lowered = line.lower()
    problems = frozenset(PROBLEM_VALUES[c.lower()] for c in cells if c.lower() in PROBLEM_VALUES) \
        if any(value in lowered for value in PROBLEM_VALUES) else frozenset()
    values = dict(_NO_VALUES)
    for field, column in columns.items():
        raw = cells[column]
        try:
            value = _cell(field, raw)
        except _EmptyCell:
            raise CaptureError(path, f"field {field} is empty", number) from None
        except ValueError as exc:
            raise CaptureError(path, f"field {field}: {exc}", number) from None
        if value is not _NO_VALUE:
            values[_FIELDS[field].attr] = value
        elif field == "name" and raw.lower() in PROBLEM_VALUES:
            values["name"] = raw  # as nvidia-smi printed it; the problem flag marks the GPU
        elif field == "memory.total" and raw.lower() in PROBLEM_VALUES:
            pass  # unknown size of a GPU that is flagged lost anyway
        elif field in REQUIRED_FIELDS:
            raise CaptureError(path, f"required field {field} has no value ({raw})", number)
    return QueryRow(problems=problems, line=number, **values)  # type: ignore[arg-type]


def parse_query_csv(text: str, path: str) -> QueryResult:
    """Read the stdout of ``nvidia-smi --query-gpu=... --format=csv`` (header required).

    ``path`` only names the file in error messages. Raises :class:`CaptureError` on anything
    that is not such output; see the module docstring for what is accepted.
    """
    lines = list(_numbered_lines(text))
    if not lines:
        raise CaptureError(path, "empty: no nvidia-smi output")
    lost: list[LostDevice] = []
    csv_lines: list[tuple[int, str]] = []
    for number, line in lines:
        device = _lost_device(line, number, path)
        if device is not None:
            lost.append(device)
        else:
            csv_lines.append((number, line))
    if not csv_lines:
        return QueryResult([], lost)

    first_number, first = csv_lines[0]
    if _HOST_ERROR.fullmatch(first):
        message = "; ".join(line for _, line in csv_lines)
        return QueryResult([], lost, host_error=" ".join(message.split()))
    columns = _read_header(first, first_number, path)

    rows: list[QueryRow] = []
    seen: dict[int, int] = {}
    width = len(first.split(","))
    reader = csv.reader((line for _, line in csv_lines[1:]), skipinitialspace=True, quoting=csv.QUOTE_NONE)
    for (number, line), cells in zip(csv_lines[1:], reader, strict=True):
        if _HOST_ERROR.fullmatch(line):
            raise CaptureError(path, f"nvidia-smi failed in the middle of its output: {_quote(line)}", number)
        if len(cells) != width:
            raise CaptureError(path, f"row has {len(cells)} cell(s), the header has {width}: {_quote(line)}", number)
        row = _read_row([cell.strip() for cell in cells], columns, number, path, line)
        if row.index in seen:
            raise CaptureError(path, f"GPU index {row.index} appears twice (first on line {seen[row.index]})", number)
        seen[row.index] = number
        rows.append(row)
    if not rows and not lost:
        raise CaptureError(path, "header but no GPU rows", first_number)
    return QueryResult(rows, lost)
