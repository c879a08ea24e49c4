"""The writers' guard: a ledger refuses every write of a process of an older release.

A process that opened the ledger before a newer release upgraded it (a training on a worker not
restarted yet) would otherwise keep writing by its old rules: reserve on a drained host, admit
past a quota, leave records open. Checking the version in the code cannot stop it — the old code
has no such check — so the database refuses it, by a mechanism every release honours: a write is
an ``INSERT``, ``UPDATE`` or ``DELETE`` on a ledger table, and a trigger on every table fails the
statement (and with it the whole write transaction: nothing of it is written) unless the writing
connection declares a release that writes this schema version or a newer one.

* **PostgreSQL**: a writer declares ``hetero_gpu.writes_schema = N`` for its transaction with
  ``set_config(..., true)`` in the statement that takes the ledger lock (no extra round trip,
  :func:`airflow_hetero_gpu.ledger.db.write_transaction`). Each table has one statement-level
  trigger calling ``hetero_gpu_writer_guard()``, which raises unless N is at least the version
  it was installed for.
* **SQLite**: a writer's connections attach an empty in-memory database named
  ``hetero_gpu_writes_vN`` when they open (:func:`airflow_hetero_gpu.ledger.db.make_engine`).
  Each table has ``BEFORE INSERT / UPDATE / DELETE`` triggers that ``RAISE(ABORT, …)`` unless
  such a name with N at least the guard's version is attached (``pragma_database_list``; a few
  microseconds a row).

The guard is installed by every upgrade to schema version 11 or later, for the version upgraded
to (:func:`install`; :func:`drop` first, so the steps themselves run unguarded). An older
process's write then fails with the guard's message, one line, through that process's own error
handling; a process of this release refused by a newer ledger gets :func:`refusal`'s line naming
both versions.
"""

from __future__ import annotations

import re

from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import ExecutableDDLElement

from airflow_hetero_gpu.ledger.schema import metadata

#: The first schema version whose ledgers refuse older writers.
GUARD_SINCE = 11
#: PostgreSQL: the setting a writer declares for its transaction.
SETTING = "hetero_gpu.writes_schema"
#: SQLite: the in-memory database a writer's connection attaches, followed by its version.
ATTACH_PREFIX = "hetero_gpu_writes_v"
FUNCTION = "hetero_gpu_writer_guard"
_PG_TRIGGER = "hetero_gpu_writer_guard"
_SQLITE_OPS = ("insert", "update", "delete")
#: What every refusal says (and what :func:`refusal` recognises).
REFUSES = "refuses writes from a process of an older airflow-hetero-gpu"
_VERSION = re.compile(r"schema version (\d+) " + re.escape(REFUSES))


def attach_statement(version: int) -> str:
    """The statement a SQLite writer's connection runs when it opens: its declaration."""
    return f"ATTACH DATABASE ':memory:' AS {ATTACH_PREFIX}{int(version)}"


def message(version: int, writer: str) -> str:
    return (f"ledger schema version {int(version)} {REFUSES} (one that writes schema {writer}; it opened the "
            f"ledger before it was upgraded): nothing was written; restart it with the new package")


def refusal(err: BaseException, writes: int) -> str | None:
    """The one line for a write of this process refused by a newer ledger's guard, or None."""
    found = _VERSION.search(str(getattr(err, "orig", None) or err).strip().split("\n")[0])
    if found is None:
        return None
    return (f"the ledger has schema version {found.group(1)}, newer than this process of airflow-hetero-gpu "
            f"writes ({writes}): it was upgraded while this process ran; nothing was written; restart it "
            f"with the new package")


def _tables(conn: Connection) -> list[str]:
    present = set(inspect(conn).get_table_names())
    return [t.name for t in metadata.sorted_tables if t.name in present]


def install(conn: Connection, version: int) -> None:
    """Guard every ledger table of the database for ``version`` (inside the upgrade's transaction)."""
    drop(conn)
    if conn.dialect.name == "postgresql":
        conn.execute(_PgFunction(version))
    for table in _tables(conn):
        if conn.dialect.name == "postgresql":
            conn.execute(_PgTrigger(table))
        else:
            for op in _SQLITE_OPS:
                conn.execute(_SqliteTrigger(table, op, version))


