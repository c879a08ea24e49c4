"""Where the training runs: a fresh inventory, the plan and the reservation, the wait for capacity.

The operator plans from the ledger's inventory (see :mod:`airflow_hetero_gpu.collect.freshness`):
it collects only the hosts whose stored inventory is missing or older than
``inventory_max_age``, so a task on a fleet of 1,000 hosts with a fresh inventory opens no SSH
session before it launches. Planning and claiming are one ledger transaction
(``Ledger.reserve``). The decision pushed to XCom says which inventory it used and how old it
was.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.operators.messages import pool_reasons

if TYPE_CHECKING:
    from airflow_hetero_gpu.collect.freshness import FreshInventory
    from airflow_hetero_gpu.core.cluster import Cluster
    from airflow_hetero_gpu.core.model import PlanRequest, PlanResult


class Placement:
    """The placement steps of one ``execute()`` of a :class:`HeteroTrainOperator`."""

    def __init__(self, op: Any, context: Any, job_id: str, request: PlanRequest):
        self.op = op
        self.context = context
        self.job_id = job_id
        self.request = request
        self.inventory: FreshInventory | None = None
        self.cluster: Cluster | None = None

    @property
    def log(self) -> Any:
        return self.op.log

    def _fail(self, message: str) -> AirflowFailException:
        return AirflowFailException(" ".join(message.split()))

    # --- the inventory ----------------------------------------------------------------------------
    def fresh_cluster(self) -> Cluster:
        """The cluster from the ledger's inventory, stale hosts collected first (and stored)."""
        from airflow_hetero_gpu.collect.freshness import CollectionConfigError, fresh_inventory
        from airflow_hetero_gpu.healthcheck.check import collector_name
        from airflow_hetero_gpu.ledger import LedgerError

        op = self.op
        ti = self.context["ti"]
        who = collector_name(f"HeteroTrainOperator {ti.dag_id}/{ti.run_id}/{ti.task_id}")
        try:
            hosts = list(op.hook.hosts)
            self.inventory = fresh_inventory(op.ledger, op.hook, hosts, max_age=op.max_age(), collector_name=who,
                                             logger=self.log)
            self.cluster = self.inventory.cluster(op.hook.cluster_config())
        except CollectionConfigError as err:  # undefined connections, rejected keys: retrying cannot help
            raise self._fail(str(err)) from None
        except LedgerError as err:  # the database is unreachable or busy: the task's retries apply
            raise AirflowException(str(err)) from None
        except (HeteroGpuError, ValueError) as err:  # no hosts, a malformed ssh_conn_ids, a bad cluster.yaml
            raise self._fail(str(err)) from None
        self.log.info("%s", self.inventory.describe())
        return self.cluster

    def current_cluster(self) -> Cluster:
        """The ledger's inventory as it is now, collecting nothing (the replacement path)."""
        from airflow_hetero_gpu.collect.freshness import FreshInventory

        stored = self.op.ledger.inventory(list(self.op.hook.hosts))
        return FreshInventory(stored, self.op.max_age()).cluster(self.op.hook.cluster_config())

    # --- the plan and the reservation ----------------------------------------------------------
    def reserve(self) -> PlanResult:
        from airflow_hetero_gpu.cli_output import render_plan
        from airflow_hetero_gpu.ledger import LedgerError, LedgerUrlError, ReservationConflict

        op = self.op
        cluster = self.fresh_cluster()
        try:
            # the lease surely lasts lease_seconds from here (time taken before the call)
            op._lease_from = time.monotonic()
            result = op.ledger.reserve(self.job_id, cluster, self.request, lease_seconds=op.lease_seconds,
                                       identity=op._identity(self.context), config=self._config(cluster))
        except (ReservationConflict, LedgerUrlError) as err:  # a mistake: retrying cannot help
            raise self._fail(str(err)) from None
        except LedgerError as err:
            raise AirflowException(str(err)) from None
        self.log.info("placement for job %s:\n%s", self.job_id, render_plan(result))
        if result.decision is not None:
            decision = result.to_json()
            decision["inventory"] = self.inventory.summary() if self.inventory else None
            self.context["ti"].xcom_push(key="decision", value=decision)
        return result

    def _config(self, cluster: Cluster):
        if not self.op.weights:
            return None
        try:
            return cluster.config.with_weights(dict(self.op.weights))
        except HeteroGpuError as err:
            raise self._fail(str(err)) from None

    # --- waiting for capacity ----------------------------------------------------------------
    def wait(self, result: PlanResult, waiting_since: float | None = None) -> PlanResult:
        """No pool fits now: fail with every pool's reason, or wait (in the triggerer when
        deferrable) and return the reservation once one does. ``capacity_timeout`` counts from
        the first time this task instance found no room (``waiting_since``, epoch seconds)."""
        op = self.op
        reasons = pool_reasons(result)
        if not op.wait_for_capacity:
            raise AirflowException(f"no pool can host {self.request.gpus} GPU(s) now: {reasons}")
        since = float(waiting_since) if waiting_since else time.time()
        deadline = since + float(op.capacity_timeout)
        if time.time() >= deadline:
            raise AirflowException(f"no pool could host the job within {float(op.capacity_timeout):g} s: {reasons}")
        if op.deferrable:
            from airflow_hetero_gpu.triggers.capacity import CapacityTrigger

            self.log.info("no pool can host the job now; deferring until one can (%.0f s left of %g s)",
                          deadline - time.time(), float(op.capacity_timeout))
            op.defer(
                trigger=CapacityTrigger(
                    hosts=list(op.hook.hosts), request=self.request.to_json(),
                    ledger_conn_id=op.ledger_conn_id,
                    ledger_url=None if op.ledger_conn_id else op.ledger_hook.get_url(),
                    config=op.cluster_config,
                    weights=dict(op.weights) if op.weights else None,
                    poll_interval=float(op.capacity_poll_interval), timeout=float(op.capacity_timeout),
                    started_at=since,
                ),
                method_name="execute_complete",
                timeout=timedelta(seconds=max(0.0, deadline - time.time()) + 60),
            )
        while time.time() < deadline:
            self.log.info("no pool can host the job now (%s); re-planning in %gs", reasons,
                          float(op.capacity_poll_interval))
            time.sleep(min(float(op.capacity_poll_interval), max(0.0, deadline - time.time())))
            result = self.reserve()
            if result.decision is not None:
                return result
            reasons = pool_reasons(result)
        raise AirflowException(f"no pool could host the job within {float(op.capacity_timeout):g} s: {reasons}")
