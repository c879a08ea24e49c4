"""Where the page's facts come from: the inventory, the ledger's state, history and queue.

Configuration, ``[hetero_gpu]`` in the Airflow configuration:

* ``captures_dir``: a capture directory to read the inventory from; unset (the default), the
  inventory is the ledger's (the collections the health watch and the operators store);
* ``ledger_conn_id`` or ``ledger_url``: the reservation ledger (default: the SQLite file
  ``$AIRFLOW_HOME/hetero_gpu_ledger.db``);
* ``refresh_seconds``: how often the page reloads itself (0: never).

Each reader returns what it read and a *source* dict (``status`` ``ok``, ``missing`` or
``error`` and a one-line ``message``) that the page shows; nothing here raises for a missing or
broken source, and nothing here writes (a missing SQLite ledger is not created by looking).
:func:`read_inputs` gathers one request's :class:`~.model.PageInputs`.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from airflow_hetero_gpu.plugins.model import PageInputs

log = logging.getLogger(__name__)

SECTION = "hetero_gpu"


@dataclass(frozen=True)
class PageSettings:
    captures_dir: str | None = None
    ledger_url: str | None = None
    ledger_conn_id: str | None = None
    refresh_seconds: int = 60
    history_interval: float = 300.0  # [hetero_gpu] history_interval: how far before a window to look
    history_retention: float = 7 * 86400.0  # [hetero_gpu] history_retention: how long the ledger keeps it

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
        from airflow_hetero_gpu.errors import ConfigError
        from airflow_hetero_gpu.settings import DEFAULT_HISTORY_INTERVAL_S, DEFAULT_HISTORY_RETENTION_S, history_settings

        try:
            history = history_settings()
        except ConfigError as err:
            log.warning("%s; using the defaults", err)
            history = {"history_interval": DEFAULT_HISTORY_INTERVAL_S, "history_retention": DEFAULT_HISTORY_RETENTION_S}
        return cls(opt("captures_dir"), opt("ledger_url"), opt("ledger_conn_id"), max(0, refresh),
                   max(1.0, history["history_interval"]), history["history_retention"])


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

    src.update(kind="ledger", path=None)
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
    src: dict[str, Any] = {"kind": "captures", "path": settings.captures_dir, "status": "ok", "message": None,
                           "collected_at": None}
    if not settings.captures_dir:
        return read_ledger_inventory(settings, src), src
    root = Path(settings.captures_dir)
    if not root.is_dir():
        src.update(status="missing", message=(
            f"No inventory yet: the capture directory {root} does not exist. The hetero_gpu_health_watch "
            "DAG collects it; it starts paused: unpause it (DAGs, hetero_gpu_health_watch, the toggle) and it "
            "collects within 10 minutes."))
        return None, src
    try:
        cluster, collected = _INVENTORY.load(settings.captures_dir)
    except Exception as err:  # noqa: BLE001 - the page reports any unreadable capture instead of failing
        log.warning("cluster page: cannot read captures in %s: %s", root, err)
        src.update(status="error", message=f"Cannot read the inventory: {err}")
        return None, src
    src["collected_at"] = collected.isoformat() if collected else None
    return cluster, src


def open_ledger(settings: PageSettings) -> tuple[Any, dict]:
    """The open ledger (or None) and its source dict."""
    from airflow_hetero_gpu.ledger.url import is_memory, mask, parse_url

    src: dict[str, Any] = {"url": None, "conn_id": settings.ledger_conn_id, "status": "ok", "message": None}
    try:
        parsed = parse_url(_ledger_url(settings))
        src["url"] = mask(parsed)
        if parsed.get_backend_name() == "sqlite" and not is_memory(parsed) and not Path(parsed.database).exists():
            src.update(status="missing", message=(
                f"No ledger yet at {parsed.database}: nothing has been reserved or evicted so far."))
            return None, src
        return _LEDGERS.get(parsed.render_as_string(hide_password=False)), src
    except Exception as err:  # noqa: BLE001 - a broken ledger is reported on the page
        log.warning("cluster page: cannot open the ledger: %s", err)
        src.update(status="error", message=f"Cannot read the ledger: {err}")
        return None, src


def _ledger_state(ledger: Any, src: dict[str, Any]) -> tuple[list, list]:
    try:
        return ledger.live_reservations(), ledger.evictions()
    except Exception as err:  # noqa: BLE001 - a broken ledger is reported on the page
        log.warning("cluster page: cannot read the ledger: %s", err)
        src.update(status="error", message=f"Cannot read the ledger: {err}")
        return [], []


def _drains(ledger: Any) -> list:
    try:
        return ledger.drains()
    except Exception as err:  # noqa: BLE001 - a ledger without the drains' table yet: none shown
        log.warning("cluster page: cannot read the drained hosts: %s", err)
        return []


def read_ledger(settings: PageSettings) -> tuple[list, list, dict]:
    """Live reservations, evictions and what the page says about the ledger."""
    ledger, src = open_ledger(settings)
    if ledger is None:
        return [], [], src
    reservations, evictions = _ledger_state(ledger, src)
    return reservations, evictions, src


def read_history(ledger: Any, since: datetime, until: datetime, hosts: list[str] | None = None, *,
                 lead: timedelta = timedelta(0)) -> tuple[list, list, dict]:
    """Host samples in [since - lead, until] (``lead``: the samples before the window say where its
    lines start) and GPU events in [since, until] (``hosts``: only theirs), and the source."""
    src: dict[str, Any] = {"status": "ok", "message": None}
    if ledger is None:
        return [], [], src
    try:
        samples = ledger.host_samples(since - lead, until, hosts=hosts)
        events = ledger.gpu_events(since, until, host=hosts[0] if hosts is not None and len(hosts) == 1 else None)
        return samples, events, src
    except Exception as err:  # noqa: BLE001 - the page reports it
        log.warning("cluster page: cannot read the history: %s", err)
        src.update(status="error", message=f"Cannot read the history: {err}")
        return [], [], src


def read_job_hosts(settings: PageSettings, job_id: str) -> list[str]:
    """The hosts every try of ``job_id`` ran on, as far as the ledger knows (empty when it cannot say)."""
    ledger, _src = open_ledger(settings)
    if ledger is None:
        return []
    try:
        return ledger.job_hosts(job_id)
    except Exception as err:  # noqa: BLE001 - a job id the ledger refuses has no hosts
        log.info("cluster page: no hosts for job %r: %s", job_id, err)
        return []


def read_queue(ledger: Any) -> tuple[list | None, dict]:
    """The jobs waiting in the ledger's queue, in order (None: no ledger to read), and the source.
    Admitted entries are left out: their reservations are in the reservations table."""
    if ledger is None:
        return None, {"status": "ok", "message": None}
    from airflow_hetero_gpu.core.admission import describe_gpus
    from airflow_hetero_gpu.plugins.model import QueueEntry

    try:
        records = ledger.queue()
    except Exception as err:  # noqa: BLE001 - shown on the page, never raised
        return None, {"status": "error", "message": f"queue: {err}"}
    out = []
    for r in records:
        if r.admitted:
            continue
        claim = None
        if r.claim:
            held = len(r.claim.get("held_by") or {})
            claim = describe_gpus(r.claimed_gpus) + (f" ({held} held)" if held else " (all free)")
        out.append(QueueEntry(r.job_id, r.position or len(records) + 1, r.priority, r.enqueued_at, r.reason,
                              dict(r.request), r.identity.to_json() if r.identity else None,
                              r.standing or "waiting", claim, r.team))
    return out, {"status": "ok", "message": None}


def read_teams(ledger: Any, since: datetime) -> tuple[dict | None, list, dict]:
    """The teams' standing (None: no ledger, or no team configured; ``configured``: the teams the
    teams file names) and the samples since ``since``
    (with the last one before it, so a line starts at the window's edge), and the source."""
    if ledger is None:
        return None, [], {"status": "ok", "message": None}
    try:
        standing = ledger.team_standing()
        samples = ledger.team_samples() if standing["rows"] else []
        configured = ledger.teams() if standing["rows"] else None
    except Exception as err:  # noqa: BLE001 - shown on the page, never raised
        return None, [], {"status": "error", "message": f"teams: {err}"}
    if not standing["rows"]:
        return None, [], {"status": "ok", "message": None}
    standing = {**standing, "configured": sorted(configured.teams) if configured is not None else [],
                # fleet team -> the Airflow teams drawing on its quota (the teams file's airflow_teams)
                "airflow_teams": configured.mapping() if configured is not None else {}}
    last_before: dict[str, dict] = {}
    recent = []
    for s in samples:
        if datetime.fromisoformat(s["at"]) < since:
            last_before[s["team"]] = s
        else:
            recent.append(s)
    return standing, [*last_before.values(), *recent], {"status": "ok", "message": None}


def read_preemptions(ledger: Any) -> list:
    """Preemptions in progress and the last day's (docs/preemption.md); none without a ledger."""
    if ledger is None:
        return []
    try:
        return ledger.preemptions()
    except Exception as err:  # noqa: BLE001 - shown as none, never raised
        log.info("cluster page: cannot read the preemptions: %s", err)
        return []


def visible_dags(reservations: list, user: Any, queue: list | None = None) -> set[str] | None:
    """The DAG ids among ``reservations`` and the ``queue``'s entries that ``user`` may read
    (fails closed: none)."""
    dag_ids = {r.identity.dag_id for r in reservations if r.identity is not None and r.identity.dag_id}
    dag_ids |= {q.identity["dag_id"] for q in queue or () if q.identity and q.identity.get("dag_id")}
    if not dag_ids:
        return None
    try:
        from airflow.api_fastapi.app import get_auth_manager

        return set(get_auth_manager().filter_authorized_dag_ids(dag_ids=dag_ids, user=user))
    except Exception:  # noqa: BLE001
        log.exception("cluster page: cannot check DAG access; hiding every reservation's DAG run")
        return set()


def read_inputs(user: Any, settings: PageSettings | None = None, *, history_hours: float | None = None,
                history_hosts: list[str] | None = None, now: datetime | None = None) -> PageInputs:
    """Everything one request shows. History only when asked (``history_hours``), for
    ``history_hosts`` only when given (a host page reads its own rows, not the fleet's)."""
    settings = settings or PageSettings.from_airflow_config()
    now = now or datetime.now(timezone.utc)
    cluster, cap_src = read_inventory(settings)
    ledger, led_src = open_ledger(settings)
    reservations: list = []
    evictions: list = []
    drains: list = []
    if ledger is not None:
        reservations, evictions = _ledger_state(ledger, led_src)
        if led_src["status"] == "error":
            ledger = None
        else:
            drains = _drains(ledger)
    samples: list = []
    events: list = []
    sources: dict[str, Any] = {"captures": cap_src, "ledger": led_src}
    if history_hours is not None:
        samples, events, sources["history"] = read_history(
            ledger, now - timedelta(hours=history_hours), now, history_hosts,
            lead=timedelta(seconds=2 * settings.history_interval))
    queue, sources["queue"] = read_queue(ledger)
    teams, team_samples, sources["teams"] = read_teams(ledger, now - timedelta(hours=24))
    preempted = read_preemptions(ledger)
    return PageInputs(cluster=cluster, reservations=reservations, evictions=evictions, queue=queue,
                      preemptions=preempted, samples=samples, events=events, sources=sources, teams=teams,
                      team_samples=team_samples, visible_dag_ids=visible_dags(reservations, user, queue), now=now,
                      drains=drains)
