"""A deferred run phase: the worker hands a running durable job to a trigger, and takes it back.

With ``deferrable=True``, a durable job (``durable=True`` on an Airflow with a task state store)
is watched from the triggerer for its whole run, not only while it waits in the queue:

1. the task launches the job as always (its handle stored first), takes one look at it (the lease
   renewed, the preemption mark and the GPU set read), then lets go of it — no further line is
   relayed, each host's supervisor hears a last heartbeat with the output offsets relayed so far,
   the SSH connections close (the job runs on under its supervisors) — and defers to
   :class:`~airflow_hetero_gpu.triggers.training.TrainingRunTrigger`, freeing its worker slot;
2. the trigger watches the job with the worker's own looks (:class:`~.watch.JobWatch`) and wakes
   the task once (:func:`resume`): to finish (``exited``: release and return the result, from the
   hosts' exit statuses; ``failed``: stop what is left, release, fail with the job's message), or to
   do what needs a worker (``preempted``, ``restart``): the task reattaches as a retry does, its
   first look finds the same mark or the same new GPU set in the ledger and acts on it (the
   preemption's stop and the wait in the queue, or the restart on the new set), and once the job
   runs again it defers again; ``error`` (the trigger could not watch): the task fails, the job
   runs on (a retry reattaches; without one the hosts' dead-man switch stops it).

A job that is not durable, or an Airflow without a task state store, keeps its run phase in the
worker: a trigger could not find the job again after a triggerer restart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from airflow.sdk.exceptions import AirflowException

if TYPE_CHECKING:
    from airflow_hetero_gpu.operators.durable import DurableJob
    from airflow_hetero_gpu.operators.runtime import Runtime
    from airflow_hetero_gpu.operators.specs import Specs


def deferrer(specs: Specs, runtime: Runtime, job_id: str,
             stored: DurableJob) -> Callable[[Any, list, int], None] | None:
    """``settings.defer`` of the run loop for this task, or None when its run phase stays in the
    worker (not ``deferrable``; the caller sets it only for a supervised, stored job). The handle
    in ``stored`` notes the try that hands the job to the trigger (:meth:`DurableJob.handing_over`)."""
    if not specs.lifecycle.deferrable:
        return None

    def defer(job: Any, gpus: list, restarts: int) -> None:
        from airflow_hetero_gpu.operators.messages import fmt_gpus
        from airflow_hetero_gpu.triggers.training import TrainingRunTrigger

        trigger = TrainingRunTrigger(**trigger_kwargs(specs, runtime, job_id, job.supervision.launch, gpus))
        offsets = job.detach()
        stored.handing_over()
        runtime.log.info("job %s: running on %s; deferring: the triggerer watches it until it ends or needs a "
                         "worker (output relayed up to %s)", job_id, fmt_gpus(gpus),
                         ", ".join(f"{h} byte {o[0]}/{o[1]}" for h, o in offsets.items()))
        runtime.defer(trigger=trigger, method_name="execute_complete")

    return defer


def trigger_kwargs(specs: Specs, runtime: Runtime, job_id: str, launch: str, gpus: list) -> dict[str, Any]:
    """Everything the trigger needs, and a triggerer restart rebuilds it from (no password: a
    ledger named by a connection is handed over by name)."""
    lifecycle, fleet = specs.lifecycle, specs.fleet
    return {
        "job_id": job_id, "launch": launch, "gpus": [list(k) for k in gpus], "ssh_conn_ids": dict(runtime.hook.hosts),
        "lease_seconds": lifecycle.lease_seconds, "unattended_timeout": lifecycle.unattended_timeout,
        "renew_every": lifecycle.renew_every, "preemption_signal": lifecycle.preemption_signal,
        "preemption_grace": lifecycle.preemption_grace, "host_timeout": lifecycle.host_timeout,
        "on_no_replacement": lifecycle.on_no_replacement, "max_age": fleet.inventory_max_age,
        "cluster_config": fleet.cluster_config, "topology_conf": fleet.topology_conf, **runtime.ledger_handover(),
    }


def take_back(event: dict, job: DurableJob) -> None:
    """The trigger's event, in a worker (see the module docstring): returns when the task is to
    take the job over (reattach, as a retry does); otherwise cleans up and raises."""
    status = event.get("status")
    message = event.get("message") or f"the trigger watching the job ended with {event!r}"
    handle = job.read()
    if handle is not None:  # back in a worker: a retry of this try reattaches as after any worker's end
        job.taken_back(handle)
    if status in ("exited", "preempted", "restart"):
        if handle is None:
            raise AirflowException(f"job {job.job_id}: {message}; but its handle is gone from the task state store, "
                                   "so the task cannot take it over")
        job.log.info("%s; resuming in a worker", message)
        return
    if status == "failed":  # stopped already: nothing of it may stay, its GPUs go back
        if handle is not None:
            job.abandon(handle)
        else:
            job.runtime.release(job.job_id)
    raise AirflowException(message)
