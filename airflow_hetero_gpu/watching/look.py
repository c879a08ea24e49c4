"""One look at a running job: the decisions of its watcher, whoever watches it.

The run loop in a worker (:class:`~.run_loop.TrainingRun`) and the trigger of a deferred run
(:class:`~airflow_hetero_gpu.triggers.training.TrainingRunTrigger`) watch a job with the same
:class:`JobWatch`. Each :meth:`JobWatch.step`:

- waits up to ``check_every`` seconds for the job's end on every host (its exit statuses); the
  heartbeat to each host's dead-man switch and the relay of new output lines go on meanwhile in
  the job's own threads (:class:`~airflow_hetero_gpu.launch.remote.RemoteJob`);
- renews the lease when due (:class:`~.lease.LeaseKeeper`; a lost reservation stops the job,
  a ledger out of reach is ridden out while the lease lasts), which also reads the
  reservation's ``preempting`` mark;
- asks the ledger whether the job's GPU set changed (:class:`~.gpu_set.GpuSetWatch`: an evicted
  GPU replaced, or replaced now).

and says what the watcher must do: nothing (``running``), or act on ``exited``, ``preempted``
or ``restart``. Only the worker acts (it stops and relaunches); a trigger wakes its task for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from airflow_hetero_gpu.ledger.errors import LedgerError
from airflow_hetero_gpu.watching.gpu_set import GpuSetWatch
from airflow_hetero_gpu.watching.lease import LeaseKeeper


@dataclass
class Verdict:
    """What one look found: ``running``, ``exited`` (``result``: the job's JobResult),
    ``preempted`` (``mark``: the reservation's) or ``restart`` (``next_gpus``)."""

    kind: str
    result: Any = None
    mark: dict | None = None
    next_gpus: list = field(default_factory=list)


RUNNING = Verdict("running")


class JobWatch:
    """The per-look decisions about one launch of ``job_id`` on ``gpus``."""

    def __init__(self, job_id: str, lease: LeaseKeeper, gpu_set: GpuSetWatch, *,
                 stops_on_preemption: bool = True):
        self.job_id = job_id
        self.lease = lease
        self.gpu_set = gpu_set
        self.stops_on_preemption = stops_on_preemption
        self.check_every = min(lease.renew_every, 5.0)

    def step(self, job: Any, gpus: list, *, wait: float | None = None, renew: bool = False) -> Verdict:
        """One look (see the module docstring). ``renew``: renew the lease now, due or not (a
        watcher taking the job over reads the preemption mark at once)."""
        try:
            return Verdict("exited", result=job.wait(timeout=self.check_every if wait is None else wait))
        except TimeoutError:
            pass
        now = time.monotonic()
        try:
            if renew or self.lease.due(now):
                self.lease.renew(now)
            next_gpus = self.gpu_set.next_gpus(gpus)
        except LedgerError as err:
            self.lease.outage(err, now, margin=self.check_every + 1.0)
            return RUNNING
        self.lease.reachable(now)
        if self.lease.preempting is not None and self.stops_on_preemption:
            return Verdict("preempted", mark=self.lease.preempting)
        if next_gpus is not None:
            return Verdict("restart", next_gpus=list(next_gpus))
        return RUNNING


def watch_options(host_timeout: float, supervision: Any, lease: LeaseKeeper,
                  on_line: Callable[[str, int, str, str], None] | None) -> dict[str, Any]:
    """The :class:`~airflow_hetero_gpu.launch.remote.RemoteJob` options of a watched job: its
    keepalives (every quarter of ``host_timeout``, and of ``unattended_timeout`` when supervised)
    and, supervised, the heartbeats' seconds bounded by the lease's time surely left."""
    from airflow_hetero_gpu.launch.supervisor import LEASE_MARGIN_S

    keepalive = float(host_timeout) / 4
    options: dict[str, Any] = {"on_line": on_line, "host_timeout": float(host_timeout)}
    if supervision is not None:
        keepalive = min(keepalive, supervision.unattended_timeout / 4)
        options.update(supervision=supervision,
                       heartbeat_budget=lambda: lease.left() - supervision.grace - LEASE_MARGIN_S)
    options["keepalive_interval"] = keepalive
    return options
