"""Waiting for GPUs in the ledger's queue (``wait_for_capacity=True``; docs/queue.md).

The task enqueues its request with its ``priority`` instead of re-planning on its own; the
ledger's admission pass (run by every write that frees GPUs) decides who starts and writes the
reservation. While it waits the task logs where it stands (``job J: 3rd in the queue, …``) and:

* non-deferrable: renews its entry's lease every poll (one row), reading where it stands;
* deferrable: defers to :class:`~airflow_hetero_gpu.triggers.queue.QueueTrigger`, which does the
  same in the triggerer and wakes the task once it was admitted.

Admitted, it takes the reservation and runs. A task killed, cleared or timed out while it waits
leaves the queue at once (an admission it did not take is released with it).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException

from airflow_hetero_gpu.core.admission.reasons import WaitNotes

if TYPE_CHECKING:
    from airflow_hetero_gpu.core.model import PlanResult
    from airflow_hetero_gpu.ledger import QueueRecord
    from airflow_hetero_gpu.operators.placement import Placement


class QueueWait:
    """The queue steps of one ``execute()`` (or resumption) of a :class:`HeteroTrainOperator`."""

    def __init__(self, placement: Placement):
        self.placement = placement
        self.runtime = placement.runtime
        self.request = placement.specs.request
        self.lifecycle = placement.specs.lifecycle
        self.job_id = placement.job_id
        self._notes = WaitNotes()

    @property
    def log(self) -> Any:
        return self.runtime.log

    def _ledger_call(self, fn, *args, **kwargs):
        from airflow_hetero_gpu.ledger import LedgerError, LedgerUrlError, NoQueueEntry, ReservationConflict

        try:
            return fn(*args, **kwargs)
        except NoQueueEntry:  # the entry was swept: the caller enqueues again
            raise
        except (ReservationConflict, LedgerUrlError) as err:  # a mistake: retrying cannot help
            raise self.placement._fail(str(err)) from None
        except LedgerError as err:  # unreachable or busy: the task's retries apply
            raise AirflowException(str(err)) from None

    # --- the steps ----------------------------------------------------------------------------
    def place(self, waiting_since: float | None = None) -> PlanResult:
        """Reserve now where a pool fits outside the heads' claims (the ledger's ``reserve``
        leaves claimed GPUs alone, and every write's admission pass has already started every
        waiting job the free GPUs could hold), logging every pool's evaluation; otherwise enqueue
        and, unless admitted at once, wait (or defer) until admitted."""
        result = self.placement.reserve()  # a card or task type the fleet lacks fails here
        if result.decision is not None:
            return result
        entry = self.enqueue()
        if entry.admitted:
            return self.take()
        return self.wait(entry, waiting_since)

    def resume(self, waiting_since: float | None = None) -> PlanResult:
        """Woken by the trigger as admitted: take it (expired meanwhile: enqueue again)."""
        from airflow_hetero_gpu.ledger import NoQueueEntry

        try:
            return self.take()
        except NoQueueEntry:
            self.log.warning("job %s: its admission expired before the task resumed; enqueueing again", self.job_id)
            return self.place(waiting_since)

    def enqueue(self) -> QueueRecord:
        from airflow_hetero_gpu.operators.placement import task_identity

        rt = self.runtime
        team = self.placement.team  # a malformed name fails here, before anything is enqueued
        rt.waiting_job = self.job_id
        try:
            entry = self._ledger_call(rt.ledger.enqueue, self.job_id, self.placement.request,
                                      priority=self.request.priority, lease_seconds=self.lifecycle.lease_seconds,
                                      identity=task_identity(self.placement.context), team=team,
                                      preemptible=self.request.preemptible)
        except BaseException:
            rt.waiting_job = None
            raise
        self.say(entry)
        return entry

    def say(self, entry: QueueRecord) -> None:
        """Log where the job stands when that changed (a warning, repeated, while its pools lack
        the healthy GPUs it needs)."""
        note = self._notes.note(entry.standing, entry.where())
        if note is not None:
            getattr(self.log, note[0])("job %s: %s", self.job_id, note[1])

    def take(self) -> PlanResult:
        """The admission's reservation, as the decision the run uses (logged, pushed to XCom)."""
        from airflow_hetero_gpu.text import render_plan
        from airflow_hetero_gpu.ledger import LedgerError, NoQueueEntry
        from airflow_hetero_gpu.ledger.reservations import existing_result

        rt = self.runtime
        rt.lease_from = time.monotonic()  # the lease surely lasts lease_seconds from here
        try:
            res = rt.ledger.take_admission(self.job_id)
        except NoQueueEntry:
            raise
        except LedgerError as err:  # unreachable or busy: the task's retries apply
            raise AirflowException(str(err)) from None
        rt.waiting_job = None
        outside = sorted(set(res.hosts) - set(rt.hook.hosts))
        if outside:  # the queue places on every host of the ledger's inventory: one ledger per fleet
            rt.release(self.job_id)
            raise self.placement._fail(
                f"job {self.job_id}: the ledger's queue admitted it on {', '.join(outside)}, which its ssh_conn_ids "
                f"do not name; the queue places on every host of the ledger's inventory, so give the task "
                f"every host of it (or a ledger of its own fleet)")
        cluster = self.placement.cluster or self.placement.current_cluster()
        result = existing_result(res, cluster, self.placement.request)
        self.log.info("job %s: admitted from the queue; placement:\n%s", self.job_id, render_plan(result))
        decision = result.to_json()
        inv = self.placement.inventory
        decision["inventory"] = inv.summary() if inv else None
        decision["queue"] = {"admitted": True}
        self.placement.context["ti"].xcom_push(key="decision", value=decision)
        return result

    def leave(self, why: str) -> None:
        """Leave the queue (best effort: the entry's lease ends it anyway)."""
        from airflow_hetero_gpu.ledger import LedgerError

        self.runtime.waiting_job = None
        try:
            if self.runtime.ledger.leave_queue(self.job_id):
                self.log.info("job %s: left the queue (%s)", self.job_id, why)
        except LedgerError as err:
            self.log.warning("job %s: leaving the queue failed (%s); its lease ends the entry", self.job_id, err)

    def wait(self, entry: QueueRecord, waiting_since: float | None = None) -> PlanResult:
        since = float(waiting_since) if waiting_since else time.time()
        deadline = since + self.lifecycle.capacity_timeout
        try:
            if time.time() >= deadline:
                raise AirflowException(self.timed_out(entry))
            if self.lifecycle.deferrable:
                self.defer(since, deadline)
            poll = self.lifecycle.queue_poll_interval
            while True:
                time.sleep(max(0.0, min(poll, deadline - time.time())))
                entry = self.renew()
                if entry.admitted:
                    return self.take()
                if time.time() >= deadline:
                    raise AirflowException(self.timed_out(entry))
                self.say(entry)
        except BaseException as err:
            from airflow.sdk.exceptions import TaskDeferred

            if not isinstance(err, TaskDeferred):  # killed, timed out, failed: nothing left behind
                self.leave(type(err).__name__)
            raise

    def renew(self) -> QueueRecord:
        from airflow_hetero_gpu.ledger import NoQueueEntry

        try:
            return self._ledger_call(self.runtime.ledger.renew_queue_entry, self.job_id)
        except NoQueueEntry:  # swept (the ledger was out of reach longer than the lease): in again
            self.log.warning("job %s: its queue entry expired; enqueueing again", self.job_id)
            return self.enqueue()

    def timed_out(self, entry: QueueRecord) -> str:
        return (f"job {self.job_id}: not admitted within {self.lifecycle.capacity_timeout:g} s: "
                f"{entry.where()}")

    def defer(self, since: float, deadline: float) -> None:
        from airflow_hetero_gpu.triggers.queue import QueueTrigger

        lifecycle = self.lifecycle
        self.log.info("job %s: no pool can host the job now; deferring until one can (%.0f s left of %g s)",
                      self.job_id, deadline - time.time(), lifecycle.capacity_timeout)
        # a ledger named by a connection is handed to the trigger by name: no password in its row
        self.runtime.defer(
            trigger=QueueTrigger(
                job_id=self.job_id, **self.runtime.ledger_handover(), poll_interval=lifecycle.queue_poll_interval,
                timeout=lifecycle.capacity_timeout, started_at=since,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=max(0.0, deadline - time.time()) + 60),
        )
