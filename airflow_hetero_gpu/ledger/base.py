"""The ledger's database: opening it, its schema, its transactions and clock (what every repository uses).

Readers never create or change a database: ``Ledger.open_existing`` opens a ledger that exists
and has the current schema, and refuses anything else with one line saying what to do.
Writers (``Ledger.from_url``) create the database on first use and apply missing schema steps;
``create=False`` keeps a writer from creating one (``hetero-gpu release`` on a mistyped URL
must not make an empty ledger).
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from airflow_hetero_gpu.core.admission.defaults import DEFAULT_AGING_INTERVAL_S
from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.ledger import guard, migrations
from airflow_hetero_gpu.ledger.checks import first_line
from airflow_hetero_gpu.ledger.db import db_now, make_engine
from airflow_hetero_gpu.ledger.errors import LedgerError, LedgerUpgraded, MissingLedger
from airflow_hetero_gpu.ledger.url import is_memory, mask, parse_url

if TYPE_CHECKING:
    from airflow_hetero_gpu.core.admission import PreemptionRules
    from airflow_hetero_gpu.ledger.admission import ClusterCache, Warmed
    from airflow_hetero_gpu.ledger.unit_of_work import Rooms, UnitOfWork

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


class AdmissionSettings:
    """The admission pass's settings: the aging interval of the queue's order and the preemption
    rules. ``Ledger`` is one (set them on the ledger, or on a subclass)."""

    #: seconds of waiting worth one priority level (None: strict priority); see docs/queue.md
    queue_aging_interval_s: float | None = DEFAULT_AGING_INTERVAL_S
    _preemption: Any = ()  # not read yet

    @property
    def preemption(self) -> PreemptionRules | None:
        """The admission pass's preemption rules (None: off): ``[hetero_gpu] preemption``,
        ``preemption_min_runtime`` and ``preemption_delay`` (docs/preemption.md) unless set here."""
        if self._preemption == ():
            from airflow_hetero_gpu.settings import preemption_settings

            self._preemption = preemption_settings()
        return self._preemption

    @preemption.setter
    def preemption(self, rules: PreemptionRules | None) -> None:
        self._preemption = rules


class LedgerDatabase:
    """The database, its schema and its transactions; the repositories of
    :class:`~airflow_hetero_gpu.ledger.unit_of_work.Rooms` work through it.

    ``create``: make the database (SQLite file) and its tables when missing; ``migrate``: apply
    missing schema steps. ``clock`` replaces the lease clock (tests); ``before_commit(action,
    job_id)`` runs inside the reserve and replace transactions just before they commit (tests use
    it to die mid-way). ``settings``: the admission pass's (the defaults when None).
    """

    def __init__(self, url: str | None = None, *, create: bool = True, migrate: bool = True,
                 clock: Clock | None = None, before_commit: CommitHook | None = None,
                 settings: AdmissionSettings | None = None):
        self.url = parse_url(url)
        self.clock = clock
        self.before_commit = before_commit
        self.settings = settings if settings is not None else AdmissionSettings()
        self.rooms: Rooms | None = None  # the repositories, set by whoever composes them (``Ledger``)
        self.engine = None
        if not create:
            require_existing(self.url)
        self.engine = make_engine(self.url, create=create)
        self.create, self.migrate = create, migrate

    @property
    def display_url(self) -> str:
        return mask(self.url)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        """Close every pooled connection."""
        if self.engine is not None:
            self.engine.dispose()

    # --- the admission pass's cluster -----------------------------------------------------------
    @property
    def clusters(self) -> ClusterCache:
        """The process's cache of the stored inventory's cluster for this ledger."""
        from airflow_hetero_gpu.ledger.admission import cluster_cache

        key = self.url.render_as_string(hide_password=False)
        return cluster_cache(f"{key}#{id(self)}" if is_memory(self.url) else key)

    def warm(self) -> Warmed | None:
        """Parse the stored inventory for the next pass before taking the ledger lock (only when
        someone waits and the inventory changed since this process last parsed it); the cluster
        built (None: nobody waits, or no inventory), for the write's pass under the lock."""
        with self.read("read the inventory for the queue") as uow:
            return self.clusters.warm(uow.conn, uow.now)

    # --- transactions ---------------------------------------------------------------------------
    @contextmanager
    def errors(self, action: str) -> Iterator[None]:
        """A database error of ``action`` as one line (:class:`LedgerUpgraded` when a newer
        release's guard refused the write)."""
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
    def write(self, action: str, *, warm: bool = False) -> Iterator[UnitOfWork]:
        """One write: a unit of work holding the ledger lock until it commits
        (:mod:`~airflow_hetero_gpu.ledger.unit_of_work`). ``warm``: parse the stored inventory for
        its admission pass first, outside the lock; the pass then uses that cluster even when a
        collection changed the inventory before the lock was taken (``UnitOfWork.cluster``)."""
        warmed = self.warm() if warm else None
        self._settings_before_lock()
        with self.locked(action) as uow:
            uow.warmed = warmed
            yield uow

    def _settings_before_lock(self) -> None:
        """Read the pass's settings once per process before a write takes the lock, not in its
        pass under it. A setting that does not parse is left to the pass, which says so on the
        waiting entries and lets the write go on (docs/configuration.md)."""
        try:
            self.settings.preemption  # noqa: B018 - read once, then kept
        except HeteroGpuError:
            pass

    def locked(self, action: str) -> ContextManager[UnitOfWork]:
        """The write's unit of work proper: from taking the ledger lock to the commit
        (:func:`~airflow_hetero_gpu.ledger.unit_of_work.open_write`)."""
        from airflow_hetero_gpu.ledger.unit_of_work import open_write

        return open_write(self, action)

    def read(self, action: str) -> ContextManager[UnitOfWork]:
        """One read over a consistent snapshot, taking no lock
        (:func:`~airflow_hetero_gpu.ledger.unit_of_work.open_read`)."""
        from airflow_hetero_gpu.ledger.unit_of_work import open_read

        return open_read(self, action)

    def now_in(self, conn: Connection) -> datetime:
        """The transaction's time (the clock given, else the database's)."""
        return self.clock() if self.clock else db_now(conn)

    def now(self) -> datetime:
        """The ledger's clock (the PostgreSQL server's, or this machine's for SQLite)."""
        with self.read("read the clock") as uow:
            return uow.now

    def hook(self, action: str, job_id: str) -> None:
        """``before_commit(action, job_id)``, when given."""
        if self.before_commit is not None:
            self.before_commit(action, job_id)

    # --- schema -----------------------------------------------------------------------------------
    def schema_version(self) -> int:
        with self.read("read the schema version") as uow:
            return migrations.current_version(uow.conn)

    def ensure_schema(self) -> None:
        """Check the schema, creating or upgrading it when this database allows (``create``,
        ``migrate``); a one-line :class:`LedgerError` otherwise."""
        version = self.schema_version()
        if version == migrations.LATEST:
            return
        if version > migrations.LATEST:
            raise LedgerError(
                f"ledger {self.display_url} has schema version {version}, newer than this airflow-hetero-gpu "
                f"supports ({migrations.LATEST}); upgrade the package")
        if version == 0 and not self.create:
            raise LedgerError(f"{self.display_url} holds no ledger (no schema_version table): {FILL_HINT}")
        if not self.migrate:
            raise LedgerError(
                f"ledger {self.display_url} has schema version {version}, older than this airflow-hetero-gpu's "
                f"({migrations.LATEST}): upgrade it with `hetero-gpu ledger init URL` (any writer also does)")
        with self.write("create or upgrade the schema") as uow:
            version = migrations.current_version(uow.conn)  # again, now under the lock
            if version > migrations.LATEST:
                raise LedgerError(
                    f"ledger {self.display_url} has schema version {version}, newer than this airflow-hetero-gpu "
                    f"supports ({migrations.LATEST}); upgrade the package")
            migrations.upgrade(uow.conn, uow.now)
