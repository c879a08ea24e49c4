"""``GpuHealthSensor``: wait for a healthy GPU pool, or watch running jobs' GPUs (SPEC §8, S10-S12).

Two uses (``mode_kind``):

``gate``
    Succeeds once some candidate pool of the wanted card type / task type has ``min_healthy``
    healthy, available GPUs (the planner's preselection with the ledger's reservations and
    evictions). A retraining DAG puts it before its training task.

``watch``
    Runs beside training jobs. Every check records the GPUs' health in the ledger (eviction with
    hysteresis, readmission) and swaps every evicted GPU of a live reservation for a healthy one
    of the same pool; the training operator restarts its workers on the new set. Succeeds after
    ``watch_duration``, or once the watched reservations (``job_ids``, default all) have all
    ended after one was seen.

Both modes log every eviction (host, index, uuid, reasons), readmission, replacement and new
host/GPU/pool, emit metrics through Airflow's Stats, and return a JSON summary as XCom. The
check itself is :class:`~airflow_hetero_gpu.healthcheck.HealthWatch`, shared with the
deferrable form (``deferrable=True``), so both decide alike. See docs/health.md.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException, conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_hetero_gpu.collect.ssh import DEFAULT_MAX_PARALLEL
from airflow_hetero_gpu.healthcheck import HealthWatch, WatchSpec
from airflow_hetero_gpu.settings import history_settings, setting
from airflow_hetero_gpu.triggers.gpu_health import GpuHealthTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


class GpuHealthSensor(BaseSensorOperator):
    """Check the health of a GPU fleet reached over SSH; gate on a healthy pool or watch jobs.

    :param ssh_conn_ids: Airflow ``ssh`` connections of the GPU hosts: a list (each id is the
        host's name) or a mapping host name -> connection id (templated). Default:
        ``[hetero_gpu] ssh_conn_ids``. Or, for a large fleet:
    :param hosts_file: a file of the hosts, one ``[NAME=][USER@]HOST[:PORT]`` a line (the
        ``hetero-gpu check --hosts-file`` format; templated), reached through
    :param ssh_conn_id: the one Airflow ``ssh`` connection that reaches them all (templated): its
        login and port for the entries that name none, its ``key_file`` extra, host keys verified
        against its ``known_hosts`` extra (default ``~/.ssh/known_hosts``); see
        :mod:`~airflow_hetero_gpu.hooks.fleet_connection`. Not with ``ssh_conn_ids``. Defaults:
        ``[hetero_gpu] hosts_file`` and ``fleet_conn_id``, which win over ``[hetero_gpu]
        ssh_conn_ids`` for this sensor.
    :param mode_kind: ``"gate"`` or ``"watch"`` (see the module docstring).
    :param captures_dir: also keep each check's collection in this capture directory (templated;
        optional: the inventory, a failed host's last good outputs and a rescheduled sensor's
        record between pokes live in the ledger).
    :param config: ``cluster.yaml`` path or mapping (SPEC §3), thresholds included.
    :param topology_conf: Slurm ``topology.conf`` of the network between hosts.
    :param ledger_url: the ledger's database URL (templated); or
    :param ledger_conn_id: an Airflow connection naming it (read at run time, see ``LedgerHook``).
        Neither: the default SQLite file under ``$AIRFLOW_HOME``.
    :param min_healthy: gate: GPUs one pool must have healthy and available.
    :param gpu_type: gate: card type(s), matched like ``--gpu-type`` (templated).
    :param task_type: gate: training-task type the pool must support (templated; kept as
        ``training_task_type``, since ``task_type`` names the operator class in Airflow).
    :param gpu_memory_mib: gate: free memory each GPU must have.
    :param job_ids: watch: the reservations to watch and repair (default: every live one).
    :param watch_duration: watch: seconds (or timedelta) after which the sensor succeeds.
    :param stop_when_idle: watch: succeed once no watched reservation is live any more (after
        one was seen live during this run).
    :param thresholds: overrides of cluster.yaml's ``thresholds`` (``max_temperature_c``,
        ``soft_fault_checks``, ``unreachable_checks``, ``readmit_after_healthy_checks``,
        ``check_row_remap``, ``check_hw_slowdown``, ...).
    :param sweep_orphans: watch: at every check, stop on every host the processes of jobs that
        hold no live reservation (their task died and their host's watchdog could not end them).
        Leave it off where jobs are launched outside the ledger with this package's launcher.
    :param deferrable: wait in the triggerer (:class:`GpuHealthTrigger`) instead of a worker.
    :param max_parallel, connect_timeout, command_timeout, retries, read_kernel_log: the SSH
        collection's settings (see ``HeteroGpuHook``).
    """

    template_fields: Sequence[str] = ("ssh_conn_ids", "hosts_file", "ssh_conn_id", "captures_dir", "ledger_url",
                                      "ledger_conn_id", "gpu_type", "training_task_type", "job_ids", "min_healthy")
    ui_color = "#d9f2e6"

    def __init__(
        self,
        *,
        ssh_conn_ids: Sequence[str] | Mapping[str, str] | str | None = None,
        hosts_file: str | None = None,
        ssh_conn_id: str | None = None,
        mode_kind: str = "watch",
        captures_dir: str | None = None,
        config: str | Mapping[str, Any] | None = None,
        topology_conf: str | None = None,
        ledger_url: str | None = None,
        ledger_conn_id: str | None = None,
        min_healthy: int = 1,
        gpu_type: str | Sequence[str] | None = None,
        task_type: str | None = None,
        gpu_memory_mib: float | None = None,
        job_ids: Sequence[str] | None = None,
        watch_duration: float | timedelta | None = None,
        stop_when_idle: bool = True,
        thresholds: Mapping[str, Any] | None = None,
        sweep_orphans: bool = False,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        max_parallel: int = DEFAULT_MAX_PARALLEL,
        connect_timeout: float = 10,
        command_timeout: float = 30,
        retries: int = 2,
        read_kernel_log: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.ssh_conn_ids = ssh_conn_ids
        self.hosts_file = hosts_file
        self.ssh_conn_id = ssh_conn_id
        self.mode_kind = mode_kind
        self.captures_dir = captures_dir
        self.config = config
        self.topology_conf = topology_conf
        self.ledger_url = ledger_url
        self.ledger_conn_id = ledger_conn_id
        self.min_healthy = min_healthy
        self.gpu_type = gpu_type
        self.training_task_type = task_type  # BaseOperator.task_type is the operator's class name
        self.gpu_memory_mib = gpu_memory_mib
        self.job_ids = job_ids
        self.watch_duration = watch_duration
        self.stop_when_idle = stop_when_idle
        self.thresholds = thresholds
        self.sweep_orphans = sweep_orphans
        self.deferrable = deferrable
        self.max_parallel = max_parallel
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.retries = retries
        self.read_kernel_log = read_kernel_log
        #: The checks of this run (poke and reschedule modes), built at the first poke.
        self.health_watch: HealthWatch | None = None

    # -- arguments, checked at run time ----------------------------------------------------------
    def _spec(self) -> WatchSpec:
        duration = self.watch_duration
        if isinstance(duration, timedelta):
            duration = duration.total_seconds()
        gpu_type = self.gpu_type if self.gpu_type is None or isinstance(self.gpu_type, str) else list(self.gpu_type)
        min_healthy = self.min_healthy
        if isinstance(min_healthy, str) and min_healthy.strip().lstrip("-").isdigit():
            min_healthy = int(min_healthy)  # rendered from a template such as "{{ params.gpu_count }}"
        return WatchSpec(
            mode_kind=self.mode_kind, min_healthy=min_healthy, gpu_type=gpu_type, task_type=self.training_task_type,
            gpu_memory_mib=self.gpu_memory_mib, job_ids=None if self.job_ids is None else list(self.job_ids),
            watch_duration=duration, stop_when_idle=self.stop_when_idle,
            thresholds=None if self.thresholds is None else dict(self.thresholds),
            sweep_orphans=self.sweep_orphans,
        ).validate()

    def _hook_kwargs(self) -> dict[str, Any]:
        return {"max_parallel": self.max_parallel, "connect_timeout": self.connect_timeout,
                "command_timeout": self.command_timeout, "retries": self.retries,
                "read_kernel_log": self.read_kernel_log}

    def _ledger_url(self) -> str | None:
        from airflow_hetero_gpu.hooks.ledger import LedgerHook  # noqa: PLC0415
        from airflow_hetero_gpu.ledger import LedgerUrlError, MissingLedger  # noqa: PLC0415

        try:  # a SQLite ledger named here must exist (only the deployment's is created); logged
            return LedgerHook(ledger_conn_id=self.ledger_conn_id, ledger_url=self.ledger_url).checked_url()
        except (MissingLedger, LedgerUrlError) as err:  # a mistake: never retried
            raise AirflowFailException(str(err)) from None

    def _fleet_args(self) -> tuple[str, str] | None:
        """``(hosts_file, ssh_conn_id)`` when the hosts come from a hosts file, else None (the
        hosts are ``ssh_conn_ids``); a mistake in how they are named fails the task."""
        if self.hosts_file and self.ssh_conn_ids:
            raise AirflowFailException("give either ssh_conn_ids (one connection per host) or hosts_file with "
                                       "ssh_conn_id (one connection for the fleet), not both")
        if self.ssh_conn_ids:
            return None
        hosts_file, conn_id = self.hosts_file, self.ssh_conn_id
        if not hosts_file and not conn_id:  # the deployment's settings, where it names a hosts file
            hosts_file, conn_id = setting("hosts_file"), setting("fleet_conn_id")
            if not hosts_file:
                return None
            if not conn_id:
                raise AirflowFailException("[hetero_gpu] hosts_file needs [hetero_gpu] fleet_conn_id: the ssh "
                                           "connection that reaches its hosts")
        if bool(hosts_file) != bool(conn_id):
            raise AirflowFailException("hosts_file and ssh_conn_id go together: the hosts file names the hosts, "
                                       "the ssh connection says how to reach them")
        return str(hosts_file), str(conn_id)

    def _fleet_collector(self, hosts_file: str, conn_id: str) -> Any:
        from airflow.sdk import BaseHook  # noqa: PLC0415

        from airflow_hetero_gpu.errors import ConfigError  # noqa: PLC0415
        from airflow_hetero_gpu.hooks.fleet_connection import fleet_collector  # noqa: PLC0415

        try:
            conn = BaseHook.get_connection(conn_id)
        except Exception as exc:  # noqa: BLE001 - a missing connection: never retried
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise AirflowFailException(f"ssh_conn_id {conn_id!r}: the Airflow connection cannot be read: "
                                       f"{reason}") from None
        config = self.config if self.config is not None else setting("cluster_config")
        try:
            return fleet_collector(conn, conn_id, hosts_file, keep_connections=not self.reschedule,
                                   captures_dir=self.captures_dir or setting("captures_dir"), config=config,
                                   topology_conf=self.topology_conf or setting("topology_conf"),
                                   **self._hook_kwargs())
        except ConfigError as err:
            raise AirflowFailException(str(err)) from None

    def _hook(self) -> Any:
        """The collector: a :class:`HeteroGpuHook` over ``ssh_conn_ids``, or the hosts file's."""
        from airflow_hetero_gpu.hooks.hetero_gpu import HeteroGpuHook  # noqa: PLC0415

        fleet = self._fleet_args()
        if fleet is not None:
            return self._fleet_collector(*fleet)
        # poking in one process: the connections stay open between pokes (closed when the task
        # ends); a rescheduled poke runs in a new process and connects afresh
        return HeteroGpuHook(self.ssh_conn_ids, captures_dir=self.captures_dir, config=self.config,
                             topology_conf=self.topology_conf, keep_connections=not self.reschedule,
                             **self._hook_kwargs())

    # -- reschedule mode: the run's record between pokes -------------------------------------------
    def _run_key(self, context: "Context") -> str | None:
        """Where a rescheduled sensor keeps its run's record between pokes (in the ledger: the next
        poke may run on another worker)."""
        if not self.reschedule:
            return None
        ti = context["ti"]
        return "/".join([ti.dag_id, ti.task_id, ti.run_id, str(getattr(ti, "map_index", -1))])

    def _collector(self, context: "Context") -> str:
        from airflow_hetero_gpu.healthcheck.check import collector_name  # noqa: PLC0415

        ti = context.get("ti") if hasattr(context, "get") else None
        what = f"GpuHealthSensor {ti.dag_id}/{ti.run_id}/{ti.task_id}" if ti is not None else "GpuHealthSensor"
        return collector_name(what)

    def _runner(self, context: "Context") -> HealthWatch:
        if self.health_watch is None:
            self.health_watch = HealthWatch(self._spec(), self._hook(), self._ledger_url(), log=self.log,
                                            collector=self._collector(context), history=history_settings())
            key = self._run_key(context)
            if key is not None:
                from airflow_hetero_gpu.ledger import Ledger  # noqa: PLC0415

                with Ledger.from_url(self.health_watch.ledger_url) as ledger:
                    state = ledger.watch_run_state(key)
                if state:
                    self.health_watch.from_state(state)
        return self.health_watch

    def _keep(self, context: "Context", state: Mapping[str, Any] | None) -> None:
        key = self._run_key(context)
        if key is None:
            return
        from airflow_hetero_gpu.ledger import Ledger  # noqa: PLC0415

        with Ledger.from_url(self.health_watch.ledger_url) as ledger:
            ledger.save_watch_run_state(key, state)

    # -- poke mode -----------------------------------------------------------------------------------
    def poke(self, context: "Context") -> bool | PokeReturnValue:
        from airflow_hetero_gpu.errors import ConfigError, HeteroGpuError, RequestError  # noqa: PLC0415

        try:  # the provider's own failures in one line, without chained internals
            runner = self._runner(context)
            runner.check()
        except (ConfigError, RequestError) as err:  # no hosts, a bad cluster.yaml or request: never retried
            raise AirflowFailException(str(err)) from None
        except HeteroGpuError as err:  # an unreachable ledger: the task's retries apply
            raise AirflowException(str(err)) from None
        reason = runner.outcome()
        if reason is not None:
            self.log.info("GPU health sensor done: %s", reason)
            self._keep(context, None)
            return PokeReturnValue(is_done=True, xcom_value=runner.result(reason))
        self._keep(context, runner.to_state())
        return False

    # -- deferrable mode -----------------------------------------------------------------------------
    def execute(self, context: "Context") -> Any:
        if not self.deferrable:
            try:
                return super().execute(context)
            finally:  # the connections kept between pokes
                if self.health_watch is not None:
                    self.health_watch.hook.close()
        spec = self._spec()
        self._ledger_url()  # refused now (not in the triggerer) when missing; names it in the log
        # the trigger gets what the deployment's [hetero_gpu] settings say where no argument did
        fleet = self._fleet_args()  # the hosts file and its connection are read in the triggerer
        hosts = None if fleet is not None else self._hook().hosts
        config = self.config if self.config is not None else setting("cluster_config")
        ledger_conn_id, ledger_url = self.ledger_conn_id, self.ledger_url
        if not ledger_conn_id and not ledger_url:
            ledger_conn_id, ledger_url = setting("ledger_conn_id"), setting("ledger_url")
        self.defer(
            trigger=GpuHealthTrigger(
                ssh_conn_ids=hosts, hosts_file=None if fleet is None else fleet[0],
                ssh_conn_id=None if fleet is None else fleet[1],
                spec=spec.to_json(), poke_interval=self.poke_interval,
                captures_dir=self.captures_dir or setting("captures_dir"),
                config=(dict(config) if isinstance(config, Mapping) else None if config is None else str(config)),
                topology_conf=self.topology_conf or setting("topology_conf"),
                ledger_url=ledger_url, ledger_conn_id=ledger_conn_id,
                hook_kwargs=self._hook_kwargs(),
                collector=self._collector(context), history=history_settings(),
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: "Context", event: Mapping[str, Any] | None = None) -> Any:
        if not event or event.get("status") != "success":
            message = f"GPU health check failed: {(event or {}).get('message', 'no event')}"
            raise AirflowFailException(message) if (event or {}).get("mistake") else AirflowException(message)
        result = event["result"]
        self.log.info("GPU health sensor done: %s (%d checks, %d evictions)", result.get("reason"),
                      result.get("checks", 0), len(result.get("evictions", [])))
        return result
