"""The cluster page's FastAPI app, mounted by the api-server at ``/hetero-gpu``.

Read-only. Every route sits behind Airflow's own authentication and authorization (a plugin's
app gets none by itself): the app-wide dependency ``requires_access_view(AccessView.PLUGINS)``
refuses an anonymous request with 401 and a user without access with 403. Reservations of DAGs
the user may not read keep their job id and GPUs but lose their DAG run.

Where the facts come from, ``[hetero_gpu]`` in the Airflow configuration:

* ``captures_dir``: the capture directory the collection DAGs keep fresh (the inventory);
* ``ledger_conn_id`` or ``ledger_url``: the reservation ledger (default: the SQLite file
  ``$AIRFLOW_HOME/hetero_gpu_ledger.db``);
* ``refresh_seconds``: how often the page reloads itself (0: never).

A missing capture directory or ledger is said on the page, not raised. The routes are plain
(sync) functions: reading captures and the ledger blocks, so FastAPI runs them in its thread pool.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_view

from airflow_hetero_gpu.plugins import render
from airflow_hetero_gpu.plugins.cluster_page import URL_PREFIX

log = logging.getLogger(__name__)

SECTION = "hetero_gpu"
ACCESS_VIEW = AccessView.PLUGINS


@dataclass(frozen=True)
class PageSettings:
    captures_dir: str | None = None
    ledger_url: str | None = None
    ledger_conn_id: str | None = None
    refresh_seconds: int = 60

    @classmethod
    def from_airflow_config(cls) -> "PageSettings":
        from airflow.configuration import conf

        def opt(name: str) -> str | None:
            value = conf.get(SECTION, name, fallback=None)
            return value.strip() if isinstance(value, str) and value.strip() else None

        try:
            refresh = int(opt("refresh_seconds") or 60)
        except ValueError:
            log.warning("[%s] refresh_seconds is not an integer; using 60", SECTION)
            refresh = 60
        return cls(opt("captures_dir"), opt("ledger_url"), opt("ledger_conn_id"), max(0, refresh))


# --- the inventory, re-read only when a capture file changed ----------------------------------
def _signature(root: Path) -> tuple[tuple[str, int, int], ...]:
    sig = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            try:
                st = os.stat(p)
            except OSError:
                continue
            sig.append((os.path.relpath(p, root), st.st_mtime_ns, st.st_size))
    return tuple(sig)


class _InventoryCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: Any = None
        self._cluster: Any = None

    def load_ledger(self, ledger: Any):
        """(cluster, newest collection time) from the ledger's inventory; parsed again only after a
        collection was stored."""
        from airflow_hetero_gpu.collect.freshness import FreshInventory

        version = ledger.inventory_version()
        key = (ledger.display_url, version)
        with self._lock:
            if key != self._key:
                self._cluster = FreshInventory(ledger.inventory(), float("inf")).cluster()
                self._key = key
            return self._cluster, version[1]

    def load(self, captures_dir: str):
        """(cluster, newest capture time) for ``captures_dir``; parsed again only after a change."""
        from airflow_hetero_gpu.core.inventory import load_cluster

        root = Path(captures_dir)
        sig = _signature(root)
        newest = max((m for _, m, _ in sig), default=None)
        collected = datetime.fromtimestamp(newest / 1e9, timezone.utc) if newest else None
        key = (str(root.resolve()), sig)
        with self._lock:
            if key != self._key:
                self._cluster = load_cluster(root)
                self._key = key
            return self._cluster, collected


class _LedgerCache:
    """One open :class:`Ledger` per URL (its engine pools connections)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._url: str | None = None
        self._ledger: Any = None

    def get(self, url: str):
        from airflow_hetero_gpu.ledger import Ledger

        with self._lock:
            if self._ledger is None or self._url != url:
                if self._ledger is not None:
                    self._ledger.close()
                self._ledger = Ledger.open_existing(url)  # the page never creates or changes a ledger
                self._url = url
            return self._ledger


_INVENTORY = _InventoryCache()
_LEDGERS = _LedgerCache()


def _ledger_url(settings: PageSettings) -> str | None:
    if settings.ledger_conn_id:
        from airflow_hetero_gpu.hooks.ledger import LedgerHook

        return LedgerHook(ledger_conn_id=settings.ledger_conn_id).get_url()
    return settings.ledger_url


def read_ledger_inventory(settings: PageSettings, src: dict[str, Any]) -> Any:
    """The cluster from the ledger's inventory (None, with the reason in ``src``, when there is none)."""
    from airflow_hetero_gpu.ledger.url import parse_url

    src["path"] = None
    try:
        parsed = parse_url(_ledger_url(settings))
        if parsed.get_backend_name() == "sqlite" and parsed.database and not Path(parsed.database).exists():
            src.update(status="missing", message=(
                "No inventory yet: the ledger does not exist. Enable the hetero_gpu_health_watch DAG (it starts "
                "paused), or run `hetero-gpu check --ledger URL`."))
            return None
        ledger = _LEDGERS.get(parsed.render_as_string(hide_password=False))
        if not ledger.has_inventory():
            src.update(status="missing", message=(
                "No inventory in the ledger yet. Enable the hetero_gpu_health_watch DAG (it starts paused), "
                "or run `hetero-gpu check --ledger URL`."))
            return None
        cluster, collected = _INVENTORY.load_ledger(ledger)
    except Exception as err:  # noqa: BLE001 - the page reports an unreadable inventory instead of failing
        log.warning("cluster page: cannot read the ledger's inventory: %s", err)
        src.update(status="error", message=f"Cannot read the inventory: {err}")
        return None
    src["collected_at"] = collected.isoformat() if collected else None
    return cluster


