"""CSV reading shared by the trace and node-list readers: every problem is one
:class:`~airflow_hetero_gpu.errors.HeteroGpuError` line naming the file, line, column and value."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Iterable, Sequence

from airflow_hetero_gpu.errors import HeteroGpuError


def bad(path: Path | str, line: int, column: str, value: object, why: str) -> HeteroGpuError:
    """``FILE:LINE: column 'C': WHY, got VALUE``."""
    return HeteroGpuError(f"{path}:{line}: column {column!r}: {why}, got {value!r}")


def open_csv(path: Path, required: Sequence[str]) -> tuple[list[str], Iterable[tuple[int, dict[str, str]]]]:
    """The header (stripped) and the rows as ``(line number, {column: stripped text})``; a
    missing required column, an empty file or a row longer than the header is an error."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise HeteroGpuError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise HeteroGpuError(f"{path}: cannot read: {err}") from None
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    if not header:
        raise HeteroGpuError(f"{path}: empty file, expected a header line with {', '.join(required)}")
    reader.fieldnames = header
    missing = [c for c in required if c not in header]
    if missing:
        raise HeteroGpuError(f"{path}:1: missing column {missing[0]!r} (header has {', '.join(header)})")

    def rows():
        for n, row in enumerate(reader, start=2):
            if None in row:
                raise HeteroGpuError(f"{path}:{n}: more fields than the header's {len(header)}")
            yield n, {k: (v or "").strip() for k, v in row.items()}

    return header, rows()


def number(path, line, column, text, *, integer=False, minimum=None, allow_empty=False):
    """A finite number from a cell (``None`` for an empty one when ``allow_empty``)."""
    if text == "":
        if allow_empty:
            return None
        raise bad(path, line, column, text, "empty value")
    try:
        value = float(text)
    except ValueError:
        raise bad(path, line, column, text, "expected a number") from None
    if not math.isfinite(value):
        raise bad(path, line, column, text, "expected a finite number")
    if integer:
        if not value.is_integer():
            raise bad(path, line, column, text, "expected a whole number")
        value = int(value)
    if minimum is not None and value < minimum:
        raise bad(path, line, column, text, f"must be at least {minimum}")
    return value
