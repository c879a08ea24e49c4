"""Where the collection of real outputs is: ``tests/data/real`` in the repository (a copy of the
project's collection, each folder with its SOURCES.md), or the folder HETERO_GPU_SHARED_DATA
names (a newer collection to try the parsers on). A clone of the repository alone runs every
test that reads it."""

from __future__ import annotations

import os
from pathlib import Path

#: the copy kept in the repository
IN_REPO = Path(__file__).resolve().parent / "data" / "real"


def shared_data() -> Path:
    named = os.environ.get("HETERO_GPU_SHARED_DATA")
    return Path(named) if named else IN_REPO