def read_inventory(settings: PageSettings) -> tuple[Any, dict]:
    """The cluster (or None) and what the page says about where it came from: the capture
    directory when ``[hetero_gpu] captures_dir`` is set, else the ledger's inventory."""
    src: dict[str, Any] = {"path": settings.captures_dir, "status": "ok", "message": None, "collected_at": None}
    if not settings.captures_dir:
        return read_ledger_inventory(settings, src), src
    root = Path(settings.captures_dir)
    if not root.is_dir():
        src.update(status="missing", message=(
            f"No inventory yet: the capture directory {root} does not exist (has the collection DAG run?)."))
        return None, src
    try:
        cluster, collected = _INVENTORY.load(settings.captures_dir)
    except Exception as err:  # noqa: BLE001 - the page reports any unreadable capture instead of failing
        log.warning("cluster page: cannot read captures in %s: %s", root, err)
        src.update(status="error", message=f"Cannot read the inventory: {err}")
        return None, src
    src["collected_at"] = collected.isoformat() if collected else None
    return cluster, src


def read_ledger(settings: PageSettings) -> tuple[list, list, dict]:
    """Live reservations, evictions and what the page says about the ledger."""
    from airflow_hetero_gpu.ledger.url import is_memory, mask, parse_url

    src: dict[str, Any] = {"url": None, "conn_id": settings.ledger_conn_id, "status": "ok", "message": None}
    try:
        parsed = parse_url(_ledger_url(settings))
        src["url"] = mask(parsed)
        if parsed.get_backend_name() == "sqlite" and not is_memory(parsed) and not Path(parsed.database).exists():
            src.update(status="missing", message=(
                f"No ledger yet at {parsed.database}: nothing has been reserved or evicted so far."))
            return [], [], src
        ledger = _LEDGERS.get(parsed.render_as_string(hide_password=False))
        return ledger.live_reservations(), ledger.evictions(), src
    except Exception as err:  # noqa: BLE001 - a broken ledger is reported on the page
        log.warning("cluster page: cannot read the ledger: %s", err)
        src.update(status="error", message=f"Cannot read the ledger: {err}")
        return [], [], src


def visible_dags(reservations: list, user: Any) -> set[str] | None:
    """The DAG ids among ``reservations`` that ``user`` may read (fails closed: none)."""
    dag_ids = {r.identity.dag_id for r in reservations if r.identity is not None and r.identity.dag_id}
    if not dag_ids:
        return None
    try:
        from airflow.api_fastapi.app import get_auth_manager

        return set(get_auth_manager().filter_authorized_dag_ids(dag_ids=dag_ids, user=user))
    except Exception:  # noqa: BLE001
        log.exception("cluster page: cannot check DAG access; hiding every reservation's DAG run")
        return set()


def snapshot(user: Any, settings: PageSettings | None = None) -> tuple[dict, Any, dict]:
    """(facts, cluster or None, GPU statuses) for one request."""
    settings = settings or PageSettings.from_airflow_config()
    cluster, cap_src = read_inventory(settings)
    reservations, evictions, led_src = read_ledger(settings)
    facts = render.cluster_facts(
        cluster, reservations, evictions,
        sources={"captures": cap_src, "ledger": led_src},
        visible_dag_ids=visible_dags(reservations, user),
    )
    statuses = {}
    if cluster is not None:
        statuses = render.gpu_statuses(
            cluster, {g.key: r.job_id for r in reservations for g in r.gpus},
            {e.key: tuple(e.reasons) for e in evictions},
        )
    return facts, cluster, statuses


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _ui_base(request: Request) -> str:
    root = _root(request)
    return root[: -len(URL_PREFIX)] if root.endswith(URL_PREFIX) else ""


def create_app() -> FastAPI:
    app = FastAPI(
        title="GPU cluster",
        description="Read-only view of the heterogeneous GPU cluster: pools, GPUs, reservations, evictions.",
        # no unauthenticated extras: the app-wide dependency guards every route there is
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        dependencies=[Depends(requires_access_view(ACCESS_VIEW))],
    )

    @app.get("/", response_class=HTMLResponse)
    def page(request: Request, user: GetUserDep) -> HTMLResponse:
        settings = PageSettings.from_airflow_config()
        facts, cluster, statuses = snapshot(user, settings)
        svg = render.topology_svg(cluster.graph, statuses) if cluster is not None else None
        html = render.render_page(facts, svg, ui_base=_ui_base(request), refresh_seconds=settings.refresh_seconds,
                                  api_path=f"{_root(request)}/api/cluster")
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    @app.get("/api/cluster")
    def cluster_json(user: GetUserDep) -> JSONResponse:
        facts, _, _ = snapshot(user)
        return JSONResponse(facts, headers={"Cache-Control": "no-store"})

    @app.get("/topology.svg")
    def topology(user: GetUserDep) -> Response:
        facts, cluster, statuses = snapshot(user)
        if cluster is None:
            msg = facts["sources"]["captures"].get("message") or "no inventory"
            return Response(msg, status_code=404, media_type="text/plain")
        return Response(render.topology_svg(cluster.graph, statuses), media_type="image/svg+xml",
                        headers={"Cache-Control": "no-store"})

    return app
