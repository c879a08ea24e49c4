"""HeteroTrainOperator: choose the scheduling pool, reserve it, launch torchrun on it (seed S9).

``execute()``:

1. groups the (rendered) arguments into typed specs (:mod:`~airflow_hetero_gpu.operators.specs`),
   which the steps below take instead of the operator: a user mistake fails the task at once,
   without retries, with one line naming the argument;
2. reads the fleet's inventory from the ledger, collecting only the hosts whose inventory is
   missing or older than ``inventory_max_age`` (:mod:`~airflow_hetero_gpu.operators.placement`),
   then plans and reserves in one ledger transaction; logs every pool's stage, reason and score
   terms and pushes the decision to XCom (key ``decision``, with the inventory it used);
3. no pool fits: fails with every pool's reason, or with ``wait_for_capacity`` waits in the
   ledger's queue with its ``priority`` (deferred to the triggerer when ``deferrable``) until
   admitted or ``capacity_timeout`` passes (:mod:`~airflow_hetero_gpu.operators.queue_wait`);
4. sweeps the job's leftovers from an earlier try on the chosen hosts and on the hosts earlier
   tries ran on (the ledger remembers them) — no other host is touched — then starts torchrun on
   every host (one process group each), streaming every line into the task log prefixed by host
   and rank, renewing the lease while it runs (:mod:`~airflow_hetero_gpu.operators.run_loop`);
5. a GPU of the job evicted in the ledger (by the health sensor) is replaced there (SPEC §8) and
   the workers restart on the new set, resuming from the job's checkpoint; with no replacement
   the job follows ``on_no_replacement`` (``fail``, or ``wait`` for one);
6. any worker failing stops the others and fails the task with the host, exit code and the tail
   of its output; success releases the reservation and returns the decision with run facts.

``on_kill`` (task cleared or marked failed, timeout) ends every remote process group and
releases the reservation; a durable job's host that could not be reached keeps it reserved
(docs/durability.md: the lease outlives the dead-man switch there).
"""

from __future__ import annotations

import hashlib
import re
import time
from functools import cached_property
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from airflow.providers.common.compat.sdk import conf
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.ledger.errors import LedgerError
from airflow_hetero_gpu.operators import checkpoint_carry, durable, preempt, run_phase
from airflow_hetero_gpu.operators.runtime import Runtime
from airflow_hetero_gpu.operators.specs import Specs, fail
from airflow_hetero_gpu.watching.lease import forget_hosts

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_hetero_gpu.core.model import PlanResult
    from airflow_hetero_gpu.ledger import Ledger


def default_job_id(dag_id: str, task_id: str, run_id: str, map_index: int | None = None) -> str:
    """A job id that is stable across retries of one task instance and fits the launcher's
    rules (1-128 of ``[A-Za-z0-9._-]``): readable dag and task ids plus a hash of the run."""
    key = f"{dag_id}\0{task_id}\0{run_id}\0{-1 if map_index is None else map_index}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{dag_id}.{task_id}").strip("._") or "job"
    return f"{clean[:100]}.{digest}"


