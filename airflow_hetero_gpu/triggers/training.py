"""TrainingRunTrigger: a durable training's run phase, watched from the triggerer (``deferrable=True``).

Once the job has started on every host (its handle stored in the task state store), the task
hands it to this trigger and frees its worker slot. The trigger reattaches to the job as a retry
does: it asks each host's run directory for the launch's state and the output offsets the last
watcher relayed, then follows the job with the same :class:`~airflow_hetero_gpu.launch.remote.RemoteJob`
a worker uses (keepalives, the heartbeat of each host's dead-man switch, the output relayed into
this task's log from those offsets) and takes the worker's looks at it
(:class:`~airflow_hetero_gpu.watching.look.JobWatch`: lease renewal, the preemption mark, a
replaced GPU, the exit statuses). It fires one event:

- ``exited``: every host exited 0; the task resumes to release and return the result;
- ``failed``: the job failed (or was stopped: its reservation lost, a GPU with no replacement, the
  ledger out of reach longer than the lease); the task resumes to clean up and fail;
- ``preempted`` / ``restart``: work that needs a worker (the preemption's stop, the relaunch on the
  new GPU set); the trigger lets go of the job first (a last heartbeat with its offsets), the task
  resumes, reattaches, acts, and defers again once the job runs;
- ``error``: the trigger could not watch (a host it cannot reach); the job runs on.

Everything it needs is in its keyword arguments, so a triggerer that restarts rebuilds it and the
new trigger reattaches the same way: no line of output is lost (lines relayed after the last
heartbeat, at most a keepalive interval of them, may appear twice). A task cleared or marked
failed while deferred stops the job and releases its GPUs (:meth:`TrainingRunTrigger.on_kill`).

The SSH and ledger work runs in threads (``asyncio.to_thread``); connections are resolved with the
async lookup. Lines are logged from the trigger's own context, so they land in the task's log.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator, Mapping, Sequence

from airflow.triggers.base import BaseTrigger, TriggerEvent

#: seconds ``on_kill`` gives the job between SIGTERM and SIGKILL (Airflow bounds ``on_kill``, 30 s
#: by default: the preemption grace does not fit there)
KILL_GRACE_S = 10.0


class TrainingRunTrigger(BaseTrigger):
    def __init__(self, *, job_id: str, launch: str, gpus: Sequence[Sequence[Any]],
                 ssh_conn_ids: Mapping[str, str], lease_seconds: float, unattended_timeout: float,
                 renew_every: float | None = None, preemption_signal: str = "TERM", preemption_grace: float = 300.0,
                 host_timeout: float = 60.0, on_no_replacement: str = "fail", max_age: float = 300.0,
                 cluster_config: str | Mapping[str, Any] | None = None, topology_conf: str | None = None,
                 ledger_conn_id: str | None = None, ledger_url: str | None = None) -> None:
        super().__init__()
        self.job_id = job_id
        self.launch = launch
        self.gpus = [list(k) for k in gpus]
        self.ssh_conn_ids = dict(ssh_conn_ids)
        self.lease_seconds = float(lease_seconds)
        self.unattended_timeout = float(unattended_timeout)
        self.renew_every = None if renew_every is None else float(renew_every)
        self.preemption_signal = preemption_signal
        self.preemption_grace = float(preemption_grace)
        self.host_timeout = float(host_timeout)
        self.on_no_replacement = on_no_replacement
        self.max_age = float(max_age)
        self.cluster_config = dict(cluster_config) if isinstance(cluster_config, Mapping) else cluster_config
        self.topology_conf = topology_conf
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self._watcher: Any = None
        self._letting_go: threading.Thread | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "job_id": self.job_id, "launch": self.launch, "gpus": self.gpus, "ssh_conn_ids": self.ssh_conn_ids,
            "lease_seconds": self.lease_seconds, "unattended_timeout": self.unattended_timeout,
            "renew_every": self.renew_every, "preemption_signal": self.preemption_signal,
            "preemption_grace": self.preemption_grace, "host_timeout": self.host_timeout,
            "on_no_replacement": self.on_no_replacement, "max_age": self.max_age,
            "cluster_config": self.cluster_config, "topology_conf": self.topology_conf,
            "ledger_conn_id": self.ledger_conn_id, "ledger_url": self.ledger_url,
        })

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(k[0] for k in self.gpus))  # rank order

    async def _ledger_url(self) -> str | None:
        if not self.ledger_conn_id:
            return self.ledger_url
        from airflow.providers.common.compat.connection import get_async_connection

        from airflow_hetero_gpu.hooks.ledger import url_from_connection

        conn = await get_async_connection(self.ledger_conn_id)
        return await asyncio.to_thread(url_from_connection, conn)

    async def _connections(self) -> dict[str, Any]:
        from airflow.providers.common.compat.connection import get_async_connection

        from airflow_hetero_gpu.errors import HeteroGpuError

        out: dict[str, Any] = {}
        for host in self.hosts:
            try:
                out[host] = await get_async_connection(self.ssh_conn_ids[host])
            except Exception as exc:  # noqa: BLE001 - the host's status check says it cannot be reached
                out[host] = HeteroGpuError(" ".join(str(exc).split()) or type(exc).__name__)
        return out

    def event(self, status: str, message: str = "", **more: Any) -> TriggerEvent:
        return TriggerEvent({"phase": "run", "status": status, "job_id": self.job_id, "launch": self.launch,
                             "message": message, **more})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_hetero_gpu.watching.watcher import RunWatcher

        try:
            url = await self._ledger_url()
            watcher = self._watcher = RunWatcher(self, url, await self._connections())
            found = await asyncio.to_thread(watcher.start)
            while found is None:
                found = await asyncio.to_thread(watcher.step)
            status, message, more = found
            yield self.event(status, message, **more)
        except Exception as err:  # noqa: BLE001 - the task fails with the message; the job runs on
            self.log.exception("job %s: watching it failed", self.job_id)
            if self._watcher is not None:
                await asyncio.to_thread(self._watcher.let_go)
            yield self.event("error", f"job {self.job_id}: watching it from the triggerer failed: "
                                      f"{type(err).__name__}: {err}")
        finally:
            self._let_go_soon()

    def _let_go_soon(self) -> None:
        """Cancelled (the triggerer stops, or the task was killed): let go of the job in a thread
        of its own (never in the event loop); :meth:`cleanup` waits for it."""
        watcher = self._watcher
        if watcher is None or self._letting_go is not None:
            return
        self._letting_go = threading.Thread(target=watcher.let_go, name=f"{self.job_id}:let-go", daemon=True)
        self._letting_go.start()

    async def cleanup(self) -> None:
        self._let_go_soon()
        if self._letting_go is not None:
            await asyncio.to_thread(self._letting_go.join, 60)

    async def on_kill(self) -> None:
        """The task was cleared or marked failed while deferred: stop the job on every host
        (SIGTERM, :data:`KILL_GRACE_S`, SIGKILL) and release its GPUs, as the task's own
        ``on_kill`` does."""
        watcher = self._watcher
        if watcher is None:
            from airflow_hetero_gpu.watching.watcher import RunWatcher

            watcher = RunWatcher(self, await self._ledger_url(), await self._connections())
        await asyncio.to_thread(watcher.stop, KILL_GRACE_S)

