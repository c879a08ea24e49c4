"""Where the collection of real outputs (``../shared/data``) is: named by HETERO_GPU_SHARED_DATA,
else beside the repository. Tests that read it skip with a reason when it is absent; each also
checks copies kept in tests/data, so the main path never depends on it."""

from __future__ import annotations

import os
from pathlib import Path


def shared_data() -> Path:
    named = os.environ.get("HETERO_GPU_SHARED_DATA")
    return Path(named) if named else Path(__file__).resolve().parents[1].parent / "shared" / "data"
