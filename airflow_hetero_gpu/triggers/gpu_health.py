"""``GpuHealthTrigger``: the health sensor's checks, deferred to the triggerer.

The trigger resolves Airflow connections in the event loop (``get_async_connection``) and hands
the resolved connections to the same hook and the same check
(:class:`~airflow_hetero_gpu.healthcheck.HealthWatch`) in a thread, so a deferred sensor
decides exactly as a poking one. The hook keeps each host's SSH connection open from one check
to the next (``keep_connections``): a watch of 1,000 hosts does not redo 1,000 key exchanges
every ``poke_interval``; they close when the trigger ends.

A large fleet is named by a hosts file and one connection (``hosts_file``, ``ssh_conn_id``; see
:mod:`~airflow_hetero_gpu.hooks.fleet_connection`): one lookup, whatever the fleet's size, and
the collection of ``hetero-gpu check --hosts-file`` (worker processes that keep their hosts'
connections). The connections and the worker processes are closed when the trigger ends, once
a check in flight is over.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from typing import Any, AsyncIterator, Mapping, Sequence

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_hetero_gpu.errors import ConfigError, HeteroGpuError
from airflow_hetero_gpu.healthcheck import HealthWatch, WatchSpec
from airflow_hetero_gpu.hooks.hetero_gpu import HeteroGpuHook, normalize_conn_ids
from airflow_hetero_gpu.hooks.ledger import is_deployment_ledger
from airflow_hetero_gpu.ledger import LedgerUrlError, MissingLedger
from airflow_hetero_gpu.ledger.base import require_existing


class GpuHealthTrigger(BaseTrigger):
    """Run :class:`HealthWatch` checks every ``poke_interval`` seconds in the triggerer.

    Fires one event: ``{"status": "success", "result": <the sensor's XCom value>}`` when the gate
    condition holds or the watch is over, or ``{"status": "error", "message": ...}`` (with
    ``"mistake": True`` for a setup mistake no retry can fix: a missing ledger, a malformed URL, a
    bad hosts file, a missing or unusable fleet connection).

    The hosts: ``ssh_conn_ids`` (one connection per host), or ``hosts_file`` with the one
    connection ``ssh_conn_id`` that reaches them all.
    """

    def __init__(self, *, ssh_conn_ids: Sequence[str] | Mapping[str, str] | None = None,
                 hosts_file: str | None = None, ssh_conn_id: str | None = None, spec: Mapping[str, Any],
                 poke_interval: float = 60.0, captures_dir: str | None = None,
                 config: str | Mapping[str, Any] | None = None, topology_conf: str | None = None,
                 ledger_url: str | None = None, ledger_conn_id: str | None = None,
                 hook_kwargs: Mapping[str, Any] | None = None, collector: str | None = None,
                 history: Mapping[str, float] | None = None) -> None:
        super().__init__()
        self.ssh_conn_ids = ssh_conn_ids
        self.hosts_file = hosts_file
        self.ssh_conn_id = ssh_conn_id
        self.spec = dict(spec)
        self.poke_interval = float(poke_interval)
        self.captures_dir = captures_dir
        self.config = config
        self.topology_conf = topology_conf
        self.ledger_url = ledger_url
        self.ledger_conn_id = ledger_conn_id
        self.hook_kwargs = dict(hook_kwargs or {})
        self.collector = collector
        self.history = dict(history or {})
        self._tmp: str | None = None
        self._stopping = False
        self._hook: Any = None  # the collector: a HeteroGpuHook or an SshCollector
        self._check_lock = threading.Lock()  # held while a check runs (in its thread)
        self._closer: threading.Thread | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        ids = self.ssh_conn_ids
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "ssh_conn_ids": ids if ids is None or isinstance(ids, (str, list))
            else (dict(ids) if isinstance(ids, Mapping) else list(ids)),
            "hosts_file": self.hosts_file, "ssh_conn_id": self.ssh_conn_id,
            "spec": self.spec, "poke_interval": self.poke_interval, "captures_dir": self.captures_dir,
            "config": self.config, "topology_conf": self.topology_conf, "ledger_url": self.ledger_url,
            "ledger_conn_id": self.ledger_conn_id, "hook_kwargs": self.hook_kwargs,
            "collector": self.collector, "history": self.history,
        })

    async def _connections(self, hosts: Mapping[str, str]) -> dict[str, Any]:
        from airflow.providers.common.compat.connection import get_async_connection  # noqa: PLC0415

        out: dict[str, Any] = {}
        for label, conn_id in hosts.items():
            try:
                out[label] = await get_async_connection(conn_id)
            except Exception as exc:  # noqa: BLE001 - a missing connection fails its host only
                out[label] = HeteroGpuError(" ".join(str(exc).split()) or type(exc).__name__)
        return out

    async def _fleet(self) -> Any:
        """The collector of ``hosts_file`` over the one connection ``ssh_conn_id`` (looked up
        here, in the event loop; the file is read in a thread)."""
        from airflow.providers.common.compat.connection import get_async_connection  # noqa: PLC0415

        from airflow_hetero_gpu.hooks.fleet_connection import fleet_collector  # noqa: PLC0415

        try:
            conn = await get_async_connection(self.ssh_conn_id)
        except Exception as exc:  # noqa: BLE001 - a missing connection: no retry helps
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise ConfigError(f"ssh_conn_id {self.ssh_conn_id!r}: the Airflow connection cannot be read: "
                              f"{reason}") from None
        return await asyncio.to_thread(
            fleet_collector, conn, self.ssh_conn_id, self.hosts_file, keep_connections=True,
            captures_dir=self.captures_dir, config=self.config, topology_conf=self.topology_conf,
            **self.hook_kwargs)

    async def _ledger_url(self) -> str | None:
        if not self.ledger_conn_id:
            return self.ledger_url
        from airflow.providers.common.compat.connection import get_async_connection  # noqa: PLC0415

        from airflow_hetero_gpu.hooks.ledger import url_from_connection  # noqa: PLC0415

        conn = await get_async_connection(self.ledger_conn_id)
        return await asyncio.to_thread(url_from_connection, conn)  # reads the extra: not in the loop

    def _captures_dir(self) -> str:
        if self.captures_dir:
            return self.captures_dir
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="hetero-gpu-trigger-")
        return self._tmp

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            spec = WatchSpec.from_json(self.spec)
            ledger_url = await self._ledger_url()
            if not is_deployment_ledger(self.ledger_conn_id, self.ledger_url):
                require_existing(ledger_url)  # a typo must not make a second ledger
            if self.hosts_file:
                hook = self._hook = await self._fleet()
            else:
                hosts = normalize_conn_ids(self.ssh_conn_ids)
                connections = await self._connections(hosts)
                hook = self._hook = HeteroGpuHook(hosts, connections=connections, captures_dir=self._captures_dir(),
                                                  config=self.config, topology_conf=self.topology_conf,
                                                  keep_connections=True, **self.hook_kwargs)
            runner = HealthWatch(spec, hook, ledger_url, log=self.log, collector=self.collector,
                                 history=self.history)
            while not self._stopping:
                await asyncio.to_thread(self._check, runner)
                if self._stopping:
                    break
                reason = runner.outcome()
                if reason is not None:
                    yield TriggerEvent({"status": "success", "result": runner.result(reason)})
                    return
                pause = runner.until_next(self.poke_interval)  # checks begin every poke_interval
                if pause == 0:
                    self.log.warning("health check %d took longer than poke_interval %gs; the next one starts now",
                                     runner.checks, self.poke_interval)
                await asyncio.sleep(pause)
        except (MissingLedger, LedgerUrlError, ConfigError) as exc:  # a mistake: the sensor fails without retries
            yield TriggerEvent({"status": "error", "message": str(exc), "mistake": True})
        except Exception as exc:  # noqa: BLE001 - the sensor fails with this message
            self.log.exception("GPU health trigger failed")
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
        finally:
            self._close_connections()

    def _check(self, runner: HealthWatch) -> None:
        """One check, in a thread; none starts once the trigger is stopping."""
        with self._check_lock:
            if not self._stopping:
                runner.check()

    def _close_connections(self) -> None:
        """Close the collector's connections (and worker processes) in a thread of their own,
        once a check in flight (whose await was cancelled) is over; never in the event loop."""
        hook, self._hook = self._hook, None
        if hook is None:
            return

        def close() -> None:
            with self._check_lock:
                hook.close()

        self._closer = threading.Thread(target=close, name="hetero-gpu-health-close", daemon=True)
        self._closer.start()

    def _remove_tmp(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    async def cleanup(self) -> None:
        """Every exit: the connections and worker processes are closed (after a check in
        flight), the temporary capture directory goes."""
        self._stopping = True
        self._close_connections()
        if self._closer is not None:
            await asyncio.to_thread(self._closer.join)
        self._remove_tmp()

    async def on_kill(self) -> None:
        """The user killed the task: start no further check; a check in flight finishes its
        ledger transaction (it is atomic) and nothing follows it."""
        self._stopping = True
        self._remove_tmp()
