"""QueueTrigger: a deferred task's wait in the ledger's queue (docs/queue.md).

It plans nothing: every poll it renews the lease of its own queue entry (one row; once admitted,
the reservation's too) and reads where the job stands, and fires when the entry was admitted —
the ledger's admission pass, run by whichever write freed the GPUs, already wrote the
reservation. It also fires when the timeout passes (leaving the queue first) or when the entry
is gone (swept after its lease: the operator enqueues again). A task cleared or marked failed
while deferred leaves the queue at once (:meth:`QueueTrigger.on_kill`).

Nothing blocks the event loop: the ledger connection is resolved with the async lookup, and each
ledger call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_hetero_gpu.core.admission.reasons import WaitNotes


class QueueTrigger(BaseTrigger):
    def __init__(self, *, job_id: str, ledger_conn_id: str | None = None, ledger_url: str | None = None,
                 poll_interval: float = 30.0, timeout: float = 3600.0, started_at: float | None = None) -> None:
        super().__init__()
        self.job_id = job_id
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.started_at = time.time() if started_at is None else float(started_at)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"job_id": self.job_id, "ledger_conn_id": self.ledger_conn_id, "ledger_url": self.ledger_url,
             "poll_interval": self.poll_interval, "timeout": self.timeout, "started_at": self.started_at},
        )

    async def _url(self) -> str | None:
        if not self.ledger_conn_id:
            return self.ledger_url
        from airflow.providers.common.compat.connection import get_async_connection

        from airflow_hetero_gpu.hooks.ledger import url_from_connection

        return url_from_connection(await get_async_connection(self.ledger_conn_id))

    def check(self, url: str | None) -> tuple[str, str, str | None]:
        """Renew the entry and read it (blocking; run in a thread): (status, where it stands, standing)."""
        from airflow_hetero_gpu.ledger import Ledger, NoQueueEntry

        with Ledger.open_existing(url) as ledger:
            try:
                entry = ledger.renew_queue_entry(self.job_id)
            except NoQueueEntry as err:
                return "gone", str(err), None
            if entry.admitted:
                return "admitted", entry.where(), None
            if time.time() - self.started_at >= self.timeout:
                ledger.leave_queue(self.job_id)
                return "timeout", entry.where(), entry.standing
            return "waiting", entry.where(), entry.standing

    def leave(self, url: str | None) -> None:
        from airflow_hetero_gpu.ledger import Ledger

        with Ledger.open_existing(url) as ledger:
            ledger.leave_queue(self.job_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            url = await self._url()
            notes = WaitNotes()
            while True:
                status, where, standing = await asyncio.to_thread(self.check, url)
                if status != "waiting":
                    yield TriggerEvent({"status": status, "message": where, "started_at": self.started_at,
                                        "job_id": self.job_id})
                    return
                note = notes.note(standing, where)
                if note is not None:
                    getattr(self.log, note[0])("job %s: %s", self.job_id, note[1])
                await asyncio.sleep(self.poll_interval)
        except Exception as err:  # reported to the operator, which fails with the message
            yield TriggerEvent({"status": "error", "message": f"{type(err).__name__}: {err}",
                                "started_at": self.started_at, "job_id": self.job_id})

    async def on_kill(self) -> None:
        """The task was cleared or marked failed while deferred: leave the queue now."""
        await asyncio.to_thread(self.leave, await self._url())
