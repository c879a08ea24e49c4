"""Opening the ledger, its schema and its transactions (what every part of the ``Ledger`` uses).

Readers never create or change a database: :meth:`LedgerBase.open_existing` opens a ledger that
exists and has the current schema, and refuses anything else with one line saying what to do.
Writers (``Ledger.from_url``) create the database on first use and apply missing schema steps;
``create=False`` keeps a writer from creating one (``hetero-gpu release`` on a mistyped URL
must not make an empty ledger).
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from airflow_hetero_gpu.ledger import guard, migrations
from airflow_hetero_gpu.ledger.checks import first_line
from airflow_hetero_gpu.ledger.db import db_now, make_engine, read_transaction, write_transaction
from airflow_hetero_gpu.ledger.errors import LedgerError, LedgerUpgraded, MissingLedger
from airflow_hetero_gpu.ledger.url import is_memory, mask, parse_url

Clock = Callable[[], datetime]
CommitHook = Callable[[str, str], None]

#: What to tell a user whose ledger holds no inventory, or is missing.
FILL_WITH = "fill it with `hetero-gpu collect --ledger URL` or `hetero-gpu check --ledger URL`"
FILL_HINT = f"create it with `hetero-gpu ledger init URL`, or {FILL_WITH}"


def require_existing(url: Any) -> None:
    """Refuse a SQLite URL (or path) whose file does not exist, in the one line every reader and
    the command line give (:class:`MissingLedger`); a PostgreSQL URL is checked when connecting."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite" and not is_memory(parsed) and not Path(parsed.database).is_file():
        raise MissingLedger(f"no ledger at {mask(parsed)} (no such file): {FILL_HINT}")


class LedgerBase:
    """The database, its schema and its transactions. See :class:`airflow_hetero_gpu.ledger.Ledger`.

    ``create``: make the database (SQLite file) and its tables when missing; ``migrate``: apply
    missing schema steps. ``clock`` replaces the lease clock (tests); ``before_commit(action,
    job_id)`` runs inside the reserve and replace transactions just before they commit (tests use
    it to die mid-way).
    """

    def __init__(self, url: str | None = None, *, create: bool = True, migrate: bool = True,
                 clock: Clock | None = None, before_commit: CommitHook | None = None):
        self.url = parse_url(url)
        self._clock = clock
        self._before_commit = before_commit
        if not create:
            require_existing(self.url)
        self._engine = make_engine(self.url, create=create)
        try:
            self._ensure_schema(create=create, migrate=migrate)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_url(cls, url: str | None = None, **kwargs: Any):
        """Open the ledger at ``url`` (SQLite path or URL, PostgreSQL URL; None: the default file),
        creating or upgrading it as needed (writers)."""
        return cls(url, **kwargs)

    @classmethod
    def open_existing(cls, url: str | None = None, **kwargs: Any):
        """Open an existing ledger with the current schema, creating and changing nothing (readers).

        A missing database, one that holds no ledger, or one with an older or newer schema is a
        one-line :class:`LedgerError` saying what to do.
        """
        return cls(url, create=False, migrate=False, **kwargs)

    @property
    def display_url(self) -> str:
        return mask(self.url)

    @property
    def dialect(self) -> str:
        return self._engine.dialect.name

    def close(self) -> None:
        """Close every pooled connection."""
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.dispose()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({self.display_url!r})"

    # --- transactions ---------------------------------------------------------------------------
    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except DBAPIError as err:
            refused = guard.refusal(err, migrations.LATEST)
            if refused is not None:  # a newer release upgraded the ledger while this process ran
                raise LedgerUpgraded(f"ledger {self.display_url}: {action} refused: {refused}") from err
            if isinstance(err, IntegrityError):
                raise LedgerError(f"ledger {self.display_url}: {action} refused by the database: "
                                  f"{first_line(err)}") from err
            raise LedgerError(f"ledger {self.display_url}: {action} failed: {first_line(err)}") from err

    @contextmanager
    def _write(self, action: str) -> Iterator[tuple[Connection, datetime]]:
        with self._errors(action), write_transaction(self._engine) as conn:
            yield conn, self._now(conn)

    @contextmanager
    def _read(self, action: str) -> Iterator[tuple[Connection, datetime]]:
        with self._errors(action), read_transaction(self._engine) as conn:
            yield conn, self._now(conn)

    def _now(self, conn: Connection) -> datetime:
        return self._clock() if self._clock else db_now(conn)

    def now(self) -> datetime:
        """The ledger's clock (the PostgreSQL server's, or this machine's for SQLite)."""
        with self._read("read the clock") as (_conn, now):
            return now

    def _hook(self, action: str, job_id: str) -> None:
        if self._before_commit is not None:
            self._before_commit(action, job_id)

    # --- schema -----------------------------------------------------------------------------------
    def schema_version(self) -> int:
        with self._read("read the schema version") as (conn, _):
            return migrations.current_version(conn)

    def _ensure_schema(self, *, create: bool = True, migrate: bool = True) -> None:
        version = self.schema_version()
        if version == migrations.LATEST:
            return
        if version > migrations.LATEST:
            raise LedgerError(
                f"ledger {self.display_url} has schema version {version}, newer than this airflow-hetero-gpu "
                f"supports ({migrations.LATEST}); upgrade the package")
        if version == 0 and not create:
            raise LedgerError(f"{self.display_url} holds no ledger (no schema_version table): {FILL_HINT}")
        if not migrate:
            raise LedgerError(
                f"ledger {self.display_url} has schema version {version}, older than this airflow-hetero-gpu's "
                f"({migrations.LATEST}): upgrade it with `hetero-gpu ledger init URL` (any writer also does)")
        with self._write("create or upgrade the schema") as (conn, now):
            version = migrations.current_version(conn)  # again, now under the lock
            if version > migrations.LATEST:
                raise LedgerError(
                    f"ledger {self.display_url} has schema version {version}, newer than this airflow-hetero-gpu "
                    f"supports ({migrations.LATEST}); upgrade the package")
            migrations.upgrade(conn, now)
