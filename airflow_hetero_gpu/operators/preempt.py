"""Being preempted, the victim's side (docs/preemption.md).

The ledger's admission pass marks the job's reservation ``preempting``; the run loop sees the
mark at its next lease renewal (:class:`~.lease.LeaseKeeper`) and calls :func:`stop`:

1. send ``preemption_signal`` (default ``SIGTERM``) to the job's processes and their groups on
   every host, over the job's own SSH connections;
2. wait up to ``preemption_grace`` seconds for every host to exit (a script that saves its
   checkpoint on the signal and exits has acknowledged), then end what is left as a kill does
   (SIGTERM, a short grace, SIGKILL);
3. ``Ledger.finish_preemption``: the GPUs are freed, the record closed with the lost work, the job
   queued again with its original priority and time enqueued — one transaction — and the
   preemptor admitted;
4. log one line that explains it and count it (``hetero_gpu.preemptions``).

A supervised job whose share on some host could not be stopped (the host unreachable) may still
run there: then step 3 does not happen. The try fails, the reservation stays marked, and its
lease, no longer renewed, frees the GPUs only after the dead-man switch there has stopped the
job; that expiry closes the record and admits the preemptor. A retry after it launches afresh.

"Exited after" is the script's exit: its torchrun workers, watched on every host apart from the
agent (:mod:`airflow_hetero_gpu.launch.workers_watch`), since torchrun itself may take seconds
more to shut down; torchrun's time is in the log line beside it (``the script exited after 0.4 s,
torchrun after 8.1 s``). A job without torchrun workers (``command=``) reports its own exit.

The task does not fail: the operator waits in the queue again (deferred when ``deferrable``)
and, admitted, relaunches with the same arguments, so the script resumes from its checkpoint.
With ``checkpoint_storage="host"`` the newest checkpoint is carried from the host it is on to the
new hosts first (:mod:`~.checkpoint_carry`).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from airflow_hetero_gpu.watching.checkpoints import CheckpointSeen

if TYPE_CHECKING:
    from airflow_hetero_gpu.operators.placement import Placement
    from airflow_hetero_gpu.operators.runtime import Runtime
    from airflow_hetero_gpu.operators.specs import LifecycleSpec

#: how much longer than the grace and the kill's grace the workers are watched (the kill's
#: wait after SIGKILL, SSH round trips)
WATCH_MARGIN_S = 30.0


def stop(lifecycle: LifecycleSpec, runtime: Runtime, placement: Placement | None, job: Any, job_id: str,
         mark: dict, lease: Any, seen: CheckpointSeen) -> dict:
    """Stop the running ``job`` for its preemptor and give its GPUs back (see the module
    docstring); returns the ledger's record of the preemption. The lease (``lease``, a
    :class:`~.lease.LeaseKeeper`) is renewed throughout: a grace longer than the lease must not
    let the GPUs go to another job while the victim still runs. ``placement`` (the try's) tags
    the count with the task's teams."""
    sig = lifecycle.preemption_signal
    grace = lifecycle.preemption_grace
    log = runtime.log
    signalled = datetime.now(timezone.utc)
    log.warning("job %s: preempted by %s (%s); sending SIG%s to it on every host, %g s to exit",
                   job_id, preemptor(mark), mark.get("reason"), sig, grace)
    # the workers are listed on every host before the signal: when did the script itself end?
    watch = job.watch_workers(grace + float(job.kill_grace) + WATCH_MARGIN_S)
    t0 = time.monotonic()
    for host, sweep in job.signal(sig).items():
        if sweep.error:
            log.warning("job %s: signalling %s: %s", job_id, host, sweep.error)
    if _ended(job, grace, lease):
        outcome = "exited"
    else:
        log.warning("job %s: still running %g s after SIG%s; ending it", job_id, grace, sig)
        killer = threading.Thread(target=job.kill, name=f"{job_id}:preempt-kill", daemon=True)
        killer.start()
        while killer.is_alive():
            killer.join(lease.renew_every)
            _renew(lease)
        job.wait()
        outcome = "killed"
    took = time.monotonic() - t0  # until torchrun (every host's command) ended
    script = watch.gone_after(t0)  # until its workers ended; None without torchrun workers
    watch.close()
    if script is not None:  # torchrun waits for its workers: a later note is the watch's own delay
        script = min(script, took)
    if seen.at is not None and seen.at != seen.noted:
        seen.note(runtime.ledger, job_id)
    _refuse_if_unstopped(job, job_id, mark)
    checkpoint = f"epoch {seen.epoch}" if seen.epoch is not None else None
    record = runtime.ledger.finish_preemption(job_id, outcome=outcome,
                                              exited_after_s=took if script is None else script,
                                              checkpoint=checkpoint, lease_seconds=lifecycle.lease_seconds)
    log.warning("job %s: %s", job_id, explain(record, signalled, None if script is None else took))
    _count(placement, record)
    return record


def _refuse_if_unstopped(job: Any, job_id: str, mark: dict) -> None:
    """A supervised job's share on a host that could not be stopped (unreachable) may still run
    there: its GPUs must not go to the preemptor. The preemption is not finished: the reservation
    stays (still marked) and the try fails; the lease, no longer renewed, frees the GPUs only
    after the dead-man switch there has stopped the job, closing the record and admitting the
    preemptor in that transaction. (A job that is not supervised ends with its sessions.)"""
    left = job.may_still_run()
    if left:
        from airflow.sdk.exceptions import AirflowException

        raise AirflowException(
            f"job {job_id}: preempted by {preemptor(mark)}, but its share on {', '.join(left)} could not be "
            f"stopped (unreachable) and may still run there: its GPUs stay reserved until its lease runs out, "
            f"after the dead-man switch there has stopped it, and only then go to the preemptor; this try fails, "
            f"and a retry after that launches afresh from the checkpoint")


def _renew(lease: Any) -> None:
    from airflow_hetero_gpu.ledger.errors import LedgerError

    try:
        lease.renew(time.monotonic())
    except LedgerError as err:  # unreachable for a moment: the lease still runs
        lease.log.warning("job %s: renewing the lease while it stops failed: %s", lease.job_id, err)


def _ended(job: Any, seconds: float, lease: Any) -> bool:
    """Wait up to ``seconds`` for every host of ``job`` to exit, renewing the lease meanwhile."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            job.wait(timeout=min(left, lease.renew_every))
            return True
        except TimeoutError:
            _renew(lease)


def preemptor(mark: dict) -> str:
    """``job J``, or ``the drain of HOST`` when a drain's deadline stops the job."""
    return f"the drain of {mark['drain']}" if mark.get("drain") else f"job {mark.get('by')}"


def seconds(value: float) -> str:
    """``0.4 s``, ``8.2 s``, ``41 s``."""
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


def explain(record: dict, signalled: datetime, torchrun_s: float | None = None) -> str:
    """``preempted by job J (priority 5 > 1): signalled at 12:00:03, the script exited after 0.4 s,
    torchrun after 8.1 s, checkpoint of epoch 12 kept, about 90 GPU-seconds of work lost; back in
    the queue``. ``record['exited_after_s']`` is the script's exit (its torchrun workers');
    ``torchrun_s`` torchrun's, when the workers were watched apart from it (else the job's only)."""
    script = record["exited_after_s"]
    if torchrun_s is None:
        how = (f"exited after {seconds(script)}" if record["outcome"] == "exited"
               else f"killed after {seconds(script)} (it did not exit within the grace)")
    elif record["outcome"] == "exited":
        how = f"the script exited after {seconds(script)}, torchrun after {seconds(torchrun_s)}"
    else:
        how = (f"the script ended after {seconds(script)}, torchrun was killed after {seconds(torchrun_s)} "
               f"(the job did not exit within the grace)")
    kept = f"checkpoint of {record['checkpoint']} kept" if record.get("checkpoint") else "no checkpoint seen"
    return (f"preempted by {preemptor(record)} ({record.get('reason')}): signalled at "
            f"{signalled.strftime('%H:%M:%S')} UTC, {how}, {kept}, about {record['lost_gpu_s']:.0f} GPU-seconds "
            f"of work lost; back in the queue with its priority and place, it resumes when admitted")


def _count(placement: Placement | None, record: dict) -> None:
    """``hetero_gpu.preemptions`` with the outcome and the victim task's teams (:mod:`.task_metrics`)."""
    from airflow_hetero_gpu.healthcheck.metrics import METRIC_PREFIX
    from airflow_hetero_gpu.operators.task_metrics import incr, team_tags

    teams = team_tags(placement.context, placement) if placement is not None else {}
    incr(f"{METRIC_PREFIX}.preemptions", {"outcome": record["outcome"], **teams})
    incr(f"{METRIC_PREFIX}.preemption.{record['outcome']}", {})


def requeue(placement: Placement) -> Any:
    """Wait in the queue again (the ledger put the entry there) until admitted; the new decision."""
    from airflow.sdk.exceptions import AirflowException

    from airflow_hetero_gpu.operators.queue_wait import QueueWait

    wait = QueueWait(placement)
    entry = placement.runtime.ledger.queue_entry(placement.job_id)
    if entry is None:
        raise AirflowException(f"job {placement.job_id}: preempted, but its queue entry is gone")
    placement.runtime.waiting_job = placement.job_id
    wait.say(entry)
    if entry.admitted:
        return wait.take()
    return wait.wait(entry, time.time())
