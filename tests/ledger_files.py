"""A created ledger for the tests that name their own: a task's ``ledger_url`` must name a ledger
that exists (only the deployment's own is created on first use), as ``hetero-gpu ledger init``
makes it."""

from __future__ import annotations

from pathlib import Path

from airflow_hetero_gpu.ledger import Ledger


def new_ledger(path: Path) -> str:
    """Create the SQLite ledger at ``path`` and return its URL."""
    url = f"sqlite:///{path}"
    Ledger.from_url(url).close()
    return url
