"""Small file-system helpers (standard library only: the emulated hosts' tools import them)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike[str], text: str, *, durable: bool = True) -> None:
    """Write ``text`` to ``path`` through a temp file and a rename: readers never see half.

    ``durable``: the data reaches the disk before the rename (an fsync, about a millisecond
    each on a virtual disk); a scratch directory removed after use does without."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_text(path: str | os.PathLike[str]) -> str:
    """A text file as the readers of raw outputs take it (UTF-8, undecodable bytes replaced)."""
    return Path(path).read_text(encoding="utf-8", errors="replace")
