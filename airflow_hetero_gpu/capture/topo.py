"""Reader of ``nvidia-smi topo -m`` output (SPEC §2, §5).

Real drivers print the matrix in many layouts: tab- or space-separated (or a hand-realigned mix
of both), with or without NIC rows and columns (``NIC0``.. plus a ``NIC Legend:`` block, or
``mlx5_0`` directly), with ``CPU Affinity`` / ``NUMA Affinity`` / ``GPU NUMA ID`` columns that
may be empty or ``N/A``, with the header wrapped in ANSI escape codes, with or without the
``Legend:`` block, and with the pre-Pascal ``SOC`` label. The reader relies only on what all of
them share:

* after ANSI codes are removed, the first non-blank line is the header; its leading ``GPU<n>``
  tokens give the GPU columns, the tokens after them (up to ``CPU``/``NUMA``/``GPU NUMA ID``)
  the NIC columns;
* a GPU row starts with ``GPU<n>``; its first whitespace-separated tokens after the label are
  the link cells (link labels never contain spaces), GPU columns first, then NIC columns, then
  the affinity cells.

The matrix is validated (square, ``X`` exactly on the diagonal, known link labels, symmetric);
anything else raises :class:`~airflow_hetero_gpu.errors.CaptureError` naming file and line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

from airflow_hetero_gpu.errors import CaptureError

__all__ = ["LINK_WEIGHTS", "TopoMatrix", "link_weight", "parse_topo"]

# Transmission-path lengths of SPEC §5; any NV<n> (a bond of n NVLinks) weighs 1.
LINK_WEIGHTS = {"PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6, "SOC": 6}
NVLINK_WEIGHT = 1

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\[[0-9;]*m")  # the second form: ESC lost in copying
_NVLINK = re.compile(r"NV[1-9][0-9]*")
_GPU_LABEL = re.compile(r"GPU([0-9]+)")
_AFFINITY_COLUMN = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID")
_AFFINITY_START = frozenset({"CPU", "NUMA", "GPU"})
_NIC_LEGEND_ENTRY = re.compile(r"(?P<alias>NIC[0-9]+)\s*:\s*(?P<device>\S+)")
_NO_VALUE = frozenset({"", "N/A"})


def link_weight(label: str) -> int:
    """Path length of a ``topo -m`` cell: any ``NV<n>`` 1, PIX 2, PXB 3, PHB 4, NODE 5, SYS/SOC 6.

    Every label :func:`parse_topo` returns has a weight (it rejects unknown labels while
    parsing); ``X`` (self) weighs 0. Anything else is a programming error: ``ValueError``.
    """
    label = label.upper()
    if _NVLINK.fullmatch(label):
        return NVLINK_WEIGHT
    if label == "X":
        return 0
    try:
        return LINK_WEIGHTS[label]
    except KeyError:
        raise ValueError(f"unknown topo -m link label {label!r}") from None


def _is_link(label: str) -> bool:
    return label in LINK_WEIGHTS or _NVLINK.fullmatch(label) is not None


@dataclass(frozen=True)
class TopoMatrix:
    """One host's ``topo -m``: GPU-GPU and GPU-NIC links, CPU and NUMA affinity per GPU.

    ``links`` holds both orders of every GPU pair; labels are canonical upper case (``NV12``,
    ``PIX``, ``SYS``, ``SOC``). ``nics`` are real device names (``mlx5_0``) where the output
    had a NIC legend, else the names as printed.
    """

    gpus: tuple[int, ...]
    links: dict[tuple[int, int], str]
    nics: tuple[str, ...]
    gpu_nic_links: dict[tuple[int, str], str]
    cpu_affinity: dict[int, str | None]
    numa_affinity: dict[int, str | None]

    @cached_property
    def fingerprint(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Content key of the GPU-GPU part: GPU indices and the upper-triangle labels in order.

        Two hosts wired alike share a fingerprint, so per-matrix work (shortest paths) can be
        cached by it. NICs and affinities are not part of it.
        """
        gpus = self.gpus
        labels = tuple(self.links[(a, b)] for i, a in enumerate(gpus) for b in gpus[i + 1 :])
        return gpus, labels

    def __hash__(self) -> int:
        """Hash by the GPU wiring (equal matrices have equal fingerprints)."""
        return hash(self.fingerprint)


