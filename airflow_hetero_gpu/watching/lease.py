"""The running job's lease: renewed every third of it, ridden out through a ledger outage.

The lease surely lasts until ``lease_from + lease_seconds``, where ``lease_from`` is taken
*before* the call that reserved or renewed it, never after (a slow call could otherwise make
the job believe it holds its GPUs longer than it does). When the ledger cannot be reached, the
job runs on while the lease lasts and is stopped shortly before it would run out, so its GPUs
can never be given to another job while still in use.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from airflow.sdk.exceptions import AirflowException

from airflow_hetero_gpu.ledger.errors import LedgerError, NoLiveReservation


class LeaseKeeper:
    """Renew ``job_id``'s lease as the run loop ticks; say when the job must stop.

    ``ledger`` is a callable returning the open ledger (opened lazily by the operator);
    ``kill`` stops the job's workers.
    """

    def __init__(self, ledger: Callable[[], Any], job_id: str, lease_seconds: float, *, log: Any,
                 kill: Callable[[], None], lease_from: float | None = None, checkpoints: Any = None,
                 renew_every: float | None = None):
        self._ledger = ledger
        self.job_id = job_id
        self.lease = float(lease_seconds)
        # a durable job renews at least every half unattended_timeout (``renew_every``), so the
        # lease left at any heartbeat covers the dead-man switch's timeout and grace
        self.renew_every = max(1.0, min(self.lease / 3, renew_every or self.lease))
        self.log = log
        self._kill = kill
        self.lease_from = time.monotonic() if lease_from is None else lease_from
        self.down_since: float | None = None
        self.checkpoints = checkpoints  # checkpoints.CheckpointSeen: noted in the ledger at renewals
        self.preempting: dict | None = None  # the ledger's mark: the job is preempted (docs/preemption.md)

    def due(self, now: float) -> bool:
        return now - self.lease_from >= self.renew_every

    def left(self) -> float:
        """Seconds the lease surely has left."""
        return self.lease_from + self.lease - time.monotonic()

    def renew(self, now: float) -> None:
        """Renew now (``now`` taken before the call). A lost reservation stops the job; a
        reservation marked ``preempting`` sets :attr:`preempting` for the run loop."""
        try:
            if self.checkpoints is not None:
                self.checkpoints.note(self._ledger(), self.job_id)
            self.preempting = self._ledger().renew(self.job_id, self.lease).preempting
        except NoLiveReservation:
            self._kill()
            raise AirflowException(f"job {self.job_id}: the reservation was released or its lease expired; "
                                   "the workers were stopped") from None
        self.lease_from = now

    def outage(self, err: LedgerError, now: float, margin: float) -> None:
        """The ledger could not be reached at this tick: run on while the lease lasts, or stop the
        job (and raise) when less than ``margin`` seconds of it are left."""
        if self.down_since is None:
            self.down_since = now
        left = self.left()
        if left <= margin:
            self._kill()
            raise AirflowException(
                f"job {self.job_id}: the ledger was unreachable for {time.monotonic() - self.down_since:.0f} s "
                f"and the lease runs out in {max(0.0, left):.0f} s: the workers were stopped so that "
                f"their GPUs cannot be given to another job while still in use; last error: {err}") from None
        self.log.warning("job %s: the ledger is unreachable (%s); the job runs on while its lease lasts "
                         "(%.0f s left)", self.job_id, err, left)

    def reachable(self, now: float) -> None:
        """A tick reached the ledger: log the end of an outage."""
        if self.down_since is not None:
            self.log.info("job %s: the ledger is reachable again after %.0f s; lease renewed", self.job_id,
                          now - self.down_since)
            self.down_since = None


def release(ledger: Callable[[], Any], job_id: str, log: Any, patience: float = 30.0) -> None:
    """Release the job's GPUs, retrying for ``patience`` s while the ledger is unreachable
    (its lease frees them anyway when even that fails)."""
    deadline = time.monotonic() + patience
    pause = 1.0
    while True:
        try:
            if ledger().release(job_id):
                log.info("job %s: reservation released", job_id)
            else:
                log.info("job %s: no reservation left to release (released before, or its lease had expired)", job_id)
            return
        except LedgerError as err:
            if time.monotonic() + pause > deadline:
                log.error("job %s: releasing the reservation failed (%s); its lease will free the GPUs",
                          job_id, err)
                return
            log.warning("job %s: releasing the reservation failed (%s); trying again in %.0f s",
                        job_id, err, pause)
        except Exception:  # never hide the task's own outcome behind a release problem
            log.exception("job %s: releasing the reservation failed; its lease will free the GPUs", job_id)
            return
        time.sleep(pause)
        pause = min(pause * 2, 8.0)


def release_if_stopped(ledger: Callable[[], Any], job_id: str, log: Any, unstopped: Sequence[str],
                       patience: float = 30.0) -> bool:
    """Release the job's GPUs (:func:`release`) unless a share of the job may still run on a host
    that could not be stopped (``unstopped``: a supervised job's host that is unreachable, or
    rebooting): then the reservation stays, and its lease frees the GPUs only after that host's
    dead-man switch has stopped the job (docs/durability.md, "The lease outlives the switch").
    True when released."""
    if unstopped:
        log.warning("job %s: could not stop its share on %s (unreachable): its reservation is kept, so no other "
                    "job is placed on its GPUs; its lease frees them after the dead-man switch there has stopped "
                    "it", job_id, ", ".join(unstopped))
        return False
    release(ledger, job_id, log, patience)
    return True


def forget_hosts(ledger: Callable[[], Any], job_id: str, log: Any) -> None:
    """The job ended cleanly everywhere: a later run of the same job id has nothing to sweep."""
    try:
        ledger().forget_job_hosts(job_id)
    except LedgerError as err:
        log.warning("job %s: could not clear its hosts' record (%s); a later try sweeps them", job_id, err)
