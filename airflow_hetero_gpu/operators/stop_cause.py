"""Whose stop is it? A durable job ends when someone decided the task should stop, not whenever
the task's process is being stopped under it (docs/durability.md, "on_kill").

Airflow sends a running task's process SIGTERM, and with it calls ``on_kill``, for different
reasons:

- a person marked the task failed or success, or cleared it: the api-server answered the task
  supervisor's heartbeat that the task should not run any more (its state is no longer
  ``running``);
- the supervisor could not reach the api-server for ``[workers] max_failed_heartbeats``
  heartbeats in a row: an api-server or metadata database restart, which every deploy does;
- the worker's machine signals every process as it shuts down (systemd's default
  ``KillMode=control-group``), or someone ``kill``\\ s the task process.

Only the first is a decision about the job. A job that is not durable cannot outlive its task
anyway (its hosts' watchdogs stop it with its SSH sessions), so it is stopped in every case, as
before. A durable job is stopped when the task's state, asked of the api-server through the
task's supervisor, says the task was stopped (:data:`STOPPED_STATES`); when the state is still
``running`` or ``up_for_retry``/``queued`` (Airflow retries the task, whose next try reattaches),
or when the state cannot be read within :data:`ASK_TIMEOUT_S` (the api-server is down), the job
runs on under its hosts' dead-man switch with its reservation, and the next try reattaches to
it. Nobody stops a job wrongly this way: a person's stop that could not be read is enforced by
the switch within ``unattended_timeout``.
"""

from __future__ import annotations

import threading
from typing import Any

#: the task's states that mean someone stopped it: marked failed, success or skipped, cleared
#: (``restarting``, or no state), removed from the DAG
STOPPED_STATES = frozenset({"failed", "success", "skipped", "removed", "restarting", "upstream_failed", None})
#: Airflow kills the process 5 s after SIGTERM: the answer must come before that
ASK_TIMEOUT_S = 3.0


def task_state(context: Any, timeout: float = ASK_TIMEOUT_S) -> tuple[bool, str | None]:
    """The task instance's state as the api-server has it now: ``(True, state)``, or
    ``(False, why)`` when it could not be read within ``timeout`` seconds."""
    ti = context.get("ti") if context is not None else None
    if ti is None:
        return False, "no task instance in the context"
    answer: dict[str, Any] = {}

    def ask() -> None:
        try:
            from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

            map_index = getattr(ti, "map_index", -1)
            states = RuntimeTaskInstance.get_task_states(
                dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id],
                map_index=map_index if map_index is not None and map_index >= 0 else None)
            key = ti.task_id if map_index is None or map_index < 0 else f"{ti.task_id}_{map_index}"
            row = states.get(ti.run_id, {})
            answer["state"] = str(row[key]) if row.get(key) is not None else None
            if key not in row:
                answer["error"] = "the api-server does not know the task instance"
        except BaseException as err:  # noqa: BLE001 - any failure means: not known
            answer["error"] = f"{type(err).__name__}: {err}"

    asker = threading.Thread(target=ask, name="hetero-gpu-task-state", daemon=True)
    asker.start()
    asker.join(timeout)
    if asker.is_alive():
        return False, f"no answer within {timeout:g} s (the api-server may be down)"
    if "error" in answer:
        return False, answer["error"]
    state = answer.get("state")
    return True, None if state is None else state.rsplit(".", 1)[-1].lower()


def stopped_by_decision(context: Any) -> tuple[bool, str]:
    """Whether the task is being stopped because someone decided so (see the module docstring),
    and the words for the log."""
    known, state = task_state(context)
    if not known:
        return False, f"its state could not be read: {state}"
    if state in STOPPED_STATES:
        return True, f"the task is {state or 'cleared'}"
    return False, f"the task is still {state}"


def stop_or_let_run(job: Any, context: Any, unattended_timeout: float, log: Any) -> str | None:
    """``on_kill``'s decision for the running ``job`` (a :class:`~airflow_hetero_gpu.launch.RemoteJob`):
    the words to add to "stopping job J" when it must stop (``""`` for a job that is not
    durable), or None, logged, when a durable job runs on."""
    if job.supervision is None:
        return ""
    decided, why = stopped_by_decision(context)
    if decided:
        return f" ({why})"
    log.warning("job %s: the task's process is being stopped, but nobody stopped the task (%s): the job runs on "
                "under its hosts' dead-man switch (unattended_timeout %g s) and keeps its reservation; the task's "
                "next try reattaches to it", job.job_id, why, unattended_timeout)
    return None
