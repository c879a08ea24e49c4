"""LedgerHook: open the reservation ledger named by an Airflow connection or a URL.

The ledger lives in its own database, never in Airflow's metadata database. A connection
names it in one of three ways:

* ``conn_type`` ``postgres`` (or ``postgresql``): host, port, login, password and schema
  (the database name) form ``postgresql+psycopg://login:password@host:port/schema``;
* ``conn_type`` ``sqlite``: ``host`` is the database file path;
* any type with an extra ``{"url": "<SQLAlchemy URL>"}``, which wins over the fields.

With neither a connection nor a URL the hook takes ``[hetero_gpu] ledger_conn_id`` or
``ledger_url`` from Airflow's configuration, and without those the ledger is the SQLite file
``$AIRFLOW_HOME/hetero_gpu_ledger.db``.

Only the deployment's own ledger (the one those settings, or their default, name) is created on
first use. A SQLite file named by a task's own ``ledger_url`` or ``ledger_conn_id`` must exist
(``hetero-gpu ledger init URL``): a typo there would otherwise make a second ledger whose
reservations protect nothing. Every task logs the ledger it uses, password masked.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseHook

from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.ledger import Ledger, LedgerError
from airflow_hetero_gpu.ledger.base import require_existing
from airflow_hetero_gpu.ledger.url import default_path, mask, parse_url

log = logging.getLogger(__name__)

#: Executors whose tasks run on more than one machine: they cannot share a SQLite file.
DISTRIBUTED_EXECUTORS = ("CeleryExecutor", "KubernetesExecutor", "CeleryKubernetesExecutor", "EdgeExecutor")


class UnshareableLedger(LedgerError):
    """The ledger is a SQLite file but the deployment's tasks run on several machines."""


def distributed_executor() -> str | None:
    """The configured executor when its tasks may run on several machines, else None."""
    try:
        from airflow.configuration import conf

        executor = conf.get("core", "executor", fallback="") or ""
    except Exception:  # noqa: BLE001 - no Airflow configuration: not a deployment
        return None
    for name in DISTRIBUTED_EXECUTORS:
        if name in executor:
            return executor.strip()
    return None


def check_shareable(url: str | None) -> None:
    """Refuse the default SQLite ledger under a distributed executor (each machine would keep a
    ledger of its own and hand out the same GPUs twice); warn about a SQLite URL given on purpose
    (it is right only when every task runs on one machine)."""
    executor = distributed_executor()
    if executor is None:
        return
    if url is None:
        raise UnshareableLedger(
            f"the ledger is the default SQLite file {default_path()}, which tasks on other machines cannot share, "
            f"and [core] executor is {executor}: set [hetero_gpu] ledger_conn_id or ledger_url to a PostgreSQL "
            "database every worker reaches (docs/operations.md)")
    if url.strip().startswith("sqlite") or "://" not in url:
        log.warning("the ledger %s is a SQLite file and [core] executor is %s: this is only safe when every "
                    "task that reserves GPUs runs on this one machine; use PostgreSQL otherwise", url, executor)


def is_deployment_ledger(conn_id: str | None, url: str | None) -> bool:
    """Whether a ledger named by ``conn_id`` / ``url`` is the deployment's own: named by neither
    (the ``[hetero_gpu]`` settings, else the default file), or by the settings' own values."""
    from airflow_hetero_gpu.settings import setting

    if not conn_id and not url:
        return True
    return (conn_id or None, url or None) == (setting("ledger_conn_id") or None, setting("ledger_url") or None)


def url_from_connection(conn: Any) -> str:
    """The SQLAlchemy URL a connection stands for (see the module docstring)."""
    extra = conn.extra_dejson or {}
    if extra.get("url"):
        return str(extra["url"])
    kind = (conn.conn_type or "").lower()
    if kind in ("postgres", "postgresql"):
        if not conn.host:
            raise HeteroGpuError(f"ledger connection {conn.conn_id!r}: no host")
        auth = ""
        if conn.login:
            auth = quote(conn.login, safe="")
            if conn.password:
                auth += ":" + quote(conn.password, safe="")
            auth += "@"
        port = f":{conn.port}" if conn.port else ""
        return f"postgresql+psycopg://{auth}{conn.host}{port}/{quote(conn.schema or 'postgres', safe='')}"
    if kind == "sqlite":
        if not conn.host:
            raise HeteroGpuError(f"ledger connection {conn.conn_id!r}: no database file in host")
        return f"sqlite:///{conn.host}"
    raise HeteroGpuError(
        f"ledger connection {conn.conn_id!r}: conn_type {conn.conn_type!r} is neither postgres nor sqlite "
        "and has no extra 'url'"
    )


class LedgerHook(BaseHook):
    """Resolve the ledger at run time (never at DAG parse time) and open it."""

    conn_name_attr = "ledger_conn_id"
    hook_name = "Hetero GPU ledger"

    def __init__(self, ledger_conn_id: str | None = None, ledger_url: str | None = None) -> None:
        super().__init__()
        if ledger_conn_id and ledger_url:
            raise HeteroGpuError("give ledger_conn_id or ledger_url, not both")
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url

    def _named(self) -> tuple[str | None, str | None]:
        """(connection id, URL) naming the ledger: the arguments, else the ``[hetero_gpu]`` settings."""
        from airflow_hetero_gpu.settings import setting

        conn_id, url = self.ledger_conn_id, self.ledger_url
        if not conn_id and not url:
            conn_id, url = setting("ledger_conn_id"), setting("ledger_url")
        return conn_id, url

    def conn_id(self) -> str | None:
        """The Airflow connection that names the ledger (argument or setting), or None when a
        URL does. Hand this, not the URL, to another component (a trigger): it resolves the
        connection itself, and the password stays in the secrets backend."""
        return self._named()[0] or None

    def get_url(self) -> str | None:
        conn_id, url = self._named()
        if conn_id:
            return url_from_connection(self.get_connection(conn_id))
        return url

    def checked_url(self) -> str | None:
        """:meth:`get_url`, after refusing a missing SQLite file that is not the deployment's
        ledger (:class:`~airflow_hetero_gpu.ledger.MissingLedger`, the command line's words);
        logs the ledger used, password masked."""
        url = self.get_url()
        if not is_deployment_ledger(self.ledger_conn_id, self.ledger_url):
            require_existing(url)
        self.log.info("ledger: %s", mask(parse_url(url)))
        return url

    def get_ledger(self, *, readonly: bool = False) -> Ledger:
        """Open the ledger: for writing (upgraded as needed; created only when it is the
        deployment's own) or, ``readonly``, an existing one only. Under a distributed executor the
        default SQLite file is refused."""
        url = self.checked_url()
        check_shareable(url)
        return Ledger.open_existing(url) if readonly else Ledger.from_url(url)
