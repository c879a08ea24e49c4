"""What one try of the training operator shares with its helpers besides its arguments (:mod:`.specs`).

The ledger and the hosts' hook (opened on first use), the task's log, the operator's
``defer``, and two facts that change as the task runs: since when the job's lease surely lasts
(``lease_from``: the run loop's lease keeper counts from it) and the job waiting in the ledger's
queue (``waiting_job``: a task killed meanwhile leaves the queue).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from airflow_hetero_gpu.hooks.hetero_gpu import HeteroGpuHook
    from airflow_hetero_gpu.hooks.ledger import LedgerHook
    from airflow_hetero_gpu.ledger import Ledger


@dataclass
class Runtime:
    """The live objects of one operator (built by the operator; see the module docstring)."""

    open_ledger: Callable[[], Ledger]
    open_hook: Callable[[], HeteroGpuHook]
    open_ledger_hook: Callable[[], LedgerHook]
    log: Any
    #: the operator's ``defer(trigger=..., method_name=..., timeout=...)`` (raises TaskDeferred)
    defer: Callable[..., None]
    #: the operator's class name (the ``operator`` tag of the ``resumable_job.*`` metrics)
    operator: str = "HeteroTrainOperator"
    lease_from: float = field(default_factory=time.monotonic)
    waiting_job: str | None = None

    @property
    def ledger(self) -> Ledger:
        return self.open_ledger()

    @property
    def hook(self) -> HeteroGpuHook:
        return self.open_hook()

    def ledger_handover(self) -> dict[str, str | None]:
        """How a trigger finds the ledger: the connection's id where one names it (no password
        in the trigger's row), else its URL."""
        ledger_hook = self.open_ledger_hook()
        conn_id = ledger_hook.conn_id()
        return {"ledger_conn_id": conn_id, "ledger_url": None if conn_id else ledger_hook.get_url()}

    def release(self, job_id: str, patience: float = 30.0, unstopped: Sequence[str] = ()) -> bool:
        """Release the job's GPUs, retrying for ``patience`` s while the ledger is unreachable
        (its lease frees them anyway when even that fails); not while a share of the job may still
        run on a host of ``unstopped`` (:func:`~airflow_hetero_gpu.watching.lease.release_if_stopped`).
        True when released."""
        from airflow_hetero_gpu.watching.lease import release_if_stopped

        return release_if_stopped(lambda: self.ledger, job_id, self.log, unstopped, patience)
