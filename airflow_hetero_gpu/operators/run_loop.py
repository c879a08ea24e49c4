"""The training's run loop: start torchrun on every host, tick until it ends, restart on a new GPU set.

One *run* is one launch of the workers on one GPU set. While it runs, the loop looks at it every
``min(lease / 3, 5 s)`` with :class:`~airflow_hetero_gpu.watching.look.JobWatch` (the same looks a deferred run's trigger
takes): renew the lease when due (:class:`~airflow_hetero_gpu.watching.lease.LeaseKeeper`), and ask the ledger whether the
job's GPU set changed (:class:`~airflow_hetero_gpu.watching.gpu_set.GpuSetWatch`). A changed set
stops the workers and starts a new run on the new set (resuming from the job's checkpoint), at
most ``max_restarts`` times. Any worker failing ends the job with the first failure's message.
A renewal that finds the reservation marked ``preempting`` hands the job to ``on_preempted``
(:func:`~.preempt.stop`): the run ends as ``preempted``, its GPUs given back, and the operator
waits in the queue to run again (docs/preemption.md). A deferred run phase (``settings.defer``)
hands the job to a trigger once it has started on every host (:mod:`~.run_phase`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_hetero_gpu.watching.gpu_set import GpuSetWatch
from airflow_hetero_gpu.watching.lease import LeaseKeeper
from airflow_hetero_gpu.launch.failures import failure_message
from airflow_hetero_gpu.operators.messages import fmt_gpus
from airflow_hetero_gpu.watching.look import RUNNING, JobWatch, watch_options


@dataclass
class RunSettings:
    """How to launch the workers (from the operator's arguments)."""

    spec: Any  # launch.command.LaunchSpec
    rdzv_port: int | str = "probe"
    rdzv_host: str | None = None
    host_timeout: float = 60.0
    max_restarts: int = 3
    on_line: Callable[[str, int, str, str], None] | None = None
    on_preempted: Callable[..., dict] | None = None  # (job, gpus, mark, lease) -> the preemption's record
    #: durable: ``supervise(launch token)`` -> the hosts' Supervision; None runs the job beside a
    #: session watchdog (it ends with the SSH sessions)
    supervise: Callable[[str], Any] | None = None
    #: ``before_launch(gpus, launch token, restarts)``: the job's handle stored before it starts
    before_launch: Callable[[list, str, int], None] | None = None
    #: a deferred run phase: ``defer(job, gpus, restarts)``, called once the job has started on
    #: every host and a first look found nothing to do; it hands the job to a trigger (raises
    #: TaskDeferred)
    defer: Callable[[Any, list, int], None] | None = None


class TrainingRun:
    """Runs one job to its end on the hosts of ``targets`` (host label -> SshTarget)."""

    def __init__(self, job_id: str, settings: RunSettings, targets: Mapping[str, Any], factory: Any, *,
                 lease: LeaseKeeper, gpu_set: GpuSetWatch, log: Any,
                 on_job: Callable[[Any], None] = lambda job: None,
                 on_started: Callable[[], None] = lambda: None):
        self.job_id = job_id
        self.settings = settings
        self.targets = targets
        self.factory = factory
        self.lease = lease
        self.gpu_set = gpu_set
        self.log = log
        self._on_job = on_job
        self._on_started = on_started  # each time the job has started on every host
        self.job = None

    def kill(self) -> None:
        if self.job is not None:
            self.job.kill()

    def run(self, gpus: Sequence[tuple[str, int]], attach: dict | None = None) -> tuple[list[dict[str, Any]], int]:
        """Run on ``gpus`` (restarting on replacements); returns every run's facts and the restarts.
        ``attach``: the handle of a supervised job already running on ``gpus`` (a retry's reattach)."""
        gpus = list(gpus)
        restarts = int(attach.get("restarts", 0)) if attach else 0
        runs: list[dict[str, Any]] = []
        while True:
            outcome, facts = self.run_once(gpus, attach, restarts)
            attach = None
            runs.append(facts)
            if outcome in ("done", "preempted"):
                return runs, restarts
            # outcome == "restart": the ledger's GPU set changed (replacement)
            restarts += 1
            if restarts > self.settings.max_restarts:
                raise AirflowException(f"job {self.job_id}: GPUs replaced {restarts} times, more than "
                                       f"max_restarts={self.settings.max_restarts}")
            gpus = facts["next_gpus"]
            self.log.info("job %s: restarting on %s (restart %d of at most %d), resuming from its checkpoint",
                          self.job_id, fmt_gpus(gpus), restarts, self.settings.max_restarts)

    def _job_of(self, gpus: Sequence[tuple], attach: dict | None, restarts: int) -> Any:
        """The :class:`RemoteJob` of this run: a fresh launch, or a reattach to ``attach``'s job."""
        import uuid

        from airflow_hetero_gpu.launch.remote import attach_job, torchrun_job

        s = self.settings
        sup = s.supervise(attach["launch"] if attach else uuid.uuid4().hex[:16]) if s.supervise is not None else None
        common = watch_options(s.host_timeout, sup, self.lease, s.on_line)
        hosts = list(dict.fromkeys(k[0] for k in gpus))  # in rank order, as the GPU list has them
        if attach is not None:
            return attach_job(self.job_id, [self.targets[h] for h in hosts], self.factory,
                              relayed={h: tuple(v) for h, v in attach.get("relayed", {}).items()}, **common)
        by_host: dict[str, list[int | str]] = {}
        for key in gpus:
            by_host.setdefault(key[0], []).append(self.gpu_set.device(key))
        placements = [(self.targets[h], tuple(sorted(ix, key=str) if any(isinstance(i, str) for i in ix) else sorted(ix)))
                      for h, ix in by_host.items()]
        job = torchrun_job(s.spec, placements, self.factory, rdzv_port=s.rdzv_port, rdzv_address=s.rdzv_host,
                           **common)
        if s.before_launch is not None and job.supervision is not None:
            s.before_launch(list(gpus), job.supervision.launch, restarts)
        return job

    def run_once(self, gpus: Sequence[tuple], attach: dict | None = None, restarts: int = 0) -> tuple[str, dict[str, Any]]:
        from airflow_hetero_gpu.launch.remote import JobStartError

        job = self._job_of(gpus, attach, restarts)
        self.job = job
        self._on_job(job)
        if attach is None:
            self.log.info("job %s: starting on %s", self.job_id, fmt_gpus(gpus))
        else:
            self.log.info("job %s: reattached on %s", self.job_id, fmt_gpus(gpus))
        try:
            job.start()
        except JobStartError as err:  # one line, without the SSH library's internals
            raise AirflowException(f"job {self.job_id}: {err}") from None
        self._on_started()
        watch = JobWatch(self.job_id, self.lease, self.gpu_set,
                         stops_on_preemption=self.settings.on_preempted is not None)
        verdict = RUNNING
        if self.settings.defer is not None:  # one look now (the preemption mark read), then defer
            verdict = watch.step(job, list(gpus), wait=0.0, renew=True)
            if verdict.kind == "running":
                self.settings.defer(job, list(gpus), restarts)  # raises TaskDeferred
        while verdict.kind == "running":
            verdict = watch.step(job, list(gpus))
        next_gpus = None
        if verdict.kind == "preempted":
            record = self.settings.on_preempted(job, gpus, verdict.mark, self.lease)
            return "preempted", {"gpus": list(gpus), "preempted": record, "hosts": [], "exit_codes": {}}
        if verdict.kind == "restart":
            next_gpus = verdict.next_gpus
            self.log.warning("job %s: its GPU set changed in the ledger; stopping the workers", self.job_id)
            job.kill()
            res = job.wait()
        else:
            res = verdict.result
        facts = {"hosts": [r.host for r in res.hosts], "exit_codes": {r.host: r.exit_code for r in res.hosts},
                 "gpus": list(gpus)}
        if next_gpus is not None:
            facts["next_gpus"] = next_gpus
            return "restart", facts
        if res.failure is not None:
            raise AirflowException(failure_message(self.job_id, res))
        if res.killed:
            raise AirflowException(f"job {self.job_id} was killed")
        return "done", facts


def check_launch_paths(spec: Any, targets: Sequence[Any], factory: Any) -> None:
    """The script and workdir exist on every chosen host (checked on the start's connections,
    before torchrun): else the task fails without retries, naming hosts and paths."""
    from airflow_hetero_gpu.launch.preflight import LaunchPathError, check_paths

    try:
        check_paths(spec, targets, factory)
    except LaunchPathError as err:
        raise AirflowFailException(str(err)) from None