def drop(conn: Connection) -> None:
    """Remove the guard (an upgrade's steps run without it; :func:`install` puts it back)."""
    for table in _tables(conn):
        if conn.dialect.name == "postgresql":
            conn.execute(_DropGuard(table))
        else:
            for op in _SQLITE_OPS:
                conn.execute(_DropGuard(table, op))


def installed(conn: Connection) -> dict[str, int]:
    """{table: number of guard triggers on it}."""
    return {str(table): int(count) for table, count in conn.execute(_ListGuards())}


# --- the statements, compiled by the dialect (names quoted by its preparer) --------------------
class _PgFunction(ExecutableDDLElement):
    inherit_cache = False

    def __init__(self, version: int):
        self.version = int(version)


class _PgTrigger(ExecutableDDLElement):
    inherit_cache = False

    def __init__(self, table: str):
        self.table = table


class _SqliteTrigger(ExecutableDDLElement):
    inherit_cache = False

    def __init__(self, table: str, op: str, version: int):
        self.table, self.op, self.version = table, op, int(version)


class _DropGuard(ExecutableDDLElement):
    inherit_cache = False

    def __init__(self, table: str, op: str | None = None):
        self.table, self.op = table, op


class _ListGuards(ExecutableDDLElement):
    inherit_cache = False


def _sqlite_name(table: str, op: str) -> str:
    return f"hetero_gpu_guard_{table}_{op}"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@compiles(_PgFunction)
def _pg_function(element: _PgFunction, compiler, **kw) -> str:
    v = element.version
    older = _literal(f"{GUARD_SINCE - 1} or older")
    msg = _literal(message(v, "%"))
    return (f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $guard$\n"
            f"DECLARE writer text := coalesce(current_setting({_literal(SETTING)}, true), '');\n"
            f"BEGIN\n"
            f"  IF (CASE WHEN writer ~ '^[0-9]+$' THEN writer::int ELSE 0 END) < {v} THEN\n"
            f"    RAISE EXCEPTION {msg}, CASE WHEN writer = '' THEN {older} ELSE writer END;\n"
            f"  END IF;\n"
            f"  RETURN NULL;\n"
            f"END\n$guard$").replace("%", "%%" if compiler.dialect.paramstyle in ("format", "pyformat") else "%")


@compiles(_PgTrigger)
def _pg_trigger(element: _PgTrigger, compiler, **kw) -> str:
    table = compiler.preparer.quote(element.table)
    return (f"CREATE TRIGGER {_PG_TRIGGER} BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()")


@compiles(_SqliteTrigger)
def _sqlite_trigger(element: _SqliteTrigger, compiler, **kw) -> str:
    name = compiler.preparer.quote(_sqlite_name(element.table, element.op))
    table = compiler.preparer.quote(element.table)
    prefix = len(ATTACH_PREFIX)
    return (f"CREATE TRIGGER {name} BEFORE {element.op.upper()} ON {table} "
            f"WHEN NOT EXISTS (SELECT 1 FROM pragma_database_list WHERE name GLOB '{ATTACH_PREFIX}*' "
            f"AND CAST(substr(name, {prefix + 1}) AS INTEGER) >= {element.version}) "
            f"BEGIN SELECT RAISE(ABORT, {_literal(message(element.version, f'{GUARD_SINCE - 1} or older'))}); END")


@compiles(_DropGuard)
def _drop_guard(element: _DropGuard, compiler, **kw) -> str:
    if element.op is None:  # PostgreSQL: one trigger per table
        return f"DROP TRIGGER IF EXISTS {_PG_TRIGGER} ON {compiler.preparer.quote(element.table)}"
    return f"DROP TRIGGER IF EXISTS {compiler.preparer.quote(_sqlite_name(element.table, element.op))}"


@compiles(_ListGuards)
def _list_guards(element: _ListGuards, compiler, **kw) -> str:
    if compiler.dialect.name == "postgresql":
        return (f"SELECT c.relname, count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                f"WHERE t.tgname = '{_PG_TRIGGER}' GROUP BY c.relname")
    return "SELECT tbl_name, count(*) FROM sqlite_master WHERE type = 'trigger' AND name GLOB 'hetero_gpu_guard_*' " \
           "GROUP BY tbl_name"
