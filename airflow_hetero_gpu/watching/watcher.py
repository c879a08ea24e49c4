"""The blocking half of a deferred run's trigger: reattach to the job, look at it, let go of it.

:class:`~airflow_hetero_gpu.triggers.training.TrainingRunTrigger` runs each call of a
:class:`RunWatcher` in a thread. The watcher reattaches as a retry does (each host's run files:
the launch, its state, the output offsets the last watcher relayed), follows the job with a
:class:`~airflow_hetero_gpu.launch.remote.RemoteJob` (heartbeats, relayed output) and takes the
worker's looks at it (:class:`~.look.JobWatch`). A look that needs the task returns
``(status, message, facts)`` for the trigger's event; ``None`` means "running, look again".
"""

from __future__ import annotations

import contextvars
import threading
from typing import TYPE_CHECKING, Any, Callable

from airflow.sdk.exceptions import AirflowException

from airflow_hetero_gpu.watching.look import JobWatch, watch_options

if TYPE_CHECKING:
    from airflow_hetero_gpu.triggers.training import TrainingRunTrigger

Found = tuple[str, str, dict]


class LineLog:
    """Each line of the job's output logged at once, from the job's reader threads, in the context
    the watcher was made in (the trigger's: Airflow routes a trigger's log to its task's log by
    context variables, which threads do not inherit). A line counts as relayed (the offsets a
    heartbeat records) only once it was logged, so a watcher killed at any moment loses none."""

    def __init__(self, log: Any, also: Callable[[str, str], None] | None = None) -> None:
        self._context = contextvars.copy_context()
        self._log = log
        self._also = also

    def __call__(self, host: str, rank: int, stream: str, line: str) -> None:
        if self._also is not None:
            self._also(host, line)
        self._context.copy().run(self._log.info, "[%s rank %d] %s", host, rank, line)


