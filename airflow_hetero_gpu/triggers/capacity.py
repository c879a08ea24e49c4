"""CapacityTrigger: wait in the triggerer until a pool can host a job (deferrable operator).

It re-plans on an interval against the last collection of the cluster (the capture directory
the operator wrote) and the ledger's live reservations and evictions, and fires when the plan
places the job, or when the timeout passes. It only plans: the operator, resumed on a worker,
collects afresh and reserves for real (if another job was faster it waits again).

Nothing here blocks the event loop: the ledger connection is resolved with the async lookup,
and the planning (file reads, a database query) runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Mapping

from airflow.triggers.base import BaseTrigger, TriggerEvent


class CapacityTrigger(BaseTrigger):
    def __init__(
        self,
        *,
        captures_dir: str,
        request: Mapping[str, Any],
        ledger_conn_id: str | None = None,
        ledger_url: str | None = None,
        config: str | Mapping[str, Any] | None = None,
        weights: Mapping[str, float] | None = None,
        poll_interval: float = 30.0,
        timeout: float = 3600.0,
        started_at: float | None = None,
    ) -> None:
        super().__init__()
        self.captures_dir = captures_dir
        self.request = dict(request)
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.config = config
        self.weights = dict(weights) if weights else None
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.started_at = time.time() if started_at is None else float(started_at)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "captures_dir": self.captures_dir, "request": self.request,
                "ledger_conn_id": self.ledger_conn_id, "ledger_url": self.ledger_url,
                "config": self.config, "weights": self.weights, "poll_interval": self.poll_interval,
                "timeout": self.timeout, "started_at": self.started_at,
            },
        )

    async def _ledger_url(self) -> str | None:
        if not self.ledger_conn_id:
            return self.ledger_url
        from airflow.providers.common.compat.connection import get_async_connection

        from airflow_hetero_gpu.hooks.ledger import url_from_connection

        return url_from_connection(await get_async_connection(self.ledger_conn_id))

    def check(self, ledger_url: str | None) -> tuple[bool, str]:
        """Plan once (blocking; run in a thread): (placed, every pool's reason)."""
        from airflow_hetero_gpu.core.config import config_from_mapping, load_config
        from airflow_hetero_gpu.core.inventory import XIDS_FROM_LEDGER, cluster_from_captures
        from airflow_hetero_gpu.capture.directory import read_capture_dir
        from airflow_hetero_gpu.core.model import PlanRequest
        from airflow_hetero_gpu.ledger import Ledger

        captures = read_capture_dir(self.captures_dir)
        if isinstance(self.config, Mapping):
            config = config_from_mapping(self.config, source="cluster_config")
        else:
            config = load_config(self.config or captures.config_path)
        cluster = cluster_from_captures(captures, config.with_weights(self.weights), xid_rule=XIDS_FROM_LEDGER)
        gpu_type = self.request.get("gpu_type")
        request = PlanRequest(int(self.request["gpus"]), tuple(gpu_type) if isinstance(gpu_type, list) else gpu_type,
                              self.request.get("task_type"), self.request.get("gpu_memory_mib"))
        with Ledger.from_url(ledger_url) as ledger:
            result = ledger.plan(cluster, request)
        reasons = "; ".join(f"{p.pool}: {p.reason}" for p in result.pools if p.reason)
        return result.decision is not None, reasons

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            url = await self._ledger_url()
            while True:
                placed, reasons = await asyncio.to_thread(self.check, url)
                if placed:
                    yield TriggerEvent({"status": "capacity", "started_at": self.started_at})
                    return
                if time.time() - self.started_at >= self.timeout:
                    yield TriggerEvent({"status": "timeout", "message": reasons, "started_at": self.started_at})
                    return
                self.log.info("no pool can host the job yet (%s); next check in %gs", reasons, self.poll_interval)
                await asyncio.sleep(self.poll_interval)
        except Exception as err:  # reported to the operator, which fails with the message
            yield TriggerEvent({"status": "error", "message": f"{type(err).__name__}: {err}"})
