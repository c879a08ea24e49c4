"""Tests of the ``nvidia-smi topo -m`` reader against real outputs and hand-made broken ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_hetero_gpu.capture.topo import TopoMatrix, link_weight, parse_topo
from airflow_hetero_gpu.errors import CaptureError

from shared_data import shared_data

LOCAL = Path(__file__).resolve().parent / "data" / "nvidia-smi"


SHARED_TOPO = shared_data() / "nvidia-smi" / "topo"
_NO_SHARED = pytest.mark.skip(reason=f"real nvidia-smi samples not present at {SHARED_TOPO}")


def _shared_files() -> list:
    if not SHARED_TOPO.is_dir():
        return [pytest.param("absent", marks=_NO_SHARED)]
    return sorted(p.name for p in SHARED_TOPO.iterdir() if p.is_file() and p.name != "SOURCES.md")


def _read(folder: Path, name: str) -> tuple[str, str]:
    if not folder.is_dir():
        pytest.skip(f"real nvidia-smi samples not present at {folder}")
    path = folder / name
    return path.read_text(encoding="utf-8"), str(path)


def _check(
    matrix: TopoMatrix,
    gpus: int,
    links: dict[tuple[int, int], str],
    nics: tuple[str, ...],
    gpu_nic: dict[tuple[int, str], str],
    cpu: dict[int, str | None],
    numa: dict[int, str | None],
) -> None:
    assert matrix.gpus == tuple(range(gpus))
    assert len(matrix.links) == gpus * (gpus - 1)
    for (a, b), label in links.items():
        assert matrix.links[(a, b)] == label, (a, b)
        assert matrix.links[(b, a)] == label, (b, a)
    assert matrix.nics == nics
    assert len(matrix.gpu_nic_links) == gpus * len(nics)
    for key, label in gpu_nic.items():
        assert matrix.gpu_nic_links[key] == label, key
    for gpu, value in cpu.items():
        assert matrix.cpu_affinity[gpu] == value, gpu
    for gpu, value in numa.items():
        assert matrix.numa_affinity[gpu] == value, gpu


# name, GPU count, GPU-GPU links, NICs, GPU-NIC links, CPU affinity, NUMA affinity
LOCAL_CASES = [
    (
        "dgx1-v100-8gpu-4x-mlx5-legacy-legend.txt",
        8,
        {(0, 1): "NV1", (0, 3): "NV2", (0, 5): "SYS", (2, 6): "NV1", (4, 7): "NV2", (5, 6): "NV2"},
        ("mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"),
        {(0, "mlx5_0"): "PIX", (0, "mlx5_1"): "PHB", (4, "mlx5_2"): "PIX", (7, "mlx5_3"): "PIX"},
        {0: "0-19,40-59", 7: "20-39,60-79"},
        {0: None, 7: None},  # no NUMA Affinity column in this driver
    ),
    (
        "hgx-h200-8gpu-nv18-10nic-ansi.txt",
        8,
        {(0, 1): "NV18", (3, 4): "NV18", (6, 7): "NV18"},
        tuple(f"mlx5_{i}" for i in range(10)),
        {(0, "mlx5_3"): "PIX", (0, "mlx5_0"): "NODE", (0, "mlx5_6"): "SYS", (4, "mlx5_7"): "PIX", (7, "mlx5_6"): "PIX"},
        {0: "0-63,128-191", 4: "64-127,192-255"},
        {0: "0", 4: "1"},
    ),
    (
        "8x-a100-sxm-nv12-4nic-hgx-2numa.txt",
        8,
        {(0, 1): "NV12", (0, 7): "NV12", (3, 5): "NV12"},
        ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"),
        {(0, "mlx5_0"): "PXB", (2, "mlx5_2"): "PXB", (4, "mlx5_0"): "SYS", (3, "mlx5_1"): "SYS"},
        {0: "0-31,64-95", 4: "32-63,96-127"},
        {0: "0", 3: "0", 4: "1", 7: "1"},
    ),
    (
        "8x-rtx4090-pcie-phb-node-sys-2numa.txt",
        8,
        {(0, 1): "PHB", (0, 2): "NODE", (0, 6): "SYS", (2, 3): "PHB", (5, 7): "SYS", (6, 7): "PHB"},
        (),
        {},
        {0: "0-35,72-107", 6: "36-71,108-143"},
        {0: "0", 5: "0", 6: "1"},
    ),
    (
        "8x-v100-sxm2-alt-cube-mesh-2nic-mangled-whitespace.txt",
        8,
        {(0, 1): "NV1", (0, 2): "NV2", (0, 3): "NV1", (0, 4): "SYS", (0, 7): "NV2", (4, 5): "NV2"},
        ("mlx5_0", "mlx5_1"),
        {(0, "mlx5_0"): "NODE", (0, "mlx5_1"): "SYS", (2, "mlx5_0"): "PIX", (6, "mlx5_1"): "PIX"},
        {0: "0-23,48-71", 4: "24-47,72-95"},
        {0: "0", 4: "1"},
    ),
    (
        "2x-tesla-k80-4gpu-mlx4-soc-era-legend.txt",
        4,
        {(0, 1): "PIX", (0, 2): "PHB", (1, 3): "PHB", (2, 3): "PIX"},
        ("mlx4_0",),
        {(0, "mlx4_0"): "PHB", (3, "mlx4_0"): "PHB"},
        {0: "0-11", 3: "0-11"},
        {0: None},
    ),
]

SHARED_CASES = LOCAL_CASES[:3] + [
    (
        "dgx1-v100-pytorch-ddp-bench-4nic-spaces.txt",
        8,
        {(0, 1): "NV1", (0, 3): "NV2", (0, 5): "SYS", (3, 7): "NV1"},
        ("mlx5_2", "mlx5_0", "mlx5_3", "mlx5_1"),
        {(0, "mlx5_0"): "PIX", (4, "mlx5_2"): "PIX", (7, "mlx5_3"): "PIX"},
        {0: "0-19,40-59", 7: "0-19,40-59"},
        {0: None},
    ),
    (
        "hgx-h100-8gpu-nv18-gpu-numa-id.txt",
        8,
        {(0, 1): "NV18", (0, 7): "NV18"},
        (),
        {},
        {0: "0-47,96-143", 4: "48-95,144-191"},
        {0: "0", 4: "1"},
    ),
    (
        "8x-p100-pcie-pix-phb-chainer-ci.txt",
        8,
        {(0, 1): "PIX", (0, 3): "PIX", (0, 4): "PHB", (3, 4): "PHB", (4, 7): "PIX"},
        (),
        {},
        {0: "0-7,16-23"},
        {0: "0"},
    ),
    (
        "2of8-a100-nv12-8nic-partial-lmdeploy.txt",
        2,
        {(0, 1): "NV12"},
        tuple(f"mlx5_{i}" for i in range(8)),
        {(0, "mlx5_0"): "SYS", (0, "mlx5_4"): "NODE", (1, "mlx5_6"): "PXB"},
        {0: "48-95,144-191"},
        {0: "1"},
    ),
    (
        "dgx-a100-8gpu-nv12-12nic-8numa.txt",
        8,
        {(0, 1): "NV12", (2, 6): "NV12"},
        tuple(f"mlx5_{i}" for i in range(12)),
        {(0, "mlx5_0"): "PXB", (6, "mlx5_8"): "PXB", (7, "mlx5_11"): "SYS"},
        {0: "48-63,176-191"},
        {0: "3", 2: "1", 4: "7", 6: "5"},
    ),
    (
        "polaris-4x-a100-sxm4-nv4-2nic-4numa-header-edited.txt",
        4,
        {(0, 1): "NV4", (2, 3): "NV4"},
        ("mlx5_0", "mlx5_1"),
        {(3, "mlx5_0"): "PHB", (1, "mlx5_1"): "PHB", (0, "mlx5_0"): "SYS"},
        {0: "24-31,56-63", 3: "0-7,32-39"},
        {0: "3", 3: "0"},
    ),
    (
        "8x-a800-sxm4-nv8-8bonded-nic.txt",
        8,
        {(0, 1): "NV8", (2, 5): "NV8"},
        tuple(f"mlx5_bond_{i}" for i in range(8)),
        {(0, "mlx5_bond_0"): "PIX", (0, "mlx5_bond_2"): "NODE", (7, "mlx5_bond_7"): "PIX"},
        {0: "0-61", 4: "62-123"},
        {0: "0", 4: "1"},
    ),
    (
        "8x-h20-nv18-2nic-phb-node.txt",
        8,
        {(0, 7): "NV18"},
        ("NIC0", "NIC1"),  # no NIC Legend in this output: names as printed
        {(6, "NIC0"): "PHB", (0, "NIC0"): "SYS", (4, "NIC1"): "NODE"},
        {0: "0-95,192-287"},
        {7: "1"},
    ),
    (
        "5x-rtx4090-mixed-sys-phb-node-2numa.txt",
        5,
        {(0, 1): "SYS", (1, 2): "PHB", (1, 3): "NODE", (3, 4): "PHB"},
        (),
        {},
        {0: "8-15,24-31", 1: "0-7,16-23"},
        {0: "1", 1: "0"},
    ),
    (
        "dgx1-topo-mp-pcie-only-4nic.txt",
        8,
        {(0, 1): "PIX", (0, 2): "PHB", (0, 4): "SYS"},
        ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"),
        {(0, "mlx5_0"): "PIX", (7, "mlx5_3"): "PIX"},
        {4: "20-39,60-79"},
        {4: "1"},
    ),
    ("2gpu-nvlink-nv2-numa-na.txt", 2, {(0, 1): "NV2"}, (), {}, {0: "0-23"}, {0: None}),
    ("1x-tesla-p4-numa-na.txt", 1, {}, (), {}, {0: "0-7"}, {0: None}),
    ("1x-rtx2080super-windows-empty-affinity.txt", 1, {}, (), {}, {0: None}, {0: None}),
    ("1x-h100-sxm-vm-ansi-underline-header.txt", 1, {}, (), {}, {0: "0-19"}, {0: "0"}),
]

SHARED_REJECTED = {
    "error-windows-driver591-topo-m-missing-value.txt": "ERROR: Option -m is missing its value",
    "topo-c-cpu-affinity-dgx-a100.txt": "# nvidia-smi topo -c 48",
}


@pytest.mark.parametrize("name, gpus, links, nics, gpu_nic, cpu, numa", LOCAL_CASES)
def test_local_copies_of_real_outputs(name, gpus, links, nics, gpu_nic, cpu, numa):
    text, path = _read(LOCAL, name)
    _check(parse_topo(text, path), gpus, links, nics, gpu_nic, cpu, numa)


@pytest.mark.parametrize("name, gpus, links, nics, gpu_nic, cpu, numa", SHARED_CASES)
def test_shared_real_outputs(name, gpus, links, nics, gpu_nic, cpu, numa):
    text, path = _read(SHARED_TOPO, name)
    _check(parse_topo(text, path), gpus, links, nics, gpu_nic, cpu, numa)


@pytest.mark.parametrize("name", _shared_files())
def test_every_shared_sample_parses_or_fails_cleanly(name):
    text, path = _read(SHARED_TOPO, name)
    try:
        matrix = parse_topo(text, path)
    except CaptureError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"{path}:")
        assert name in SHARED_REJECTED, message
        assert SHARED_REJECTED[name][:20] in message
    else:
        assert name not in SHARED_REJECTED
        assert matrix.gpus and all(link_weight(label) >= 1 for label in matrix.links.values())


def test_same_wiring_printed_differently_has_one_fingerprint():
    text, path = _read(LOCAL, "dgx1-v100-8gpu-4x-mlx5-legacy-legend.txt")
    tabs = parse_topo(text, path)
    spaces = parse_topo(text.replace("\t", "    "), path)
    no_nics = parse_topo(
        "\n".join(
            " ".join(line.split()[:9]) if line.startswith("GPU") else " ".join(line.split()[:8])
            for line in text.splitlines()[:9]
        ),
        path,
    )
    assert tabs == spaces and hash(tabs) == hash(spaces)
    assert tabs.fingerprint == spaces.fingerprint == no_nics.fingerprint
    assert tabs.fingerprint[0] == tuple(range(8)) and len(tabs.fingerprint[1]) == 28
    assert no_nics.nics == () and {tabs.fingerprint: "cached"}[no_nics.fingerprint] == "cached"
    other, other_path = _read(LOCAL, "8x-v100-sxm2-alt-cube-mesh-2nic-mangled-whitespace.txt")
    assert parse_topo(other, other_path).fingerprint != tabs.fingerprint


@pytest.mark.parametrize(
    "label, weight",
    [("NV1", 1), ("NV2", 1), ("NV12", 1), ("NV18", 1), ("nv4", 1), ("PIX", 2), ("PXB", 3), ("PHB", 4),
     ("NODE", 5), ("SYS", 6), ("SOC", 6), ("X", 0)],
)
def test_link_weight(label, weight):
    assert link_weight(label) == weight


@pytest.mark.parametrize("label", ["NV#", "NV0", "NVLINK", "PCI", ""])
def test_link_weight_rejects_unknown_labels(label):
    with pytest.raises(ValueError):
        link_weight(label)


TWO = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"

# text, expected GPU indices, expected links, CPU affinity, NUMA affinity
GOOD_CASES = [
    pytest.param(TWO + "GPU0\t X \tSOC\t0-5\t0\nGPU1\tSOC\t X \t6-11\t1\n", (0, 1), {(0, 1): "SOC"},
                 {0: "0-5", 1: "6-11"}, {0: "0", 1: "1"}, id="old-SOC-label"),
    pytest.param(TWO + "GPU0\t x \tnv4\t0-5\t0\nGPU1\tnv4\t x \t6-11\t1\n", (0, 1), {(0, 1): "NV4"},
                 {0: "0-5"}, {1: "1"}, id="lower-case-canonicalised"),
    pytest.param("GPU0 GPU1 CPU Affinity NUMA Affinity\nGPU0 X PHB 0-5 0\nGPU1 PHB X 0-5 0\n", (0, 1),
                 {(0, 1): "PHB"}, {0: "0-5"}, {0: "0"}, id="header-without-leading-tab"),
    pytest.param("\r\n" + TWO.replace("\n", "\r\n") + "GPU0\t X \tPXB\t0-5\tN/A\r\nGPU1\tPXB\t X \t0-5\tN/A\r\n",
                 (0, 1), {(0, 1): "PXB"}, {1: "0-5"}, {0: None, 1: None}, id="crlf-leading-blank-NA"),
    pytest.param("\t\x1b[4mGPU0\tGPU1\x1b[0m\nGPU0\t X \tNODE\nGPU1\tNODE\t X \n", (0, 1), {(0, 1): "NODE"},
                 {0: None}, {0: None}, id="ansi-header-no-affinity-columns"),
    pytest.param("\t[4mGPU0\tGPU1[0m\nGPU0\t X \tNODE\nGPU1\tNODE\t X \n", (0, 1), {(0, 1): "NODE"},
                 {0: None}, {0: None}, id="ansi-with-escape-byte-lost"),
    pytest.param(TWO + "GPU1\tSYS\t X \t6-11\t1\nGPU0\t X \tSYS\t0-5\t0\n", (1, 0), {(0, 1): "SYS"},
                 {0: "0-5", 1: "6-11"}, {0: "0", 1: "1"}, id="rows-in-another-order"),
    pytest.param("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
                 "GPU0\t X \tPIX\t\t\t\tN/A\nGPU1\tPIX\t X \t\t\t\tN/A\n", (0, 1), {(0, 1): "PIX"},
                 {0: None}, {0: None}, id="empty-affinity-cells"),
]


@pytest.mark.parametrize("text, gpus, links, cpu, numa", GOOD_CASES)
def test_layouts(text, gpus, links, cpu, numa):
    matrix = parse_topo(text, "topo.txt")
    assert matrix.gpus == gpus
    for (a, b), label in links.items():
        assert matrix.links[(a, b)] == matrix.links[(b, a)] == label
    assert {g: matrix.cpu_affinity[g] for g in cpu} == cpu
    assert {g: matrix.numa_affinity[g] for g in numa} == numa


NICS = "\tGPU0\tGPU1\tNIC0\tCPU Affinity\n"

# text, expected line, a fragment of the message
BAD_CASES = [
    pytest.param("", None, "empty", id="empty"),
    pytest.param("\n \n\t\n", None, "empty", id="blank"),
    pytest.param("ERROR: Option -m is missing its value. Please run 'nvidia-smi -h' for help.\n", 1,
                 "not an nvidia-smi topo -m matrix: \"ERROR: Option -m", id="driver-error"),
    pytest.param("The GPUs that have an affinity with CPU 48 are:\n0, 1\n", 1, "The GPUs that have", id="topo-c"),
    pytest.param("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 1,
                 "NVIDIA-SMI has failed", id="no-driver"),
    pytest.param(TWO + "GPU0\t X \tNV1\t0-5\t0\nGPU1\tNV2\t X \t0-5\t0\n", 2, "not symmetric: GPU0 row says GPU0-GPU1 is NV1",
                 id="asymmetric"),
    pytest.param(TWO + "GPU0\tPIX\tPIX\t0-5\t0\nGPU1\tPIX\t X \t0-5\t0\n", 2, "expected X on the diagonal", id="no-X"),
    pytest.param(TWO + "GPU0\t X \tX\t0-5\t0\nGPU1\tX\t X \t0-5\t0\n", 2, "X off the diagonal", id="X-off-diagonal"),
    pytest.param(TWO + "GPU0\t X \tNVL\t0-5\t0\nGPU1\tNVL\t X \t0-5\t0\n", 2, "unknown link label 'NVL'", id="unknown-label"),
    pytest.param(TWO + "GPU0\t X \tNV#\t0-5\t0\nGPU1\tNV#\t X \t0-5\t0\n", 2, "unknown link label 'NV#'", id="legend-NV#"),
    pytest.param(TWO + "GPU0\t X \tPIX\t0-5\t0\n", 1, "lists GPU1 but no such row", id="missing-row"),
    pytest.param(TWO + "GPU0\t X \tPIX\t0-5\t0\nGPU0\t X \tPIX\t0-5\t0\n", 3, "GPU0 row appears twice", id="duplicate-row"),
    pytest.param(TWO + "GPU0\t X \tPIX\t0-5\t0\nGPU1\tPIX\t X \t0-5\t0\nGPU2\tPIX\tPIX\t X\n", 4,
                 "GPU2 row, but the header has no GPU2 column", id="row-not-in-header"),
    pytest.param(TWO + "GPU0\t X\nGPU1\tPIX\t X \t0-5\t0\n", 2, "GPU0 row has 1 link cell(s), the header has 2",
                 id="short-row"),
    pytest.param(TWO + "GPU0\t X \tPIX\t0-5\t0\t7\nGPU1\tPIX\t X \t0-5\t0\n", 2, "1 cell(s) more than the header",
                 id="long-row"),
    pytest.param(TWO + "GPU0\t X \tPIX\t0-5\t0\n[...]\nGPU1\tPIX\t X \t0-5\t0\n", 3, "unexpected line in the matrix: '[...]'",
                 id="elision"),
    pytest.param("\tGPU0\tGPU0\nGPU0\t X \t X\n", 1, "names a GPU twice", id="duplicate-header"),
    pytest.param(NICS + "GPU0\t X \tPIX\tPXB\t0-5\nGPU1\tPIX\t X \tPXB\t0-5\nNIC0\tPXB\tSYS\t X\n", 3,
                 "GPU1 row says GPU1-NIC0 is PXB, NIC0 row (line 4) says SYS", id="nic-asymmetric"),
    pytest.param(NICS + "GPU0\t X \tPIX\tPXB\t0-5\nGPU1\tPIX\t X \tPXB\t0-5\nNIC0\tPXB\tPXB\tPIX\n", 4,
                 "NIC0 row: expected X on the diagonal", id="nic-diagonal"),
    pytest.param(NICS + "GPU0\t X \tPIX\tPXB\t0-5\nGPU1\tPIX\t X \tPXB\t0-5\n\nNIC Legend:\n\n  NIC0 is mlx5_0\n", 7,
                 "unexpected line in the NIC legend", id="nic-legend-garbage"),
]


@pytest.mark.parametrize("text, line, fragment", BAD_CASES)
def test_rejects_with_file_and_line(text, line, fragment):
    with pytest.raises(CaptureError) as info:
        parse_topo(text, "hosts/a/topo.txt")
    message = str(info.value)
    assert "\n" not in message
    assert info.value.path == "hosts/a/topo.txt" and info.value.line == line
    assert message.startswith("hosts/a/topo.txt:" + (f"{line}:" if line else " "))
    assert fragment in message


def test_nic_rows_optional_and_legend_names_nics():
    text = NICS + "GPU0\t X \tPIX\tPXB\t0-5\nGPU1\tPIX\t X \tSYS\t0-5\n\nLegend:\n\n  X = Self\n\nNIC Legend:\n\n  NIC0: mlx5_4\n"
    matrix = parse_topo(text, "topo.txt")
    assert matrix.nics == ("mlx5_4",)
    assert matrix.gpu_nic_links == {(0, "mlx5_4"): "PXB", (1, "mlx5_4"): "SYS"}


def test_eight_gpu_matrix_with_ten_nics_parses():
    """(How fast: benchmarks/capture_parse.py.)"""
    text, path = _read(LOCAL, "hgx-h200-8gpu-nv18-10nic-ansi.txt")  # 8 GPUs and 10 NICs
    matrix = parse_topo(text, path)
    assert len(matrix.gpus) == 8 and len(matrix.nics) == 10
