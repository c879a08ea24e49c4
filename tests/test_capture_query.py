"""Tests of the ``--query-gpu`` CSV reader and of PCI bus-id normalisation."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_hetero_gpu.capture.busid import normalize_bus_id
from airflow_hetero_gpu.capture.query import LostDevice, QueryResult, parse_query_csv
from airflow_hetero_gpu.errors import CaptureError

from shared_data import shared_data

LOCAL = Path(__file__).resolve().parent / "data" / "nvidia-smi"


SHARED_QUERY = shared_data() / "nvidia-smi" / "query"
_NO_SHARED = pytest.mark.skip(reason=f"real nvidia-smi samples not present at {SHARED_QUERY}")


def _shared_files() -> list:
    if not SHARED_QUERY.is_dir():
        return [pytest.param("absent", marks=_NO_SHARED)]
    csvs = [p.name for p in SHARED_QUERY.glob("*.csv")]
    errors = [f"errors/{p.name}" for p in (SHARED_QUERY / "errors").iterdir() if p.is_file()]
    return sorted(csvs) + sorted(errors)


def _read(folder: Path, name: str) -> tuple[str, str]:
    if not folder.is_dir():
        pytest.skip(f"real nvidia-smi samples not present at {folder}")
    path = folder / name
    return path.read_text(encoding="utf-8"), str(path)


# --- real outputs ----------------------------------------------------------------------------

A800 = "NVIDIA A800-SXM4-80GB"
ZERO_UUID = "GPU-00000000-0000-0000-0000-000000000000"

# name -> expected fields of row 0 (attribute: value), and the row count
ROW_CASES = [
    ("query-gpu-8x-a800-index-name-memtotal-memfree-driver-cc.csv", 8,
     dict(index=0, uuid=None, name=A800, pci_bus_id=None, memory_total_mib=81920.0, memory_used_mib=None,
          utilization_pct=None, temperature_c=None, power_w=None, ecc_uncorrected=None, problems=frozenset(), line=2)),
    ("query-gpu-allfields-h100-80gb-hbm3-load.csv", 1,
     dict(index=0, uuid=ZERO_UUID, name="NVIDIA H100 80GB HBM3", pci_bus_id="0000:00:09", memory_total_mib=81559.0,
          memory_used_mib=19818.0, utilization_pct=100.0, temperature_c=59.0, power_w=631.95, power_limit_w=700.0,
          ecc_uncorrected=0, retired_pages_pending=None, problems=frozenset(), line=2)),
]

SHARED_ROW_CASES = ROW_CASES + [
    ("query-gpu-allfields-h100-80gb-hbm3-idle.csv", 1,
     dict(name="NVIDIA H100 80GB HBM3", memory_used_mib=0.0, utilization_pct=0.0, temperature_c=41.0, power_w=69.85,
          power_limit_w=700.0, ecc_uncorrected=0, retired_pages_pending=None)),
    ("query-gpu-allfields-h100-mig-enabled-idle.csv", 1,  # MIG mode: utilization [N/A]
     dict(memory_used_mib=59.0, utilization_pct=None, temperature_c=42.0, power_w=71.15, ecc_uncorrected=0)),
    ("query-gpu-allfields-l40s-load.csv", 1,
     dict(name="NVIDIA L40S", pci_bus_id="0000:01:00", memory_total_mib=46068.0, memory_used_mib=1235.0,
          utilization_pct=9.0, temperature_c=54.0, power_w=110.23, power_limit_w=350.0, ecc_uncorrected=0)),
    ("query-gpu-allfields-rtx2080super-driver610-idle.csv", 1,  # consumer card: no ECC
     dict(name="NVIDIA GeForce RTX 2080 SUPER", pci_bus_id="0000:0c:00", memory_total_mib=8192.0,
          memory_used_mib=211.0, temperature_c=33.0, power_w=39.17, power_limit_w=250.0, ecc_uncorrected=None)),
    ("query-gpu-allfields-rtx2080super-windows-wddm-idle.csv", 1,
     dict(memory_used_mib=797.0, utilization_pct=0.0, temperature_c=40.0, power_w=39.25, ecc_uncorrected=None)),
    ("query-gpu-allfields-rtx4080super-load.csv", 1,
     dict(name="NVIDIA GeForce RTX 4080 SUPER", memory_total_mib=16376.0, memory_used_mib=1474.0,
          utilization_pct=7.0, temperature_c=46.0, power_w=84.24, power_limit_w=320.0)),
]

# name -> (host_error, lost devices as (bus id, message)) for the whole-host error outputs
SHARED_ERROR_CASES = [
    ("errors/no-devices-were-found.txt", "No devices were found", []),
    ("errors/failed-to-communicate-with-driver.txt",
     "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
     "NVIDIA driver is installed and running.", []),
    ("errors/nvml-driver-library-version-mismatch-old.txt", "Failed to initialize NVML: Driver/library version mismatch", []),
    ("errors/nvml-driver-library-version-mismatch-with-nvml-version.txt",
     "Failed to initialize NVML: Driver/library version mismatch; NVML library version: 550.144", []),
    ("errors/gpu-is-lost.txt", None, [("0000:02:00", "GPU is lost. Reboot the system to recover this GPU")]),
    ("errors/unable-to-determine-device-handle-unknown-error-2015.txt", None, [("0000:0b:00", "Unknown Error")]),
    ("errors/unable-to-determine-device-handle-unknown-error-nospace-2024.txt", None, [("0000:07:00", "Unknown Error")]),
]

# shared files that must be rejected, and why (everything else must parse)
SHARED_REJECTED = {
    "query-compute-apps-h100-load.csv": "lacks required field(s) index, memory.total",
    "query-gpu-clocks-loop-mixed-a5000-3090-head.csv": "lacks required field(s) index, name, memory.total",
    "query-gpu-name-busid-vbios-h100-elided.csv": "lacks required field(s) index, memory.total",
    "query-gpu-tesla-p100-pcie-netdata.csv": "lacks required field(s) index, memory.total",
    "query-retired-pages-h100-na.csv": "lacks required field(s) index, memory.total",
    "query-gpu-fan-speed-not-supported-16gpu-server.csv": "no header line",
    "query-gpu-gtx770-not-supported-noheader.csv": "no header line",
    "query-gpu-index-memused-noheader-7gpu.csv": "no header line",
    "query-gpu-many-fields-noheader-nounits-rtx2080.csv": "no header line",
    "query-gpu-noheader-nounits-fan-na-new-driver.csv": "no header line",
    "query-gpu-noheader-nounits-fan-not-supported-old-driver.csv": "no header line",
    "query-gpu-power-draw-noheader-nounits-3gpu.csv": "no header line",
    "query-gpu-power-limit-noheader-nounits-3gpu.csv": "no header line",
    "query-gpu-power-max-limit-noheader-nounits-3gpu.csv": "no header line",
    "errors/table-power-err-v100-azure.txt": "no header line",
}


def _check_rows(result: QueryResult, count: int, expected: dict) -> None:
    assert result.host_error is None and result.lost == []
    assert len(result.rows) == count
    assert [row.index for row in result.rows] == list(range(count))
    row = result.rows[0]
    assert {attr: getattr(row, attr) for attr in expected} == expected


@pytest.mark.parametrize("name, count, expected", ROW_CASES)
def test_local_copies_of_real_outputs(name, count, expected):
    text, path = _read(LOCAL, name)
    _check_rows(parse_query_csv(text, path), count, expected)


def test_a800_every_row():
    text, path = _read(LOCAL, "query-gpu-8x-a800-index-name-memtotal-memfree-driver-cc.csv")
    rows = parse_query_csv(text, path).rows
    assert [(r.index, r.name, r.memory_total_mib, r.line) for r in rows] == [
        (i, A800, 81920.0, i + 2) for i in range(8)
    ]


@pytest.mark.parametrize("name, count, expected", SHARED_ROW_CASES)
def test_shared_real_outputs(name, count, expected):
    text, path = _read(SHARED_QUERY, name)
    _check_rows(parse_query_csv(text, path), count, expected)


@pytest.mark.parametrize("name, host_error, lost", SHARED_ERROR_CASES)
def test_shared_host_and_device_errors(name, host_error, lost):
    text, path = _read(SHARED_QUERY, name)
    result = parse_query_csv(text, path)
    assert result.rows == []
    assert result.host_error == host_error
    assert [(d.pci_bus_id, d.message, d.line) for d in result.lost] == [(b, m, 1) for b, m in lost]


@pytest.mark.parametrize("name", _shared_files())
def test_every_shared_sample_parses_or_fails_cleanly(name):
    text, path = _read(SHARED_QUERY, name)
    try:
        result = parse_query_csv(text, path)
    except CaptureError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"{path}:")
        assert name in SHARED_REJECTED, message
        assert SHARED_REJECTED[name] in message
    else:
        assert name not in SHARED_REJECTED
        assert result.rows or result.lost or result.host_error


# --- hand-made outputs -----------------------------------------------------------------------

SPEC_HEADER = (
    "index, uuid, name, pci.bus_id, memory.total [MiB], memory.used [MiB], utilization.gpu [%], temperature.gpu, "
    "power.draw [W], power.limit [W], ecc.errors.uncorrected.volatile.total, retired_pages.pending\n"
)
SPEC_ROW = "0, GPU-a1, NVIDIA A100-SXM4-80GB, 00000000:07:00.0, 81920 MiB, 1024 MiB, 35 %, 41, 250.00 W, 400.00 W, 0, No\n"
FULL = dict(index=0, uuid="GPU-a1", name="NVIDIA A100-SXM4-80GB", pci_bus_id="0000:07:00", memory_total_mib=81920.0,
            memory_used_mib=1024.0, utilization_pct=35.0, temperature_c=41.0, power_w=250.0, power_limit_w=400.0,
            ecc_uncorrected=0, retired_pages_pending=False, problems=frozenset(), line=2)

# text, expected attributes of the first row
GOOD_CASES = [
    pytest.param(SPEC_HEADER + SPEC_ROW, FULL, id="spec-fields-with-units"),
    pytest.param(SPEC_HEADER + "0, GPU-a1, NVIDIA A100-SXM4-80GB, 00000000:07:00.0, 81920, 1024, 35, 41, 250.00, 400.00, 0, No\n",
                 FULL, id="spec-fields-nounits"),
    pytest.param("memory.total [MiB], name, index\n24564 MiB, NVIDIA GeForce RTX 4090, 3\n",
                 dict(index=3, name="NVIDIA GeForce RTX 4090", memory_total_mib=24564.0, uuid=None), id="any-order"),
    pytest.param("gpu_name, gpu_uuid, gpu_bus_id, index, memory.total [MiB]\nTesla T4, GPU-t4, 00000000:3B:00.0, 0, 15360 MiB\n",
                 dict(name="Tesla T4", uuid="GPU-t4", pci_bus_id="0000:3b:00"), id="aliases"),
    pytest.param("index, name, fan.speed [%], memory.total [MiB], pstate, clocks.sm [MHz]\n0, Tesla T4, [N/A], 15360 MiB, P8, 300 MHz\n",
                 dict(memory_total_mib=15360.0, problems=frozenset()), id="extra-fields-ignored"),
    pytest.param("index, name, memory.total [MiB], memory.used [MiB], utilization.gpu [%], power.draw [W], "
                 "ecc.errors.uncorrected.volatile.total, retired_pages.pending, temperature.gpu\n"
                 "0, Tesla T4, 15360 MiB, [N/A], [Not Supported], [Requested functionality has been deprecated], N/A, [N/A], [N/A]\n",
                 dict(memory_used_mib=None, utilization_pct=None, power_w=None, ecc_uncorrected=None,
                      retired_pages_pending=None, temperature_c=None, problems=frozenset()), id="no-value-markers"),
    pytest.param("index, name, memory.total [MiB], utilization.gpu [%]\n0, Tesla T4, 15360 MiB, [Unknown Error]\n",
                 dict(utilization_pct=None, problems=frozenset({"unknown-error"})), id="unknown-error"),
    pytest.param("index, name, memory.total [MiB], memory.used [MiB]\n0, Tesla T4, 15360 MiB, [GPU requires reset]\n",
                 dict(memory_used_mib=None, problems=frozenset({"requires-reset"})), id="requires-reset"),
    pytest.param("index, name, memory.total [MiB], fan.speed [%]\n0, [Unknown Error], [GPU requires reset], [Unknown Error]\n",
                 dict(name="[Unknown Error]", memory_total_mib=None, problems=frozenset({"unknown-error", "requires-reset"})),
                 id="problems-in-required-fields"),
    pytest.param("index, name, memory.total [MiB], ecc.errors.uncorrected.volatile.total, retired_pages.pending\n"
                 "0, Tesla V100-SXM2-16GB, 16160 MiB, 2, Yes\n",
                 dict(ecc_uncorrected=2, retired_pages_pending=True), id="ecc-and-pending-pages"),
    pytest.param("\ufeffindex, name, memory.total [MiB]\r\n0, Tesla T4, 15360 MiB\r\n\r\n",
                 dict(index=0, memory_total_mib=15360.0, line=2), id="bom-crlf-trailing-blank"),
    pytest.param("index, name, memory.total [MiB], temperature.gpu\n0, NVIDIA L4, 23034 MiB, 45 C\n",
                 dict(temperature_c=45.0), id="temperature-with-unit"),
]


@pytest.mark.parametrize("text, expected", GOOD_CASES)
def test_accepted_layouts(text, expected):
    result = parse_query_csv(text, "query.csv")
    assert result.host_error is None
    row = result.rows[0]
    assert {attr: getattr(row, attr) for attr in expected} == expected


def test_lost_gpu_lines_among_rows():
    text = (
        "index, name, pci.bus_id, memory.total [MiB]\n"
        "0, NVIDIA A100-SXM4-80GB, 00000000:07:00.0, 81920 MiB\n"
        "Unable to determine the device handle for GPU 0000:0B:00.0: GPU is lost. Reboot the system to recover this GPU\n"
        "2, NVIDIA A100-SXM4-80GB, 00000000:0F:00.0, 81920 MiB\n"
        "Unable to determine the device handle for GPU0000:8A:00.0: Unknown Error\n"
    )
    result = parse_query_csv(text, "query.csv")
    assert [(r.index, r.pci_bus_id, r.line) for r in result.rows] == [(0, "0000:07:00", 2), (2, "0000:0f:00", 4)]
    assert result.lost == [
        LostDevice("0000:0b:00", "GPU is lost. Reboot the system to recover this GPU", 3),
        LostDevice("0000:8a:00", "Unknown Error", 5),
    ]
    assert result.host_error is None


def test_lost_line_before_header_and_before_host_error():
    lost = "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover this GPU\n"
    result = parse_query_csv(lost + "index, name, memory.total [MiB]\n1, Tesla T4, 15360 MiB\n", "query.csv")
    assert [r.index for r in result.rows] == [1] and result.lost[0].line == 1
    result = parse_query_csv(lost + "No devices were found\n", "query.csv")
    assert result.rows == [] and result.host_error == "No devices were found"
    assert [d.pci_bus_id for d in result.lost] == ["0000:02:00"]


HEADER = "index, name, memory.total [MiB], memory.used [MiB]\n"
ROW0 = "0, Tesla T4, 15360 MiB, 10 MiB\n"

# text, expected line, message fragment
BAD_CASES = [
    pytest.param("", None, "empty", id="empty"),
    pytest.param(" \n\n", None, "empty", id="blank"),
    pytest.param("0, Tesla T4, 15360 MiB\n", 1, "no header line: the first line '0, Tesla T4, 15360 MiB' holds values",
                 id="noheader"),
    pytest.param("\n\nindex, name\n0, Tesla T4\n", 3, "lacks required field(s) memory.total", id="missing-field"),
    pytest.param("uuid, pci.bus_id\nGPU-1, 00000000:01:00.0\n", 1, "lacks required field(s) index, name, memory.total",
                 id="missing-all-required"),
    pytest.param(HEADER + ROW0 + "1, Tesla T4, 15360 MiB\n", 3, "row has 3 cell(s), the header has 4", id="short-row"),
    pytest.param(HEADER + ROW0 + "1, Tesla T4, 15360 MiB, 1 MiB, 7\n", 3, "row has 5 cell(s)", id="long-row"),
    pytest.param(HEADER + ROW0 + "[...]\n", 3, "row has 1 cell(s), the header has 4: '[...]'", id="elision"),
    pytest.param(HEADER + "0, Tesla T4, lots, 10 MiB\n", 2, "field memory.total: not a number: 'lots'", id="not-a-number"),
    pytest.param(HEADER + "0, Tesla T4, 15 GiB, 10 MiB\n", 2, "unexpected unit 'GiB'", id="wrong-unit"),
    pytest.param("index, name, memory.total [GiB]\n0, Tesla T4, 15\n", 1, "memory.total is in [GiB], expected [MiB]",
                 id="wrong-header-unit"),
    pytest.param(HEADER + ROW0 + "0, Tesla T4, 15360 MiB, 10 MiB\n", 3, "GPU index 0 appears twice (first on line 2)",
                 id="duplicate-index"),
    pytest.param(HEADER + "-1, Tesla T4, 15360 MiB, 10 MiB\n", 2, "field index: not a non-negative integer: '-1'",
                 id="negative-index"),
    pytest.param(HEADER + "0.5, Tesla T4, 15360 MiB, 10 MiB\n", 2, "field index: not a non-negative integer",
                 id="fractional-index"),
    pytest.param(HEADER + "[N/A], Tesla T4, 15360 MiB, 10 MiB\n", 2, "required field index has no value ([N/A])",
                 id="index-NA"),
    pytest.param(HEADER + "[Unknown Error], Tesla T4, 15360 MiB, 10 MiB\n", 2, "required field index has no value",
                 id="index-unknown-error"),
    pytest.param(HEADER + "0, [N/A], 15360 MiB, 10 MiB\n", 2, "required field name has no value", id="name-NA"),
    pytest.param(HEADER + "0, Tesla T4, [Not Supported], 10 MiB\n", 2, "required field memory.total has no value",
                 id="memory-not-supported"),
    pytest.param(HEADER + "0, Tesla T4, 15360 MiB, \n", 2, "field memory.used is empty", id="empty-cell"),
    pytest.param("index, name, memory.total [MiB], retired_pages.pending\n0, Tesla T4, 15360 MiB, Maybe\n", 2,
                 "expected Yes or No, got 'Maybe'", id="pending-not-yes-no"),
    pytest.param("index, name, memory.total [MiB], ecc.errors.uncorrected.volatile.total\n0, Tesla T4, 15360 MiB, 1.5\n",
                 2, "field ecc.errors.uncorrected.volatile.total: not a non-negative integer", id="ecc-fraction"),
    pytest.param("index, name, pci.bus_id, memory.total [MiB]\n0, Tesla T4, somewhere, 15360 MiB\n", 2,
                 "field pci.bus_id: not a PCI bus id: 'somewhere'", id="bad-bus-id"),
    pytest.param(HEADER, 1, "header but no GPU rows", id="header-only"),
    pytest.param(HEADER + ROW0 + "No devices were found\n", 3, "nvidia-smi failed in the middle of its output",
                 id="host-error-after-rows"),
    pytest.param("Unable to determine the device handle for GPU 0000:zz:00.0: Unknown Error\n", 1,
                 "not a PCI bus id", id="lost-line-bad-bus-id"),
]


@pytest.mark.parametrize("text, line, fragment", BAD_CASES)
def test_rejects_with_file_and_line(text, line, fragment):
    with pytest.raises(CaptureError) as info:
        parse_query_csv(text, "hosts/a/query.csv")
    message = str(info.value)
    assert "\n" not in message
    assert info.value.path == "hosts/a/query.csv" and info.value.line == line
    assert message.startswith("hosts/a/query.csv:" + (f"{line}:" if line else " "))
    assert fragment in message


def test_eight_gpu_query_parses():
    """(How fast: benchmarks/capture_parse.py.)"""
    text = SPEC_HEADER + "".join(SPEC_ROW.replace("0, GPU-a1", f"{i}, GPU-a{i}", 1) for i in range(8))
    assert [r.index for r in parse_query_csv(text, "query.csv").rows] == list(range(8))


# --- bus ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, canonical",
    [
        ("00000000:3B:00.0", "0000:3b:00"),  # nvidia-smi --query-gpu=pci.bus_id
        ("PCI:0000:3b:00", "0000:3b:00"),  # kernel Xid line
        ("GPU0000:07:00.0", "0000:07:00"),  # "Unable to determine the device handle for GPU0000:07:00.0"
        ("GPU 0000:0B:00.0", "0000:0b:00"),  # the same message from older drivers
        ("0000:0B:00.0", "0000:0b:00"),
        ("00008ED0:00:00.0", "8ed0:00:00"),  # Azure VM, non-zero domain
        ("PCI:0019:01:00", "0019:01:00"),  # Grace system, non-zero domain
        ("3b:00.0", "0000:3b:00"),  # lspci without -D
        (" 0000:3b:1f.7 ", "0000:3b:1f"),
        ("0001A000:01:00.0", "1a000:01:00"),  # wider than 16 bits: every digit kept
    ],
)
def test_normalize_bus_id(raw, canonical):
    assert normalize_bus_id(raw) == canonical


@pytest.mark.parametrize(
    "raw", ["", "garbage", "0000:3b", "0000:3b:00.8", "0000:3b:20.0", "0000:xx:00.0", "000000000:3b:00.0", "0000:3b:00:00"]
)
def test_normalize_bus_id_rejects(raw):
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalize_bus_id(raw)
