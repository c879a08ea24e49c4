"""Render an emulated host's state the way the real ``nvidia-smi`` (and the kernel log) print it.

Pure functions from the host state (a JSON-able dict, see :mod:`.state`) to text. The fake
``nvidia-smi`` script calls them, and tests call them directly to compare with real samples.
Only the standard library is used: this module runs inside every emulated SSH session.

What "as the real one prints" means here, with the evidence in ``docs/emulated-cluster.md``:

* ``--query-gpu``: header fields joined by ``", "``, aliases echoed under their canonical name
  (``gpu_name`` -> ``name``), units in the header (``memory.total [MiB]``) and, unless
  ``nounits``, after each value (``81920 MiB``, ``35 %``, ``250.00 W``); ``[N/A]`` carries no unit.
* ``topo -m``: tab-separated, a leading tab on the header, `` X `` on the diagonal, affinity
  columns, the quirky empty cell before ``GPU NUMA ID``, then the Legend (and NIC Legend).
* ``-L``: ``GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-...)``.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

#: Topology samples shipped with the package (``"topology": {"sample": NAME}``).
TOPO_SAMPLE_DIR = Path(__file__).resolve().parent / "data" / "topo"

NA = "[N/A]"

DRIVER_NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
NO_DEVICES = "No devices were found"
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."

#: Documented nvidia-smi return codes (man page, "RETURN VALUE").
RC_OK = 0
RC_INVALID_ARGUMENT = 2
RC_NOT_FOUND = 6
RC_DRIVER_NOT_LOADED = 9
RC_GPU_IS_LOST = 15
RC_OTHER = 255

LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""

ANSI_UNDERLINE = "\x1b[4m"
ANSI_RESET = "\x1b[0m"

LINK_LABEL = re.compile(r"^(X|SYS|SOC|NODE|PHB|PXB|PIX|NV\d+)$")


class QueryError(Exception):
    """A ``--query-gpu`` request the real tool refuses; ``str()`` is its stdout text."""

    def __init__(self, message: str, returncode: int = RC_INVALID_ARGUMENT):
        super().__init__(message)
        self.returncode = returncode


# --------------------------------------------------------------------------------------------
# --query-gpu fields
# --------------------------------------------------------------------------------------------


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


def _bus_id(gpu: Mapping[str, Any]) -> str:
    return str(gpu.get("pci_bus_id") or "00000000:00:00.0")


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
    "utilization.gpu": Field("%", _g("utilization_gpu")),
    "utilization.memory": Field("%", _g("utilization_memory")),
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
    "mig.mode.current": Field(None, lambda h, g: str(g.get("mig_mode", NA))),
    "mig.mode.pending": Field(None, lambda h, g: str(g.get("mig_mode", NA))),
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
KNOWN_FIELDS_FILE = Path(__file__).resolve().parent / "data" / "query_gpu_fields.tsv"


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
    return "".join(line + "\n" for line in lines), rc


# --------------------------------------------------------------------------------------------
# topo -m
# --------------------------------------------------------------------------------------------


def sample_names() -> list[str]:
    """Names of the shipped real ``topo -m`` samples."""
    return sorted(p.stem for p in TOPO_SAMPLE_DIR.glob("*.txt"))


def read_sample(name: str) -> str:
    path = TOPO_SAMPLE_DIR / f"{name}.txt"
    if not path.is_file():
        raise ValueError(f"unknown topo sample {name!r}; shipped: {', '.join(sample_names())}")
    return path.read_text(encoding="utf-8")


def validate_matrix(matrix: Sequence[Sequence[str]], what: str = "matrix") -> None:
    """A square matrix of link labels with ``X`` on the diagonal, symmetric."""
    n = len(matrix)
    for i, row in enumerate(matrix):
        if len(row) != n:
            raise ValueError(f"{what}: row {i} has {len(row)} cells, expected {n}")
        for j, cell in enumerate(row):
            cell = str(cell).strip()
            if (i == j) != (cell == "X"):
                raise ValueError(f"{what}: cell ({i},{j}) is {cell!r}; X belongs on the diagonal only")
            if not LINK_LABEL.match(cell):
                raise ValueError(f"{what}: cell ({i},{j}) {cell!r} is not a link label")
            if str(matrix[j][i]).strip() != cell:
                raise ValueError(f"{what}: not symmetric at ({i},{j})")


def render_topo(topology: Mapping[str, Any]) -> str:
    """``nvidia-smi topo -m`` for a generated topology, in the layout of recent drivers.

    ``topology`` keys: ``matrix`` (GPU x GPU labels), ``cpu_affinity`` and ``numa_affinity``
    (one string per GPU), optional ``gpu_numa_id`` (default ``N/A``), ``nics`` (list of
    ``{"name": "mlx5_0", "links": [labels to every GPU then every NIC]}``), ``gpu_numa_id_column``
    (default True) and ``ansi_header`` (default False; drivers >= 590 underline the header).
    """
    matrix = [[str(c).strip() for c in row] for row in topology["matrix"]]
    validate_matrix(matrix)
    n = len(matrix)
    nics = list(topology.get("nics") or [])
    cpu = list(topology.get("cpu_affinity") or ["N/A"] * n)
    numa = list(topology.get("numa_affinity") or ["N/A"] * n)
    gpu_numa = list(topology.get("gpu_numa_id") or ["N/A"] * n)
    with_gpu_numa = bool(topology.get("gpu_numa_id_column", True))
    columns = [f"GPU{i}" for i in range(n)] + [f"NIC{k}" for k in range(len(nics))]
    columns += ["CPU Affinity", "NUMA Affinity"] + (["GPU NUMA ID"] if with_gpu_numa else [])
    head = "\t".join(columns)
    if topology.get("ansi_header"):
        head = ANSI_UNDERLINE + head + ANSI_RESET
    lines = ["\t" + head]

    def cell(label: str) -> str:
        return " X " if label == "X" else label

    for i in range(n):
        links = [cell(matrix[i][j]) for j in range(n)]
        links += [cell(str(nic["links"][i]).strip()) for nic in nics]
        tail = [cpu[i], numa[i]] + (["", gpu_numa[i]] if with_gpu_numa else [])
        lines.append("\t".join([f"GPU{i}"] + links + tail))
    for k, nic in enumerate(nics):
        links = [cell(str(v).strip()) for v in nic["links"]]
        if len(links) != n + len(nics):
            raise ValueError(f"NIC{k}: expected {n + len(nics)} links, got {len(links)}")
        pad = "\t" * (4 if with_gpu_numa else 2)
        lines.append("\t".join([f"NIC{k}"] + links) + pad)
    text = "\n".join(lines) + "\n\n" + LEGEND
    if nics:
        text += "\nNIC Legend:\n\n"
        text += "".join(f"  NIC{k}: {nic['name']}\n" for k, nic in enumerate(nics)) + "\n"
    return text


def topo_text(host: Mapping[str, Any]) -> str:
    """``topo -m`` text for a host: the stored real sample, or the generated matrix."""
    topology = host.get("topology") or {}
    if "sample" in topology:
        return read_sample(str(topology["sample"]))
    return render_topo(topology)


# --------------------------------------------------------------------------------------------
# Kernel log (dmesg / journalctl -k)
# --------------------------------------------------------------------------------------------

#: Text after "pid=..., name=...," for the Xids the emulation knows by heart.
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x0_00000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008",
    45: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
        "partition 6, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to mark a row for remapping.",
    74: "NVLink: fatal error detected on link 0(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL).",
}


def xid_bus(gpu: Mapping[str, Any]) -> str:
    """``00000000:3B:00.0`` -> ``0000:3b:00`` as the kernel log prints it."""
    domain, bus, devfn = _bus_id(gpu).split(":")
    return f"{domain[-4:]}:{bus}:{devfn.split('.')[0]}".lower()


def xid_message(host: Mapping[str, Any], entry: Mapping[str, Any] | str) -> tuple[float, str]:
    """(uptime seconds, message without timestamp) of one kernel-log entry of the state."""
    if isinstance(entry, str):
        match = re.match(r"^\[\s*(\d+\.\d+)\]\s?(.*)$", entry)
        if match:
            return float(match.group(1)), match.group(2)
        return 0.0, entry
    bus = entry.get("bus")
    if not bus and entry.get("gpu") is not None:
        for gpu in host.get("gpus", []):
            if gpu.get("index") == entry["gpu"]:
                bus = xid_bus(gpu)
    code = int(entry["xid"])
    pid = entry.get("pid")
    name = entry.get("name")
    pid_text = f"pid={pid}" if pid is not None else "pid='<unknown>'"
    name_text = f"name={name}" if name else "name=<unknown>"
    text = entry.get("text") or XID_TEXT.get(code, "")
    message = f"NVRM: Xid (PCI:{bus or '0000:00:00'}): {code}, {pid_text}, {name_text}, {text}".rstrip(", ")
    return float(entry.get("time", 0.0)), message


def kernel_messages(host: Mapping[str, Any]) -> list[tuple[float, str]]:
    """All kernel-log messages of a host (boot noise plus its Xid entries), oldest first."""
    messages = [
        (0.0, "Linux version 6.1.0-emulated (hetero-gpu emulated cluster)"),
        (4.210347, "nvidia: loading out-of-tree module taints kernel."),
        (4.523611, f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {host.get('driver_version', '')}"),
    ]
    messages += [xid_message(host, e) for e in host.get("xid", [])]
    return sorted(messages, key=lambda m: m[0])


def dmesg_text(host: Mapping[str, Any]) -> str:
    """``dmesg`` output: ``[ 1234.567890] message`` lines."""
    out = []
    for seconds, message in kernel_messages(host):
        whole = int(seconds)
        micros = int(round((seconds - whole) * 1_000_000))
        out.append(f"[{whole:5d}.{micros:06d}] {message}\n")
    return "".join(out)


def journal_text(host: Mapping[str, Any], pattern: str | None = None) -> str:
    """``journalctl -k -q`` output (short format), optionally filtered by a ``-g`` regex."""
    boot = _dt.datetime.fromtimestamp(float(host.get("boot_time", 1_735_689_600)))
    hostname = str(host.get("hostname", "localhost"))
    regex = re.compile(pattern) if pattern else None
    out = []
    for seconds, message in kernel_messages(host):
        if regex and not regex.search(message):
            continue
        when = boot + _dt.timedelta(seconds=seconds)
        out.append(f"{when.strftime('%b %d %H:%M:%S')} {hostname} kernel: {message}\n")
    return "".join(out)


def iter_field_names() -> Iterable[str]:
    """Every field name the emulation accepts (canonical names and aliases)."""
    yield from FIELDS
    yield from ALIASES
