"""CapacityTrigger: wait until a pool can host a job (the deferred wait of earlier releases).

The operator now waits in the ledger's queue (:mod:`airflow_hetero_gpu.triggers.queue`); a
deferred task of an earlier release still resumes through this trigger, then enqueues. It re-plans on an interval against the ledger's inventory of the job's fleet and its live
reservations and evictions, and fires when the plan places the job, or when the timeout passes.
It only plans and only reads the ledger (no SSH, no capture directory, nothing written): the
operator, resumed on a worker, refreshes stale hosts and reserves for real (if another job was
faster it waits again). Hosts whose stored inventory is old are planned on as last seen: the
resumed operator checks them again, so an idle watch never keeps a job waiting.

Nothing here blocks the event loop: the ledger connection is resolved with the async lookup,
and the planning (a database read) runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Mapping, Sequence

from airflow.triggers.base import BaseTrigger, TriggerEvent


class CapacityTrigger(BaseTrigger):
    def __init__(
        self,
        *,
        request: Mapping[str, Any],
        hosts: Sequence[str] | None = None,
        ledger_conn_id: str | None = None,
        ledger_url: str | None = None,
        config: str | Mapping[str, Any] | None = None,
        weights: Mapping[str, float] | None = None,
        poll_interval: float = 30.0,
        timeout: float = 3600.0,
        started_at: float | None = None,
        captures_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.hosts = list(hosts) if hosts is not None else None
        self.request = dict(request)
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.config = config
        self.weights = dict(weights) if weights else None
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.started_at = time.time() if started_at is None else float(started_at)
        # triggers serialized by a release that planned from a capture directory
        self.captures_dir = captures_dir

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "hosts": self.hosts, "request": self.request,
                "ledger_conn_id": self.ledger_conn_id, "ledger_url": self.ledger_url,
                "config": self.config, "weights": self.weights, "poll_interval": self.poll_interval,
                "timeout": self.timeout, "started_at": self.started_at, "captures_dir": self.captures_dir,
            },
        )

    async def _ledger_url(self) -> str | None:
        if not self.ledger_conn_id:
            return self.ledger_url
        from airflow.providers.common.compat.connection import get_async_connection

        from airflow_hetero_gpu.hooks.ledger import url_from_connection

        return url_from_connection(await get_async_connection(self.ledger_conn_id))

    def _cluster(self, ledger):
        from airflow_hetero_gpu.capture.directory import read_capture_dir
        from airflow_hetero_gpu.collect.freshness import FreshInventory
        from airflow_hetero_gpu.core.config import config_from_mapping, load_config
        from airflow_hetero_gpu.core.inventory import XIDS_FROM_LEDGER, cluster_from_captures

        own = None
        if isinstance(self.config, Mapping):
            own = config_from_mapping(self.config, source="cluster_config")
        elif self.config:
            own = load_config(self.config)
        if self.captures_dir and self.hosts is None:
            captures = read_capture_dir(self.captures_dir)
            # it plans with the ledger, whose evictions carry the Xid lines
            cluster = cluster_from_captures(captures, own or load_config(captures.config_path),
                                            xid_rule=XIDS_FROM_LEDGER)
        else:
            cluster = FreshInventory(ledger.inventory(self.hosts), float("inf")).cluster(own)
        return cluster

    def check(self, ledger_url: str | None) -> tuple[bool, str]:
        """Plan once (blocking; run in a thread): (placed, every pool's reason)."""
        from airflow_hetero_gpu.core.model import PlanRequest
        from airflow_hetero_gpu.ledger import Ledger

        gpu_type = self.request.get("gpu_type")
        request = PlanRequest(int(self.request["gpus"]), tuple(gpu_type) if isinstance(gpu_type, list) else gpu_type,
                              self.request.get("task_type"), self.request.get("gpu_memory_mib"))
        with Ledger.open_existing(ledger_url) as ledger:
            cluster = self._cluster(ledger)
            config = cluster.config.with_weights(self.weights) if self.weights else None
            result = ledger.plan(cluster, request, config=config)
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
