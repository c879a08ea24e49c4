"""Where the training runs: a fresh inventory, the plan and the reservation, the wait for capacity.

The operator plans from the ledger's inventory (see :mod:`airflow_hetero_gpu.collect.freshness`):
it collects only the hosts whose stored inventory is missing or older than
``inventory_max_age``, so a task on a fleet of 1,000 hosts with a fresh inventory opens no SSH
session before it launches. Planning and claiming are one ledger transaction
(``Ledger.reserve``), or, with ``wait_for_capacity``, an enqueue whose admission pass writes the
reservation (:mod:`~airflow_hetero_gpu.operators.queue_wait`). The decision pushed to XCom says
which inventory it used and how old it was.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.operators.messages import pool_reasons
from airflow_hetero_gpu.operators.team import resolve_team

if TYPE_CHECKING:
    from airflow_hetero_gpu.collect.freshness import FreshInventory
    from airflow_hetero_gpu.core.cluster import Cluster
    from airflow_hetero_gpu.core.model import PlanResult
    from airflow_hetero_gpu.operators.runtime import Runtime
    from airflow_hetero_gpu.operators.specs import Specs


def task_identity(context: Any) -> dict[str, Any]:
    """The task instance a reservation or queue entry belongs to (the ledger keeps it)."""
    ti = context["ti"]
    map_index = getattr(ti, "map_index", None)
    return {"dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id, "try_number": int(ti.try_number),
            "map_index": None if map_index is None or map_index < 0 else int(map_index)}


class Placement:
    """The placement steps of one ``execute()`` of a :class:`HeteroTrainOperator`: its ``specs``
    (the request, the fleet, the lease), its ``runtime`` (the ledger, the hook, the log)."""

    def __init__(self, specs: Specs, runtime: Runtime, context: Any, job_id: str):
        self.specs = specs
        self.runtime = runtime
        self.context = context
        self.job_id = job_id
        self.request = specs.request.plan
        self.inventory: FreshInventory | None = None
        self.cluster: Cluster | None = None
        # the task's Airflow team: in multi-team mode a team= naming another fails here, before
        # anything is collected, queued or reserved (operators/team.py)
        self.airflow_team, self._team_named = resolve_team(specs.request.team, context)
        self._team: str | None = None

    @property
    def log(self) -> Any:
        return self.runtime.log

    def _fail(self, message: str) -> AirflowFailException:
        return AirflowFailException(" ".join(message.split()))

    # --- the inventory ----------------------------------------------------------------------------
    def fresh_cluster(self) -> Cluster:
        """The cluster from the ledger's inventory, stale hosts collected first (and stored)."""
        from airflow_hetero_gpu.collect.freshness import CollectionConfigError, NothingCollected, fresh_inventory
        from airflow_hetero_gpu.healthcheck.check import collector_name
        from airflow_hetero_gpu.ledger import LedgerError

        rt = self.runtime
        ti = self.context["ti"]
        who = collector_name(f"HeteroTrainOperator {ti.dag_id}/{ti.run_id}/{ti.task_id}")
        try:
            hosts = list(rt.hook.hosts)
            self.inventory = fresh_inventory(rt.ledger, rt.hook, hosts, max_age=self.specs.fleet.inventory_max_age,
                                             collector_name=who, logger=self.log)
            self.cluster = self.inventory.cluster(rt.hook.cluster_config())
        except CollectionConfigError as err:  # undefined connections, unknown or rejected keys: never retried
            raise self._fail(str(err)) from None
        except (LedgerError, NothingCollected) as err:  # unreachable database or hosts: the task's retries apply
            raise AirflowException(str(err)) from None
        except (HeteroGpuError, ValueError) as err:  # no hosts, a malformed ssh_conn_ids, a bad cluster.yaml
            raise self._fail(str(err)) from None
        self.log.info("%s", self.inventory.describe())
        return self.cluster

    def current_cluster(self) -> Cluster:
        """The ledger's inventory as it is now, collecting nothing (the replacement path)."""
        from airflow_hetero_gpu.collect.freshness import FreshInventory

        rt = self.runtime
        stored = rt.ledger.inventory(list(rt.hook.hosts))
        return FreshInventory(stored, self.specs.fleet.inventory_max_age).cluster(rt.hook.cluster_config())

    # --- the plan and the reservation ----------------------------------------------------------
    def reserve(self) -> PlanResult:
        from airflow_hetero_gpu.text import render_plan
        from airflow_hetero_gpu.core.model import PlanResult
        from airflow_hetero_gpu.core.request_check import never_satisfiable
        from airflow_hetero_gpu.ledger import LedgerError, LedgerUrlError, ReservationConflict
        from airflow_hetero_gpu.ledger.errors import QuotaRefused

        rt, request = self.runtime, self.specs.request
        cluster = self.fresh_cluster()
        mistake = never_satisfiable(cluster, self.request)
        if mistake:  # no wait and no retry can bring a card or task type the fleet does not have
            raise self._fail(mistake)
        try:
            # the lease surely lasts lease_seconds from here (time taken before the call)
            rt.lease_from = time.monotonic()
            result = rt.ledger.reserve(self.job_id, cluster, self.request,
                                       lease_seconds=self.specs.lifecycle.lease_seconds,
                                       identity=task_identity(self.context), config=self._config(cluster),
                                       team=self.team, priority=request.priority, preemptible=request.preemptible)
        except QuotaRefused as err:  # no room in the team's quota now: the queue waits, or the task fails
            self.log.info("job %s: %s", self.job_id, err)
            self.quota_refused = str(err)
            return PlanResult(self.request, None, [])
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

    @property
    def team(self) -> str:
        """The job's fleet team (docs/teams.md): the task's Airflow team (:func:`resolve_team`:
        its bundle's in multi-team mode, else the ``team`` argument, ``[hetero_gpu] default_team``,
        ``default``) translated by the teams file's ``airflow_teams``; a malformed name fails the task."""
        from airflow_hetero_gpu.core.admission.quota import valid_team_name

        if self._team is not None:
            return self._team
        team = self.airflow_team
        if not valid_team_name(team):
            raise self._fail(f"team: expected a team name (letters, digits, '_', '.', '@', '-'), got {team!r}")
        teams = self._teams()
        fleet = teams.fleet_team(team) if teams else team
        if fleet != team:
            self.log.info("job %s: Airflow team %s draws on the quota of team %s", self.job_id, team, fleet)
        if self._team_named:  # once per task: a typo'd team runs, warned
            from airflow_hetero_gpu.core.admission.teams import unknown_team

            line = unknown_team(fleet, teams.teams if teams else ())
            if line:
                self.log.warning("job %s: %s", self.job_id, line)
        self._team = fleet
        return fleet

    def _teams(self):
        """The applied teams file (None: none); the ledger out of reach: the task's retries apply
        (its mapping decides whose quota the job counts against)."""
        from airflow_hetero_gpu.ledger import LedgerError

        try:
            return self.runtime.ledger.teams()
        except LedgerError as err:
            raise AirflowException(str(err)) from None

    def unknown_team(self, team: str) -> str | None:
        """The warning for a team the applied teams file does not name (None: named, or no teams)."""
        from airflow_hetero_gpu.core.admission.teams import unknown_team
        from airflow_hetero_gpu.ledger import LedgerError

        try:
            teams = self.runtime.ledger.teams()
        except LedgerError:  # the reservation that follows says what is wrong with the ledger
            return None
        return unknown_team(team, teams.teams if teams else ())

    def _config(self, cluster: Cluster):
        weights = self.specs.request.weights
        if not weights:
            return None
        try:
            return cluster.config.with_weights(dict(weights))
        except HeteroGpuError as err:
            raise self._fail(str(err)) from None

    # --- no capacity ------------------------------------------------------------------------
    def wait(self, result: PlanResult, waiting_since: float | None = None) -> PlanResult:
        """No pool fits now and the task does not wait (``wait_for_capacity=False``): fail with
        every pool's reason. Waiting goes through the ledger's queue
        (:mod:`~airflow_hetero_gpu.operators.queue_wait`)."""
        if getattr(self, "quota_refused", None):
            raise AirflowException(f"job {self.job_id}: {self.quota_refused}")
        raise AirflowException(f"no pool can host {self.request.gpus} GPU(s) now: {pool_reasons(result)}")
