"""Durable execution: the job's handle in Airflow's task state store, and what a retry does with it.

A durable task (``durable=True``, the default, on an Airflow with a task state store) launches its
job detached under each host's supervisor (:mod:`airflow_hetero_gpu.launch.supervisor`) and, before
the job starts, stores the job's **handle** under :data:`HANDLE_KEY`: the job id, its hosts and
GPUs in rank order, this launch's token (the ``HETERO_GPU_LAUNCH`` marker), the reservation, the
decision and the handle format's version. A retry of the same task instance reads it first
(:meth:`DurableJob.resume`), following ``ResumableJobMixin``'s contract and metrics:

- the job still runs on every host: **reattach** — no launch, no reservation; the lease is taken
  over (renewed by this try) and the output relayed from where the last watcher stopped;
- the job ended with status 0 everywhere: return its result (the reservation released);
- it failed, vanished, or its reservation is gone: stop what is left of it, release what it held,
  forget the handle and launch afresh (from the checkpoint, as a retry always did);
- a host cannot be asked (unreachable): the job may still run there, so nothing is launched or
  released while its reservation lives; once its lease has run out (which it does only after the
  dead-man switch there has stopped the job) the retry launches afresh without that host's word.
- an earlier try handed the job to a trigger (a deferred run phase) and ended while deferred (the
  task was cleared): never reattached; the trigger's ``on_kill`` stops it, and this try waits until
  its reservation is gone, then launches afresh.

A handle of another format version: the task fails in one line, nothing launched or reserved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Mapping

from airflow.sdk.exceptions import AirflowException, AirflowFailException

if TYPE_CHECKING:
    from airflow_hetero_gpu.operators.placement import Placement
    from airflow_hetero_gpu.operators.runtime import Runtime
    from airflow_hetero_gpu.operators.specs import LifecycleSpec

#: The task state store key of the job's handle (like ResumableJobMixin's ``external_id_key``:
#: renaming it breaks the retries of tasks in flight).
HANDLE_KEY = "hetero_gpu_job"
#: The handle format this code writes and reads.
HANDLE_VERSION = 1


def _stats_incr(name: str, tags: Mapping[str, str]) -> None:
    from airflow_hetero_gpu.operators.task_metrics import incr

    incr(name, tags)


@dataclass
class Resumed:
    """What a retry found: ``handle`` to reattach to, or ``result`` of a job that succeeded."""

    handle: dict | None = None
    result: dict | None = None


class DurableJob:
    """The handle of one task instance's job in the task state store (``None`` store: off).
    ``placement``: the try's placement, when it has one (its team tags the metrics)."""

    def __init__(self, lifecycle: LifecycleSpec, runtime: Runtime, context: Any, job_id: str,
                 placement: Placement | None = None):
        self.lifecycle = lifecycle
        self.runtime = runtime
        self.log = runtime.log
        self.placement = placement
        self.job_id = job_id
        self.store = context.get("task_state_store") if lifecycle.durable else None
        if lifecycle.durable and self.store is None:
            self.log.warning("job %s: this Airflow has no task state store (it came in Airflow 3.3): a retry "
                           "cannot reattach to a running job, so the job runs as before, stopped with its "
                           "SSH sessions", job_id)
        self.context = context
        self._tags: dict[str, str] | None = None

    @property
    def tags(self) -> dict[str, str]:
        """The ``resumable_job.*`` metrics' tags: the operator and the task's teams (:mod:`.task_metrics`)."""
        if self._tags is None:
            from airflow_hetero_gpu.operators.task_metrics import team_tags

            self._tags = {"operator": self.runtime.operator, **team_tags(self.context, self.placement)}
        return self._tags

    @property
    def on(self) -> bool:
        return self.store is not None

    # --- the handle ---------------------------------------------------------------------------
    def read(self) -> dict | None:
        if not self.on:
            return None
        handle = self.store.get(HANDLE_KEY)
        if handle is None:
            return None
        version = handle.get("version") if isinstance(handle, dict) else None
        if version != HANDLE_VERSION or handle.get("job_id") != self.job_id:
            raise AirflowFailException(
                f"task_state_store entry {HANDLE_KEY!r} has handle format version {version!r} (job "
                f"{handle.get('job_id') if isinstance(handle, dict) else '?'!r}); this provider reads version "
                f"{HANDLE_VERSION} of job {self.job_id!r}: nothing was launched or reserved; stop that job on its "
                f"hosts (its process groups are in ~/.hetero-gpu/run/<job id>/<host>.pgid) and delete the entry "
                f"to start afresh")
        return handle

    def save(self, handle: dict) -> None:
        if self.on:
            self.store.set(HANDLE_KEY, {"version": HANDLE_VERSION, "job_id": self.job_id, **handle})

    def forget(self) -> None:
        if self.on:
            try:
                self.store.delete(HANDLE_KEY)
            except Exception as err:  # noqa: BLE001 - a stale handle is checked on the hosts anyway
                self.log.warning("job %s: could not delete its handle from the task state store: %s",
                                    self.job_id, err)

    def launching(self, launch: str, gpus: list, decision: dict, initial: list, restarts: int) -> None:
        """Stored before the job starts on any host (each launch: the first, and each restart)."""
        self.save({"launch": launch, "hosts": list(dict.fromkeys(k[0] for k in gpus)),
                   "gpus": [list(k) for k in gpus], "initial_gpus": [list(k) for k in initial],
                   "reservation": {"job_id": self.job_id, "gpus": [list(k) for k in gpus]},
                   "decision": decision, "restarts": restarts,
                   "unattended_timeout": self.lifecycle.unattended_timeout,
                   "started_at": datetime.now(timezone.utc).isoformat()})

    def _try_number(self) -> int | None:
        ti = self.context.get("ti") if self.context is not None else None
        return getattr(ti, "try_number", None)

    def handing_over(self) -> None:
        """The run phase is handed to a trigger (``deferrable=True``): the handle notes this try, so
        that a later try knows the job was left to a trigger (:meth:`_wait_for_the_triggers_stop`)."""
        handle = self.read()
        if handle is not None:
            self.save({**handle, "deferred_try": self._try_number()})

    def taken_back(self, handle: dict) -> None:
        """The trigger woke the task in a worker: the job is this worker's again."""
        if handle.get("deferred_try") is not None:
            self.save({k: v for k, v in handle.items() if k != "deferred_try"})

    def _wait_for_the_triggers_stop(self, handle: dict) -> None:
        """A try that finds the job handed to a trigger by an earlier try, and never taken back: that
        try ended while deferred, which only a person's action does (the task cleared, or marked
        failed and cleared later). Airflow then cancels the trigger and calls its ``on_kill``, which
        stops the job and releases its reservation; but it does so at the triggerer's next loop, and
        this try can start before that (seen: a second after the clear). So this try never
        reattaches: it waits until the reservation is gone (released by that stop, or run out, which
        it does only after the hosts' dead-man switch has stopped the job) and then launches afresh,
        so the trigger's stop can neither kill its launch nor release its reservation (one job id)."""
        held = self._held_until()
        if held is None:
            return
        self.log.warning("job %s: try %s handed it to a trigger and ended while deferred (the task was cleared): "
                         "the trigger's on_kill stops it; waiting until its reservation is released (at the latest "
                         "when its lease runs out, %s) before launching afresh", self.job_id,
                         handle["deferred_try"], held)
        deadline = time.monotonic() + self.lifecycle.lease_seconds + 60
        while held is not None:
            if time.monotonic() > deadline:
                raise AirflowException(f"job {self.job_id}: the earlier try's reservation is still held ({held}); "
                                       "nothing was launched")
            time.sleep(1.0)
            held = self._held_until()
        self.log.info("job %s: the earlier try's reservation is gone", self.job_id)

    # --- a retry ------------------------------------------------------------------------------
    def host_status(self, handle: dict) -> dict:
        """Each host's :class:`~airflow_hetero_gpu.launch.supervisor.HostStatus` of the handle's launch."""
        from airflow_hetero_gpu.launch.supervisor import host_statuses
        from airflow_hetero_gpu.watching.targets import LazyTargets

        hosts, hook = list(handle["hosts"]), self.runtime.hook
        return host_statuses(self.job_id, handle["launch"], hosts, LazyTargets(hook, hosts), hook.client_factory(hosts))

    def resume(self) -> Resumed:
        """ResumableJobMixin's decision for this try: reattach, the result, or a fresh launch."""
        handle = self.read()
        if handle is None:
            if self.on:
                _stats_incr("resumable_job.fresh_submit", self.tags)
            return Resumed()
        if handle.get("deferred_try") not in (None, self._try_number()):  # cleared while deferred
            self._wait_for_the_triggers_stop(handle)
            _stats_incr("resumable_job.terminal_resubmit", self.tags)
            return self._abandon_for_a_fresh_launch(handle)
        _stats_incr("resumable_job.reconnect_attempt", self.tags)
        log = self.log
        status = self.host_status(handle)
        states = {s.state for s in status.values()}
        said = "; ".join(f"{h}: {s.state}{' (' + s.detail + ')' if s.detail else ''}" for h, s in status.items())
        if "unknown" in states:  # a host we cannot ask may still run it: its GPUs must stay held
            held = self._held_until()
            if held is not None:
                raise AirflowException(f"job {self.job_id}: cannot tell whether the earlier try's job still runs "
                                       f"({said}); nothing was launched or released; its lease holds the GPUs until "
                                       f"its hosts' dead-man switch has stopped it, at the latest until {held}; a try "
                                       "after that launches afresh")
            log.warning("job %s: cannot ask every host of the earlier try's job (%s), but its reservation is gone: "
                        "its lease ran out, which it does only after the dead-man switch there has stopped the job; "
                        "stopping what is left where reachable and launching afresh", self.job_id, said)
            return self._abandon_for_a_fresh_launch(handle)
        if states <= {"running", "succeeded"} and "running" in states and self._take_lease():
            _stats_incr("resumable_job.reconnect_success", self.tags)
            log.info("job %s: still running on %s (launch %s): reattaching, nothing launched or reserved; "
                     "its output is relayed from where the last try stopped", self.job_id,
                     ", ".join(handle["hosts"]), handle["launch"])
            handle["relayed"] = {h: list(s.relayed) for h, s in status.items()}
            return Resumed(handle=handle)
        if states == {"succeeded"}:
            _stats_incr("resumable_job.already_succeeded", self.tags)
            log.info("job %s: it ended successfully on every host; not launched again",
                     self.job_id)
            return Resumed(result=self._finished(handle, status))
        _stats_incr("resumable_job.terminal_resubmit", self.tags)
        log.warning("job %s: the earlier try's job cannot be reattached (%s); stopping what is left of it, "
                    "releasing what it held and launching afresh", self.job_id, said)
        return self._abandon_for_a_fresh_launch(handle)

    def _abandon_for_a_fresh_launch(self, handle: dict) -> Resumed:
        """:meth:`abandon`, then a fresh launch; none while a host's share may still run."""
        unstopped = self.abandon(handle)
        if unstopped:  # it may still run there: nothing launched, its GPUs stay held
            raise AirflowException(f"job {self.job_id}: what is left of the earlier try's job could not be stopped "
                                   f"on {', '.join(unstopped)}; nothing was launched or released; its lease holds "
                                   "the GPUs until its hosts' dead-man switch has stopped it")
        return Resumed()

    def _take_lease(self) -> bool:
        """Take the job's lease over; False when the reservation is gone (it cannot run on)."""
        from airflow_hetero_gpu.ledger.errors import LedgerError, NoLiveReservation

        try:
            self.runtime.ledger.renew(self.job_id, self.lifecycle.lease_seconds)
        except NoLiveReservation:
            self.log.warning("job %s: still running, but its reservation is gone", self.job_id)
            return False
        except LedgerError as err:
            raise AirflowException(f"job {self.job_id}: taking over its lease failed: {err}") from None
        self.runtime.lease_from = time.monotonic()
        return True

    def abandon(self, handle: dict) -> list[str]:
        """Stop what is left of the handle's job on its hosts, release its GPUs, forget the handle.
        A host that cannot be swept (unreachable) may still run its share: then nothing is released
        or forgotten (its lease outlives the dead-man switch there); returns such hosts."""
        from airflow_hetero_gpu.launch.orphans import kill_orphans, unstopped
        from airflow_hetero_gpu.watching.targets import LazyTargets

        hosts, hook = list(handle["hosts"]), self.runtime.hook
        targets = LazyTargets(hook, hosts)
        grace = self.lifecycle.preemption_grace
        sweeps = kill_orphans(self.job_id, [targets[h] for h in hosts], hook.client_factory(hosts),
                              grace=min(grace, 30.0))
        for host, sweep in sweeps.items():
            if sweep.found:
                self.log.warning("stopped %d leftover process(es) of job %s on %s", len(sweep.found),
                                 self.job_id, host)
        left = unstopped(sweeps)
        if left and self._held_until() is None:  # its lease ran out: the switch there has stopped it
            self.log.warning("job %s: %s could not be swept, but the job's lease has run out, which it does only "
                             "after the dead-man switch there has stopped it; forgetting it", self.job_id,
                             ", ".join(left))
            left = []
        if self.runtime.release(self.job_id, unstopped=left):
            self.forget()
        return left

    def _held_until(self) -> str | None:
        """When the job's live reservation expires (``12:04:31 UTC``); None when it has none (its
        lease ran out, or it was released). A ledger that cannot be read counts as held."""
        from airflow_hetero_gpu.ledger.errors import LedgerError

        try:
            reservation = self.runtime.ledger.get(self.job_id)
        except LedgerError as err:
            return f"its lease ends (the ledger could not be read: {err})"
        if reservation is None:
            return None
        ends = reservation.expires_at
        ends = ends.replace(tzinfo=timezone.utc) if ends.tzinfo is None else ends.astimezone(timezone.utc)
        return ends.strftime("%H:%M:%S UTC")

    def _finished(self, handle: dict, status: dict) -> dict:
        from airflow_hetero_gpu.launch.supervisor import cleanup_command, quick_exec

        from airflow_hetero_gpu.watching.targets import LazyTargets

        self.runtime.release(self.job_id)
        factory = self.runtime.hook.client_factory(handle["hosts"])
        targets = LazyTargets(self.runtime.hook, handle["hosts"])
        for host in handle["hosts"]:
            try:
                client = factory(targets[host])
                try:
                    quick_exec(client.get_transport(), cleanup_command(self.job_id, host, handle["launch"]))
                finally:
                    client.close()
            except Exception as err:  # noqa: BLE001 - the next launch replaces them
                self.log.warning("job %s: removing its run files on %s failed: %s", self.job_id, host, err)
        started = datetime.fromisoformat(handle["started_at"])
        final = [tuple(k) for k in handle["gpus"]]
        facts = {"hosts": list(handle["hosts"]), "exit_codes": {h: s.exit_code for h, s in status.items()},
                 "gpus": final}
        out = output(self.job_id, handle["decision"], [tuple(k) for k in handle["initial_gpus"]], facts,
                     int(handle.get("restarts", 0)), (datetime.now(timezone.utc) - started).total_seconds())
        self.forget()
        return out


def output(job_id: str, decision: dict, initial: list, facts: dict, restarts: int, duration_s: float) -> dict:
    """The task's return value: the decision's ``pool``, ``gpus``, ``hosts``, ``score``, plus
    ``job_id`` and ``run`` (docs/operator.md)."""
    from airflow_hetero_gpu.operators.messages import key_json

    out = dict(decision)
    final = facts["gpus"]
    if restarts:  # the GPUs the job finished on; the first placement stays in run.initial_gpus
        by_key = {(g["host"], g["index"], g.get("instance")): g for g in decision["gpus"]}
        out["gpus"] = [by_key.get((k[0], k[1], k[2] if len(k) > 2 else None), key_json(k)) for k in final]
        out["hosts"] = list(dict.fromkeys(k[0] for k in final))
    out["job_id"] = job_id
    out["run"] = {"duration_s": round(duration_s, 3), "restarts": restarts,
                  "hosts": facts["hosts"], "exit_codes": facts["exit_codes"],
                  "gpus": [key_json(k) for k in final],
                  "initial_gpus": [key_json(k) for k in initial]}
    return out