class HeteroTrainOperator(BaseOperator):
    """Train on ``gpu_count`` GPUs of a heterogeneous cluster chosen by the seed's evaluation.

    :param gpu_count: number of GPUs (k), all of one pool (one card type).
    :param gpu_type: acceptable card type(s): a name (``"A100-SXM4-80GB"``, ``"RTX 4090"``,
        globs like ``"A100*"``) or a list; ``None`` for any.
    :param task_type: training-task type the pool must support (``cluster.yaml`` task types);
        kept as the attribute ``training_task_type`` (``task_type`` is Airflow's own).
    :param gpu_memory_mib: free memory each GPU must have.
    :param script: training script path on the hosts, run under torchrun.
    :param script_args: the script's arguments (a list; each passed literally, never through a shell).
    :param command: instead of ``script``: a full argv run on every host (non-torchrun launchers);
        it finds its place through ``HETERO_GPU_NODE_RANK``, ``HETERO_GPU_NNODES``,
        ``HETERO_GPU_MASTER_ADDR``/``PORT`` and ``CUDA_VISIBLE_DEVICES``.
    :param env: environment variables for the workers (values are masked in the task log).
    :param workdir: working directory on the hosts.
    :param ssh_conn_ids: the hosts' ``ssh`` connections: a list (the connection id is the host's
        name) or a mapping host name -> connection id; default ``[hetero_gpu] ssh_conn_ids``.
        ``captures_dir``, ``cluster_config``, ``topology_conf`` and the ledger default to their
        ``[hetero_gpu]`` settings too (see docs/configuration.md).
    :param captures_dir: also keep the task's own collections in this capture directory (the
        inventory itself lives in the ledger); default a temporary one.
    :param cluster_config: ``cluster.yaml`` path or mapping (weights, thresholds, task types).
    :param topology_conf: Slurm ``topology.conf`` path (switch tiers between hosts).
    :param ledger_conn_id: Airflow connection of the ledger database (see ``LedgerHook``).
    :param ledger_url: or its SQLAlchemy URL; neither: SQLite under ``$AIRFLOW_HOME``.
    :param weights: override of the evaluation weights (``load_balance``, ``fragmentation``, ``topology``,
        ``free_blocks``).
    :param wait_for_capacity: when no pool fits now, wait in the ledger's queue instead of failing.
    :param priority: the job's place in that queue (integer, default 0; higher first, with aging:
        docs/queue.md). Airflow's ``priority_weight`` orders worker slots, not GPUs.
    :param team: the team whose quota the job counts against (docs/teams.md); default ``[hetero_gpu]
        default_team``, else ``default``; in Airflow's multi-team mode the DAG bundle's (leave it out).
    :param capacity_timeout: seconds to wait for capacity.
    :param capacity_poll_interval: seconds between two looks at the job's queue entry.
    :param deferrable: wait for capacity in the triggerer instead of holding a worker slot, and
        (durable, with a task state store) watch the running job there too: the task resumes in
        a worker only to finish or to relaunch (default: ``[operators] default_deferrable``).
    :param on_no_replacement: ``"fail"`` or ``"wait"`` when a GPU of the running job turns abnormal
        and no healthy GPU of its pool can replace it.
    :param max_restarts: restarts of the workers on a new GPU set (after replacements) before the
        task fails. torchrun itself runs with ``--max-restarts 0``: a worker that fails is a job
        failure (the task's own ``retries`` decide whether to try again).
    :param checkpoint_dir: when set, ``--checkpoint-dir DIR`` is appended to the script's arguments
        (the example script resumes from it after a restart).
    :param preemptible: whether a waiting job of higher priority may preempt this one (default True;
        docs/preemption.md), ``preemption_signal`` what it is sent first (default ``"SIGTERM"``),
        ``preemption_grace`` the seconds it has to exit before it is killed (default 300), and
        ``checkpoint_storage``: ``"shared"`` or ``"host"`` (carry ``checkpoint_dir`` to the new hosts).
    :param lease_seconds: lease of the reservation; renewed every third of it while the job runs.
        When the ledger cannot be reached (a database restart), the job runs on while the lease
        lasts and is stopped shortly before it would run out (its GPUs could be given away).
        Default: ``unattended_timeout + preemption_grace + 15`` s when durable, else 120 s; a
        durable task refuses a shorter one (the lease must outlive the hosts' dead-man switch).
    :param durable: run the job detached under each host's supervisor and store its handle in
        Airflow's task state store, so that a retry after a worker crash reattaches to the running
        job instead of launching it again (default True; ``ResumableJobMixin``'s ``durable``).
        Without a task state store (Airflow < 3.3) the task runs as before.
    :param unattended_timeout: seconds a durable job runs on with nobody watching it (no heartbeat
        from a task) before its hosts' supervisors stop it (``preemption_signal``, then
        ``preemption_grace``, then SIGKILL). Default 900 (docs/durability.md says why).
    :param host_timeout: seconds a host of the running job may stay silent (no answer to SSH
        keepalives, sent every quarter of it) before the job counts as failed there.
    :param launcher: the torchrun argv on the hosts (``["python3", "-m", "torch.distributed.run"]``
        where ``torchrun`` is not on the remote PATH).
    :param rdzv_port: rendezvous port: ``"probe"`` a free port on the first host (default),
        ``"derive"`` from the job id, or a number.
    :param rdzv_host: the address the other hosts reach the rendezvous (the first host) at, when
        its SSH address is not the right one (a management network, a bastion in front).
    :param inventory_max_age: plan from the ledger's inventory of a host when it is at most this
        many seconds old, else collect the host first (default ``[hetero_gpu] inventory_max_age``,
        else 300; 0 collects every host of the fleet first).
    :param job_id: reservation and job id; default stable per task instance (a retry gets its
        GPUs back).
    """

    template_fields: Sequence[str] = (
        "gpu_count", "gpu_type", "training_task_type", "gpu_memory_mib", "script", "script_args", "command",
        "env", "workdir", "captures_dir", "checkpoint_dir", "weights", "job_id", "rdzv_host", "team",
    )
    template_fields_renderers = {"env": "json", "script_args": "json", "command": "json", "weights": "json"}
    ui_color = "#d9ead3"

    def __init__(
        self,
        *,
        gpu_count: int | str,
        gpu_type: str | Sequence[str] | None = None,
        task_type: str | None = None,
        gpu_memory_mib: int | float | str | None = None,
        script: str | None = None,
        script_args: Sequence[str] | None = None,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        ssh_conn_ids: Sequence[str] | Mapping[str, str] | None = None,
        captures_dir: str | None = None,
        cluster_config: str | Mapping[str, Any] | None = None,
        topology_conf: str | None = None,
        ledger_conn_id: str | None = None,
        ledger_url: str | None = None,
        weights: Mapping[str, float] | None = None,
        wait_for_capacity: bool = False,
        priority: int = 0,
        team: str | None = None,
        capacity_timeout: float = 3600.0,
        capacity_poll_interval: float = 30.0,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        on_no_replacement: str = "fail",
        max_restarts: int = 3,
        checkpoint_dir: str | None = None,
        preemptible: bool = True, preemption_signal: str = "SIGTERM", preemption_grace: float = 300.0,
        checkpoint_storage: str = "shared",
        lease_seconds: float | None = None,
        host_timeout: float = 60.0,
        durable: bool = True,
        unattended_timeout: float = 900.0,
        launcher: Sequence[str] = ("torchrun",),
        rdzv_port: int | str = "probe",
        rdzv_host: str | None = None,
        inventory_max_age: float | None = None,
        job_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gpu_count = gpu_count
        self.gpu_type = gpu_type
        # BaseOperator.task_type is Airflow's own (the operator class name): keep ours apart
        self.training_task_type = task_type
        self.gpu_memory_mib = gpu_memory_mib
        self.script = script
        self.script_args = script_args
        self.command = command
        self.env = env
        self.workdir = workdir
        self.ssh_conn_ids = ssh_conn_ids
        self.captures_dir = captures_dir
        self.cluster_config = cluster_config
        self.topology_conf = topology_conf
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.weights = weights
        self.wait_for_capacity = wait_for_capacity
        self.priority = priority
        self.team = team
        self.capacity_timeout = capacity_timeout
        self.capacity_poll_interval = capacity_poll_interval
        self.deferrable = deferrable
        self.on_no_replacement = on_no_replacement
        self.max_restarts = max_restarts
        self.checkpoint_dir = checkpoint_dir
        self.preemptible, self.preemption_signal, self.preemption_grace = preemptible, preemption_signal, preemption_grace
        self.checkpoint_storage = checkpoint_storage
        self.lease_seconds = lease_seconds
        self.host_timeout = host_timeout
        self.durable = durable
        self.unattended_timeout = unattended_timeout
        self.launcher = launcher
        self.rdzv_port = rdzv_port
        self.rdzv_host = rdzv_host
        self.inventory_max_age = inventory_max_age
        self.job_id = job_id
        self._specs: Specs | None = None
        self._runtime: Runtime | None = None
        self._job = None
        self._ledger_obj: Ledger | None = None
        self._placement = None
        self._durable_job: Any = None  # operators.durable.DurableJob of this try

    # --- the arguments, as specs --------------------------------------------------------------
    def _fail(self, message: str) -> AirflowFailException:
        return fail(message)

    def _arguments(self) -> dict[str, Any]:
        """Every argument the specs take, as it is now (rendered, in ``execute()``)."""
        return {name: getattr(self, "training_task_type" if name == "task_type" else name) for name in Specs.ARGUMENTS}

    @property
    def specs(self) -> Specs:
        """The arguments grouped into checked specs (:mod:`~airflow_hetero_gpu.operators.specs`):
        built afresh by ``execute()`` from the rendered arguments."""
        if self._specs is None:
            self._specs = Specs.build(self._arguments())
        return self._specs

    def _validate(self) -> Specs:
        """The specs of the (rendered) arguments: a mistake fails the task in one line, no retries."""
        self._specs = None
        return self.specs

    @property
    def runtime(self) -> Runtime:
        """The live objects this task shares with its helpers (the ledger, the hook, the log)."""
        if self._runtime is None:
            self._runtime = Runtime(lambda: self.ledger, lambda: self.hook, lambda: self.ledger_hook, self.log,
                                    self.defer, type(self).__name__)
        return self._runtime

    # --- collaborators ------------------------------------------------------------------------
    @cached_property
    def hook(self):
        from airflow_hetero_gpu.hooks.hetero_gpu import HeteroGpuHook

        fleet = self.specs.fleet
        return HeteroGpuHook(fleet.ssh_conn_ids, captures_dir=fleet.captures_dir, config=fleet.cluster_config,
                             topology_conf=fleet.topology_conf)

    @cached_property
    def ledger_hook(self):
        from airflow_hetero_gpu.hooks.ledger import LedgerHook

        return LedgerHook(ledger_conn_id=self.specs.fleet.ledger_conn_id, ledger_url=self.specs.fleet.ledger_url)

    @property
    def ledger(self) -> Ledger:
        if self._ledger_obj is None:
            from airflow_hetero_gpu.hooks.ledger import UnshareableLedger
            from airflow_hetero_gpu.ledger import LedgerUrlError, MissingLedger

            try:
                self._ledger_obj = self.ledger_hook.get_ledger()
            except (UnshareableLedger, MissingLedger, LedgerUrlError) as err:  # a setup mistake: never retried
                raise self._fail(str(err)) from None
            except LedgerError as err:  # unreachable: the task's retries apply
                raise AirflowException(str(err)) from None
        return self._ledger_obj

    def max_age(self) -> float:
        """``inventory_max_age``, else ``[hetero_gpu] inventory_max_age``, else 300 s."""
        return self.specs.fleet.inventory_max_age

    # --- execute ------------------------------------------------------------------------------
    def execute(self, context: Context) -> dict[str, Any]:
        return self._place_and_run(context, resume=True)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resumed by the queue trigger: take the admission and run (``gone``: the entry expired,
        enqueue again; ``capacity``: a trigger of an earlier release, enqueue)."""
        event = event or {}
        if event.get("phase") == "run":  # the deferred run phase's trigger (operators/run_phase.py)
            specs = self._validate()
            run_phase.take_back(event, durable.DurableJob(specs.lifecycle, self.runtime, context, self._job_id(context)))
            return self._place_and_run(context, resume=True)
        status = event.get("status")
        if status == "timeout":
            raise AirflowException(f"not admitted within {self.specs.lifecycle.capacity_timeout:g} s: "
                                   f"{event.get('message', '')}")
        if status not in ("admitted", "gone", "capacity"):
            raise AirflowException(f"waiting for capacity failed: {event.get('message', event)}")
        return self._place_and_run(context, waiting_since=event.get("started_at"), admitted=status == "admitted")

    def _place_and_run(self, context: Context, waiting_since: float | None = None,
                       admitted: bool = False, resume: bool = False) -> dict[str, Any]:
        from airflow_hetero_gpu.operators.placement import Placement
        from airflow_hetero_gpu.operators.queue_wait import QueueWait

        specs = self._validate()
        self._mask_env()
        job_id = self._job_id(context)
        placement = self._placement = Placement(specs, self.runtime, context, job_id)
        self._durable_job = durable.DurableJob(specs.lifecycle, self.runtime, context, job_id, placement)
        found = self._durable_job.resume() if resume else durable.Resumed()
        if found.result is not None:  # it ended successfully while no task watched it
            return found.result
        if found.handle is not None:  # still running: reattach, nothing launched or reserved
            out = self._run(job_id, None, context, attach=found.handle)
            while out.get("preempted"):
                out = self._run(job_id, preempt.requeue(placement), context)
            return out
        if admitted:
            result = QueueWait(placement).resume(waiting_since)
        elif specs.lifecycle.wait_for_capacity:
            result = QueueWait(placement).place(waiting_since)
        else:
            result = placement.reserve()
            if result.decision is None:
                result = placement.wait(result, waiting_since)
        while (out := self._run(job_id, result, context)).get("preempted"):  # back in the queue: run again
            result = preempt.requeue(placement)
        return out

    def _job_id(self, context: Context) -> str:
        if self.job_id:
            from airflow_hetero_gpu.launch.command import validate_job_id

            try:
                return validate_job_id(self.job_id)
            except ValueError as err:
                raise self._fail(f"job_id: {err}") from None
        ti = context["ti"]
        return default_job_id(ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", None))

    def _mask_env(self) -> None:
        from airflow.sdk.log import mask_secret

        for value in (self.specs.program.env or {}).values():
            if isinstance(value, str) and value:
                mask_secret(value)

    # --- running ------------------------------------------------------------------------------
    def _launch_spec(self, job_id: str):
        """The job's :class:`~airflow_hetero_gpu.launch.command.LaunchSpec` (what runs on the hosts)."""
        return self.specs.program.launch_spec(job_id)

    def _on_line(self, host: str, rank: int, stream: str, line: str) -> None:
        self.log.info("[%s rank %d] %s", host, rank, line)

    def _run(self, job_id: str, result: PlanResult | None, context: Context,
             attach: dict | None = None) -> dict[str, Any]:
        """Launch (or, with ``attach``, reattach to) the job and watch it to its end."""
        from airflow_hetero_gpu.core.model import GpuKey
        from airflow_hetero_gpu.launch.handoff import ConnectionHandoff
        from airflow_hetero_gpu.launch.orphans import kill_orphans
        from airflow_hetero_gpu.watching.gpu_set import GpuSetWatch
        from airflow_hetero_gpu.watching.lease import LeaseKeeper
        from airflow_hetero_gpu.watching.targets import LazyTargets
        from airflow_hetero_gpu.operators.run_loop import RunSettings, TrainingRun, check_launch_paths

        if attach is None:
            decision_json = result.to_json()["decision"]
            initial = [g.key for g in result.decision.gpus]
        else:
            decision_json = attach["decision"]
            initial = [GpuKey(*k) for k in attach["initial_gpus"]]
        gpus = initial if attach is None else [GpuKey(*k) for k in attach["gpus"]]
        chosen = list(dict.fromkeys(k[0] for k in gpus))
        started = time.monotonic()
        factory = None
        dj = self._durable_job
        specs, runtime = self.specs, self.runtime
        lifecycle = specs.lifecycle
        try:
            if attach is None:
                # only the hosts this try runs on, and those earlier tries of the job ran on, are
                # touched: a job id is stable across tries, and whatever an earlier try left running
                # (a retry may be placed elsewhere) is stopped before this one starts
                earlier = [h for h in self.ledger.job_hosts(job_id) if h in self.hook.hosts]
                hosts = list(dict.fromkeys(chosen + earlier))
                self.ledger.add_job_hosts(job_id, chosen)
            else:
                earlier, hosts = [], chosen
            try:
                targets = LazyTargets(self.hook, hosts)
                # the sweep's connection to a host is the launch's (one connection a host)
                factory = ConnectionHandoff(self.hook.client_factory(hosts))
            except (HeteroGpuError, ValueError) as err:
                raise self._fail(str(err)) from None
            if attach is None:
                for host, sweep in kill_orphans(job_id, [targets[h] for h in hosts], factory).items():
                    if sweep.found:
                        self.log.warning("stopped %d leftover process(es) of job %s on %s", len(sweep.found),
                                         job_id, host)
                check_launch_paths(self._launch_spec(job_id), [targets[h] for h in chosen], factory)
                checkpoint_carry.before_launch(specs.program, lifecycle, runtime, job_id, earlier, chosen,
                                               lambda h: factory(targets[h]))
            factory.release(set(chosen))
            kill = lambda: self._job.kill() if self._job is not None else None  # noqa: E731
            seen = preempt.CheckpointSeen()
            supervised = dj is not None and dj.on
            lease = LeaseKeeper(lambda: self.ledger, job_id, lifecycle.lease_seconds, log=self.log, kill=kill,
                                lease_from=runtime.lease_from, checkpoints=seen,
                                renew_every=lifecycle.renew_every if supervised else None)
            gpu_set = GpuSetWatch(lambda: self.ledger, job_id, lifecycle.on_no_replacement,
                                  cluster=self._placement.current_cluster, kill=kill, log=self.log)
            settings = RunSettings(self._launch_spec(job_id), rdzv_port=specs.program.rdzv_port,
                                   rdzv_host=specs.program.rdzv_host, host_timeout=lifecycle.host_timeout,
                                   max_restarts=lifecycle.max_restarts,
                                   on_line=lambda h, r, s, text: (seen.line(h, text), self._on_line(h, r, s, text)),
                                   on_preempted=lambda job, gpus, mark, lk: preempt.stop(
                                       lifecycle, runtime, self._placement, job, job_id, mark, lk, seen))
            if supervised:
                settings.supervise = lifecycle.supervision
                settings.before_launch = lambda now, launch, restarts: dj.launching(
                    launch, now, decision_json, initial, restarts)
                settings.defer = run_phase.deferrer(specs, runtime, job_id, dj)
            run = TrainingRun(job_id, settings, targets, factory, lease=lease, gpu_set=gpu_set, log=self.log,
                              on_job=self._set_job, on_started=factory.settle)
            if attach is None:
                gpu_set.remember(result.decision.gpus)
            runs, restarts = run.run(gpus, attach)  # rank order along the network tree
        except TaskDeferred:  # the job runs on, watched by a trigger (a deferred run phase)
            raise
        except BaseException:
            # whatever stopped us (a failure, a timeout, the task being killed): nothing of the
            # job may outlive the task, and its GPUs go back at once; but a supervised job's share
            # on a host that could not be stopped runs on until the dead-man switch there stops
            # it: its GPUs stay reserved (the lease outlives the switch), its handle for a retry
            if self._job is not None:
                self._job.kill()
            if factory is not None:
                factory.settle()
            if self._release(job_id, unstopped=self._unstopped()) and dj is not None:
                dj.forget()
            self._job = None  # stopped: an on_kill after an execution timeout has nothing left to do
            raise
        if runs[-1].get("preempted"):  # its GPUs went back with the preemption; its hosts are kept
            if dj is not None:
                dj.forget()
            return runs[-1]
        self._release(job_id)
        forget_hosts(lambda: self.ledger, job_id, self.log)
        if dj is not None:
            dj.forget()
        return durable.output(job_id, decision_json, initial, runs[-1], restarts, time.monotonic() - started)

    def _set_job(self, job) -> None:
        self._job = job

    def _release(self, job_id: str, patience: float = 30.0, unstopped: Sequence[str] = ()) -> bool:
        """Release the job's GPUs, retrying for ``patience`` s while the ledger is unreachable
        (its lease frees them anyway when even that fails); kept while ``unstopped`` names a host."""
        return self.runtime.release(job_id, patience, unstopped)

    def _unstopped(self) -> list[str]:
        """The hosts where this try's supervised job may still run after its stop (unreachable):
        none for a job that is not supervised (each host's watchdog ends it with its session)."""
        return self._job.may_still_run() if self._job is not None else []

    def on_kill(self) -> None:
        if self._runtime is not None and self._runtime.waiting_job is not None:  # in the queue: leave it now
            from airflow_hetero_gpu.operators.queue_wait import QueueWait

            QueueWait(self._placement).leave("task killed")
        job = self._job
        if job is None:
            return
        from airflow_hetero_gpu.operators.stop_cause import stop_or_let_run

        why = stop_or_let_run(job, self._placement.context if self._placement is not None else None,
                              self.specs.lifecycle.unattended_timeout, self.log)
        if why is None:  # a durable job, and nobody stopped the task: it runs on
            return
        self.log.info("task killed: stopping job %s on every host%s", job.job_id, why)
        job.kill()
        self._release(job.job_id, patience=5.0, unstopped=self._unstopped())
