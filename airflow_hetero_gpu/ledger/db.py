"""Engines and transactions for the ledger's two databases, with the one lock that serialises writes.

Every write goes through :func:`write_transaction`, which takes a database-wide lock for the
whole transaction before reading anything:

* PostgreSQL: ``SELECT pg_advisory_xact_lock(key)``, released by the server at commit or
  rollback, including when the client dies (the server rolls back the dead session). The
  connection runs at READ COMMITTED so every statement after the lock sees everything the
  previous lock holder committed (a REPEATABLE READ snapshot could predate the lock).
* SQLite: ``BEGIN IMMEDIATE`` takes the database's write lock at once (waiting up to the busy
  timeout); readers keep working under WAL. A dead process's lock vanishes with its file locks.

Reads (:func:`read_transaction`) take no lock: PostgreSQL at REPEATABLE READ, SQLite with a
deferred ``BEGIN``, so several statements see one consistent snapshot.

Every writer declares the schema version its release writes (:mod:`.guard`): on PostgreSQL in
the statement that takes the lock (``set_config``, no extra round trip), on SQLite when a
connection opens (an attached in-memory database named for it). A ledger upgraded past that
version refuses the writer's first row, and the whole transaction rolls back.
"""

from __future__ import annotations

import sqlite3
import time
import zlib
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote
from typing import Iterator

from sqlalchemy import bindparam, create_engine, event, func, select
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.pool import StaticPool

from airflow_hetero_gpu.ledger import guard
from airflow_hetero_gpu.ledger.migrations import LATEST
from airflow_hetero_gpu.ledger.switching import prompt_switching
from airflow_hetero_gpu.ledger.url import is_memory

# One 64-bit advisory lock key for the whole ledger (schema changes and every write).
LOCK_KEY = zlib.crc32(b"airflow_hetero_gpu.ledger") | (0x4847 << 32)  # "HG" in the high bits
SQLITE_BUSY_TIMEOUT_S = 60.0
_BEGIN_OPTION = "hetero_gpu_sqlite_begin"


def make_engine(url: URL, *, create: bool = True, writes_schema: int = LATEST) -> Engine:
    """An engine for ``url`` set up for the ledger (SQLite: WAL, busy timeout, explicit BEGIN).

    ``create=False``: a SQLite file is opened read-write but never created (nor its directory).
    ``writes_schema``: the schema version its writes declare (this release's)."""
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, create=create, writes_schema=writes_schema)
    engine = create_engine(url, isolation_level="READ COMMITTED", pool_pre_ping=True, pool_size=2,
                           max_overflow=2)
    engine.hetero_gpu_writes_schema = int(writes_schema)  # declared by write_transaction
    return engine


def _sqlite_engine(url: URL, *, create: bool = True, writes_schema: int = LATEST) -> Engine:
    kwargs: dict = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
    if is_memory(url):
        kwargs["poolclass"] = StaticPool  # one shared in-memory database
        kwargs["connect_args"]["check_same_thread"] = False
    elif url.database and create:
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    elif url.database:
        # "mode=rw": the file must exist; sqlite3 would otherwise create an empty one
        uri = "file:" + quote(str(Path(url.database).absolute())) + "?mode=rw"
        kwargs["creator"] = lambda: sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_S,
                                                    check_same_thread=False)
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        # Let the "begin" event below issue BEGIN itself (pysqlite's implicit BEGIN is deferred);
        # the busy timeout comes from connect_args.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            if not is_memory(url):
                _set_wal(cur)
                cur.execute("PRAGMA synchronous = NORMAL")
            cur.execute("PRAGMA foreign_keys = ON")
            cur.execute(guard.attach_statement(writes_schema))  # this connection's writes declare their version
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get(_BEGIN_OPTION) == "IMMEDIATE":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")

    return engine


def _set_wal(cur: sqlite3.Cursor) -> None:
    """Switch the file to WAL, waiting out other processes that hold it meanwhile.

    The switch of a new file needs its exclusive lock, and SQLite answers "database is locked" at
    once rather than calling the busy handler; so several processes opening one new file at once
    retry here, for up to the busy timeout. Once the file is in WAL the pragma takes no lock.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    delay = 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction holding the ledger lock from its first statement to commit/rollback, its
    writes declaring the engine's schema version to the writers' guard (:mod:`.guard`; SQLite's
    connections declared it when they opened). From asking for the lock to the commit, this
    process's threads switch promptly (:mod:`.switching`): the write gets the interpreter back
    after each round trip even beside a busy thread."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            conn.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
            with prompt_switching(), conn.begin():
                yield conn
        else:
            declared = str(getattr(engine, "hetero_gpu_writes_schema", LATEST))
            with prompt_switching(), conn.begin():  # the lock and the writer's declaration, in one statement
                conn.execute(select(func.pg_advisory_xact_lock(bindparam("key", LOCK_KEY)),
                                    func.set_config(guard.SETTING, bindparam("writes", declared), True)))
                yield conn


@contextmanager
def read_transaction(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction over one consistent snapshot; takes no lock."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        with conn.begin():
            yield conn


def db_now(conn: Connection) -> datetime:
    """The time leases are measured by: the PostgreSQL server's clock (one clock for every client),
    or this machine's for SQLite (every client of a SQLite file runs on this machine)."""
    if conn.dialect.name == "postgresql":
        value = conn.execute(select(func.clock_timestamp())).scalar_one()
        return value.astimezone(timezone.utc)
    return datetime.now(timezone.utc)