class RunWatcher:
    """One trigger's watch of one launch of a job (``trigger``: its arguments and log)."""

    def __init__(self, trigger: TrainingRunTrigger, ledger_url: str | None, connections: dict[str, Any]):
        from airflow_hetero_gpu.hooks.hetero_gpu import HeteroGpuHook
        from airflow_hetero_gpu.watching.checkpoints import CheckpointSeen

        from airflow_hetero_gpu.core.model import GpuKey

        self.t = trigger
        self.job_id = trigger.job_id
        self.gpus = [GpuKey(*k) for k in trigger.gpus]  # rank order, as the ledger keeps them
        self.log = trigger.log
        self.url = ledger_url
        self.hook = HeteroGpuHook(trigger.ssh_conn_ids, connections=connections, config=trigger.cluster_config,
                                  topology_conf=trigger.topology_conf)
        self.seen = CheckpointSeen()
        self.lines = LineLog(self.log, self.seen.line)
        self.job: Any = None
        self.watch: JobWatch | None = None
        self._ledger: Any = None
        self._lock = threading.Lock()
        self._done = False  # ended, or let go of

    # --- the pieces -------------------------------------------------------------------------
    def ledger(self) -> Any:
        if self._ledger is None:
            from airflow_hetero_gpu.ledger import Ledger

            self._ledger = Ledger.open_existing(self.url)
        return self._ledger

    def _cluster(self) -> Any:
        """The ledger's inventory as it is now (a replacement is chosen from it), as the task's."""
        from airflow_hetero_gpu.collect.freshness import FreshInventory

        stored = self.ledger().inventory(list(self.hook.hosts))
        return FreshInventory(stored, self.t.max_age).cluster(self.hook.cluster_config())

    def _targets(self) -> tuple[Any, Any]:
        from airflow_hetero_gpu.watching.targets import LazyTargets

        hosts = self.t.hosts
        return LazyTargets(self.hook, hosts), self.hook.client_factory(hosts)

    def _kill(self) -> None:
        if self.job is not None:
            self.job.kill()

    # --- the watch --------------------------------------------------------------------------
    def start(self) -> Found | None:
        """Reattach: each host's state and offsets, the job followed from there, the lease
        taken over, and a first look."""
        from airflow_hetero_gpu.launch.remote import JobStartError, attach_job
        from airflow_hetero_gpu.launch.supervisor import Supervision
        from airflow_hetero_gpu.launch.supervisor import host_statuses
        from airflow_hetero_gpu.watching.gpu_set import GpuSetWatch
        from airflow_hetero_gpu.watching.lease import LeaseKeeper

        t = self.t
        targets, factory = self._targets()
        status = host_statuses(self.job_id, t.launch, t.hosts, targets, factory)
        said = "; ".join(f"{h}: {s.state}{' (' + s.detail + ')' if s.detail else ''}" for h, s in status.items())
        if any(s.state == "unknown" for s in status.values()):
            return "error", f"job {self.job_id}: cannot tell whether it still runs ({said})", {}
        if any(s.state == "gone" for s in status.values()):
            return "failed", f"job {self.job_id}: its launch {t.launch} is gone from a host ({said})", {}
        lease = LeaseKeeper(self.ledger, self.job_id, t.lease_seconds, log=self.log, kill=self._kill,
                            checkpoints=self.seen, renew_every=t.renew_every)
        gpu_set = GpuSetWatch(self.ledger, self.job_id, t.on_no_replacement, cluster=self._cluster,
                              kill=self._kill, log=self.log)
        self.watch = JobWatch(self.job_id, lease, gpu_set)
        sup = Supervision(t.unattended_timeout, t.preemption_signal, t.preemption_grace, t.launch)
        relayed = {h: s.relayed for h, s in status.items()}
        with self._lock:
            if self._done:  # cancelled meanwhile
                return None
            self.job = attach_job(self.job_id, [targets[h] for h in t.hosts], factory, relayed=relayed,
                                  **watch_options(t.host_timeout, sup, lease, self.lines))
            self.job.remove_run_files = False  # the task reads the exit statuses there
        try:
            self.job.start()
        except JobStartError as err:
            self.let_go()
            return "error", f"job {self.job_id}: {err}", {}
        self.log.info("job %s: watched from the triggerer on %s (launch %s); output relayed from %s", self.job_id,
                      ", ".join(t.hosts), t.launch,
                      ", ".join(f"{h} byte {o[0]}/{o[1]}" for h, o in relayed.items()))
        return self.step(wait=0.0, renew=True)

    def step(self, wait: float | None = None, renew: bool = False) -> Found | None:
        """One look (:meth:`JobWatch.step`)."""
        from airflow_hetero_gpu.launch.failures import failure_message

        assert self.watch is not None
        try:
            verdict = self.watch.step(self.job, self.gpus, wait=wait, renew=renew)
        except AirflowException as err:  # the watch stopped the job (lease lost, no replacement, ...)
            self._close()
            return "failed", str(err), {}
        if verdict.kind == "running":
            return None
        if verdict.kind == "exited":
            res = verdict.result
            self._close()
            codes = {r.host: r.exit_code for r in res.hosts}
            if res.failure is not None:
                return "failed", failure_message(self.job_id, res), {"exit_codes": codes}
            if res.killed:
                return "failed", f"job {self.job_id} was killed", {"exit_codes": codes}
            return "exited", f"job {self.job_id}: ended on every host", {"exit_codes": codes}
        self.let_go()  # the task takes it over from the offsets relayed so far
        if verdict.kind == "preempted":
            return "preempted", f"job {self.job_id}: preempted; the task stops it and waits in the queue", {}
        return "restart", (f"job {self.job_id}: its GPU set changed in the ledger; the task restarts it on "
                           f"the new set"), {}

    # --- the end ----------------------------------------------------------------------------
    def let_go(self) -> None:
        """Stop watching (the job runs on): a last heartbeat with the offsets relayed, the
        connections closed. Idempotent."""
        with self._lock:
            if self._done:
                return
            self._done = True
            job = self.job
        if job is not None:
            try:
                job.detach()
            except Exception as err:  # noqa: BLE001 - the last heartbeat's offsets stand
                self.log.warning("job %s: letting go of it: %s", self.job_id, err)
        self._close_ledger()

    def stop(self, grace: float) -> None:
        """Stop the job on every host (SIGTERM, ``grace``, SIGKILL) and release its GPUs."""
        from airflow_hetero_gpu.launch.orphans import kill_orphans, unstopped
        from airflow_hetero_gpu.watching.lease import release_if_stopped

        self.log.info("task killed: stopping job %s on every host", self.job_id)
        with self._lock:
            self._done = True
        targets, factory = self._targets()
        sweeps = kill_orphans(self.job_id, [targets[h] for h in self.t.hosts], factory, grace=grace)
        release_if_stopped(self.ledger, self.job_id, self.log, unstopped(sweeps), patience=5.0)
        self._close()

    def _close(self) -> None:
        with self._lock:
            self._done = True
        self._close_ledger()

    def _close_ledger(self) -> None:
        ledger, self._ledger = self._ledger, None
        if ledger is not None:
            try:
                ledger.close()
            except Exception:  # noqa: BLE001
                pass
