"""Which database the ledger lives in: URL parsing, defaults and driver mapping.

SQLite (a file) by default: ``$AIRFLOW_HOME/hetero_gpu_ledger.db``, or
``~/airflow/hetero_gpu_ledger.db`` when ``AIRFLOW_HOME`` is unset. PostgreSQL in production;
``postgresql://`` and ``postgres://`` URLs are opened with psycopg 3 (``postgresql+psycopg://``).
A plain filesystem path (no ``scheme://``) means a SQLite file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from airflow_hetero_gpu.ledger.errors import LedgerUrlError

DEFAULT_FILENAME = "hetero_gpu_ledger.db"
SUPPORTED = ("sqlite", "postgresql")
# "sqlite:/x", "postgresql:db", "host:5432/db" look like URLs gone wrong; "C:\\x" is a path
_SCHEME_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


def default_path() -> Path:
    """Where the default SQLite ledger lives."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.join(os.path.expanduser("~"), "airflow")
    return Path(home) / DEFAULT_FILENAME


def default_url() -> str:
    return f"sqlite:///{default_path()}"


def parse_url(url: str | URL | None) -> URL:
    """Turn what the user gave into a SQLAlchemy URL the ledger can open.

    ``None`` or ``""`` means the default SQLite file. Raises :class:`LedgerUrlError` naming the
    value when it cannot be parsed or names an unsupported database.
    """
    if url is None or (isinstance(url, str) and not url.strip()):
        return make_url(default_url())
    if isinstance(url, str):
        text = url.strip()
        if "://" not in text:
            if _SCHEME_LIKE.match(text):
                raise LedgerUrlError(f"ledger URL {text!r} is malformed: expected scheme://...")
            text = f"sqlite:///{Path(text).expanduser().absolute()}"
        try:
            parsed = make_url(text)
        except (ArgumentError, ValueError) as err:
            raise LedgerUrlError(f"ledger URL {mask(text)!r} is malformed: {err}") from None
    else:
        parsed = url
    backend = parsed.get_backend_name()
    if backend == "postgres":  # the old Heroku spelling
        parsed = parsed.set(drivername="postgresql")
        backend = "postgresql"
    if backend not in SUPPORTED:
        raise LedgerUrlError(
            f"ledger URL {mask(parsed)!r}: unsupported database {backend!r}; use sqlite:///PATH or postgresql://..."
        )
    if backend == "postgresql":
        if parsed.drivername == "postgresql":  # no driver named: psycopg 3, not SQLAlchemy's psycopg2
            parsed = parsed.set(drivername="postgresql+psycopg")
        if not parsed.database:
            raise LedgerUrlError(f"ledger URL {mask(parsed)!r} names no database")
    if backend == "sqlite" and parsed.database not in (None, "", ":memory:"):
        path = Path(parsed.database).expanduser()
        parsed = parsed.set(database=str(path))
    return parsed


def is_memory(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def mask(url: str | URL) -> str:
    """The URL with its password hidden, for messages and logs."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is shown as given, minus anything after '@'
        head, _, tail = url.rpartition("@")
        return f"***@{tail}" if head else url