def _quote(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    """Every line with its 1-based number, ANSI codes removed, trailing blanks stripped."""
    for number, line in enumerate(text.lstrip("\ufeff").splitlines(), start=1):
        yield number, _ANSI.sub("", line).rstrip()


@dataclass
class _Header:
    """The column names of the matrix: GPU labels, NIC labels, trailing affinity columns."""

    gpu_labels: list[str]
    nic_labels: list[str]
    affinity_columns: list[str] | None  # None: columns we do not know, affinities not read


def _read_header(line: str, number: int, path: str) -> _Header:
    """Split the header: ``GPU<n>`` tokens, then NIC names up to ``CPU``/``NUMA``/``GPU NUMA ID``."""
    tokens = line.split()
    n = 0
    while n < len(tokens) and _GPU_LABEL.fullmatch(tokens[n]):
        n += 1
    if n == 0:
        raise CaptureError(path, f"not an nvidia-smi topo -m matrix: {_quote(line)}", number)
    if len({int(token[3:]) for token in tokens[:n]}) != n:
        raise CaptureError(path, f"the header names a GPU twice: {_quote(line)}", number)
    m = n
    while m < len(tokens) and tokens[m] not in _AFFINITY_START:
        m += 1
    tail = " ".join(tokens[m:])
    columns = _AFFINITY_COLUMN.findall(tail)
    known = not _AFFINITY_COLUMN.sub("", tail).strip()
    return _Header(tokens[:n], tokens[n:m], columns if known else None)


def _link_cells(cells: list[str], diagonal: int, row: str, columns: list[str], number: int, path: str) -> list[str]:
    """Canonical (upper-case) labels of one row's link cells; ``X`` exactly at ``diagonal``."""
    labels = [cell.upper() for cell in cells]
    for position, label in enumerate(labels):
        if position == diagonal:
            if label != "X":
                raise CaptureError(path, f"{row} row: expected X on the diagonal, found {cells[position]!r}", number)
        elif not _is_link(label):
            what = "X off the diagonal" if label == "X" else f"unknown link label {cells[position]!r}"
            raise CaptureError(path, f"{row} row, column {columns[position]}: {what}", number)
    return labels


def _affinity(cells: list[str], header: _Header, row: str, number: int, path: str) -> dict[str, str | None]:
    """Affinity cells by column name; all ``None`` when empty cells make the layout ambiguous."""
    columns = header.affinity_columns
    if columns is None:
        return {}
    if len(cells) > len(columns):
        extra = len(cells) - len(columns)
        cells_text = _quote(" ".join(cells))
        raise CaptureError(path, f"{row} row has {extra} cell(s) more than the header: {cells_text}", number)
    if len(cells) < len(columns):  # some cells were empty; which ones cannot be told apart
        return {}
    return {column: (None if cell in _NO_VALUE else cell) for column, cell in zip(columns, cells, strict=True)}


_Row = tuple[int, list[str]]  # (line number, canonical link labels)


@dataclass
class _Body:
    """What follows the header: matrix rows, per-GPU affinity cells, the NIC legend."""

    gpu_rows: dict[str, _Row] = field(default_factory=dict)
    nic_rows: dict[str, _Row] = field(default_factory=dict)
    affinities: dict[str, dict[str, str | None]] = field(default_factory=dict)
    nic_legend: dict[str, str] = field(default_factory=dict)


def _read_matrix_row(line: str, number: int, header: _Header, body: _Body, path: str) -> None:
    """One ``GPU<n>`` or NIC row of the matrix, validated and stored in ``body``."""
    columns = header.gpu_labels + header.nic_labels
    label, *cells = line.split()
    if label in header.gpu_labels:
        rows, own_column = body.gpu_rows, header.gpu_labels.index(label)
    elif label in header.nic_labels:
        rows, own_column = body.nic_rows, len(header.gpu_labels) + header.nic_labels.index(label)
    elif _GPU_LABEL.fullmatch(label):
        raise CaptureError(path, f"{label} row, but the header has no {label} column", number)
    else:
        raise CaptureError(path, f"unexpected line in the matrix: {_quote(line)}", number)
    if label in rows:
        raise CaptureError(path, f"{label} row appears twice (first on line {rows[label][0]})", number)
    if len(cells) < len(columns):
        raise CaptureError(
            path, f"{label} row has {len(cells)} link cell(s), the header has {len(columns)} columns", number
        )
    rows[label] = (number, _link_cells(cells[: len(columns)], own_column, label, columns, number, path))
    if rows is body.gpu_rows:
        body.affinities[label] = _affinity(cells[len(columns) :], header, label, number, path)


def _read_body(lines: Iterator[tuple[int, str]], header: _Header, path: str) -> _Body:
    """Matrix rows until ``Legend:``; then free legend text, and ``NICn: device`` entries."""
    body = _Body()
    section = "matrix"
    for number, line in lines:
        stripped = line.strip()
        if stripped in ("Legend:", "NIC Legend:"):
            section = stripped
        elif not stripped or section == "Legend:":
            continue  # blank lines and the free text explaining the labels
        elif section == "NIC Legend:":
            entry = _NIC_LEGEND_ENTRY.fullmatch(stripped)
            if entry is None:
                raise CaptureError(path, f"unexpected line in the NIC legend: {_quote(line)}", number)
            body.nic_legend[entry["alias"]] = entry["device"]
        else:
            _read_matrix_row(stripped, number, header, body, path)
    return body


#: Parsed matrices by their text: the hosts of one model print the same ``topo -m``, so a fleet
#: of 1,000 HGX hosts is parsed once, not 1,000 times (matrices are never changed after parsing).
_PARSED: dict[str, TopoMatrix] = {}
_PARSED_MAX = 1024


def parse_topo(text: str, path: str) -> TopoMatrix:
    """Read the stdout of ``nvidia-smi topo -m``; ``path`` only names the file in errors."""
    found = _PARSED.get(text)
    if found is not None:
        return found
    matrix = _parse_topo(text, path)
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.clear()
    _PARSED[text] = matrix
    return matrix


def _parse_topo(text: str, path: str) -> TopoMatrix:
    lines = _numbered_lines(text)
    first = next(((number, line) for number, line in lines if line.strip()), None)
    if first is None:
        raise CaptureError(path, "empty: no nvidia-smi topo -m output")
    header_number, header_line = first
    header = _read_header(header_line, header_number, path)
    body = _read_body(lines, header, path)
    missing = [label for label in header.gpu_labels if label not in body.gpu_rows]
    if missing:
        raise CaptureError(path, f"the header lists {', '.join(missing)} but no such row follows", header_number)
    _check_symmetric(body.gpu_rows, body.nic_rows, header.gpu_labels + header.nic_labels, path)
    return _build(body, header)


def _check_symmetric(gpu_rows: dict[str, _Row], nic_rows: dict[str, _Row], columns: list[str], path: str) -> None:
    """Every cell (a, b) must equal (b, a) where both rows are present."""
    rows = {**gpu_rows, **nic_rows}
    position = {label: i for i, label in enumerate(columns)}
    for a, (line_a, cells_a) in rows.items():
        for b, (line_b, cells_b) in rows.items():
            if position[a] < position[b] and cells_a[position[b]] != cells_b[position[a]]:
                raise CaptureError(
                    path,
                    f"not symmetric: {a} row says {a}-{b} is {cells_a[position[b]]}, "
                    f"{b} row (line {line_b}) says {cells_b[position[a]]}",
                    line_a,
                )


def _build(body: _Body, header: _Header) -> TopoMatrix:
    """The public result: GPU indices from the labels, NIC names through the NIC legend."""
    index = {label: int(label[3:]) for label in header.gpu_labels}
    nics = tuple(body.nic_legend.get(label, label) for label in header.nic_labels)
    n = len(header.gpu_labels)
    links: dict[tuple[int, int], str] = {}
    gpu_nic_links: dict[tuple[int, str], str] = {}
    for label, (_, cells) in body.gpu_rows.items():
        gpu = index[label]
        for column, other in enumerate(header.gpu_labels):
            if other != label:
                links[(gpu, index[other])] = cells[column]
        for j, nic in enumerate(nics):
            gpu_nic_links[(gpu, nic)] = cells[n + j]
    return TopoMatrix(
        gpus=tuple(index[label] for label in body.gpu_rows),
        links=links,
        nics=nics,
        gpu_nic_links=gpu_nic_links,
        cpu_affinity={index[label]: body.affinities[label].get("CPU Affinity") for label in body.gpu_rows},
        numa_affinity={index[label]: body.affinities[label].get("NUMA Affinity") for label in body.gpu_rows},
    )
