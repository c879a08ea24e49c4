"""A running job's GPUs that gain a process outside the scheduler: a warning, not an eviction.

Someone starts a notebook on a GPU a job holds: both slow down, or one runs out of memory. The
scheduler did not cause it and cannot undo it, so the job runs on; its log says who, once per
process, as soon as a collection stored in the ledger shows it (docs/health.md).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from airflow_hetero_gpu.core.foreign import intruders
from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.errors import HeteroGpuError


class IntruderWatch:
    """Checks the job's GPUs whenever the ledger's inventory changed (``check`` every tick)."""

    def __init__(self, ledger: Callable[[], Any], job_id: str, log: Any):
        self._ledger = ledger
        self.job_id = job_id
        self.log = log
        self._version: Any = None
        self._warned: set[tuple[GpuKey, int]] = set()

    def check(self, gpus: Iterable[tuple]) -> None:
        from airflow_hetero_gpu.core.inventory import XIDS_FROM_LEDGER, cluster_from_captures

        ledger = self._ledger()
        version = ledger.inventory_version()
        if version == self._version:
            return
        self._version = version
        keys = [GpuKey(*k) for k in gpus]
        stored = ledger.inventory(sorted({k.host for k in keys}))  # a LedgerError: the run loop's outage rule
        try:
            cluster = cluster_from_captures(stored.captures(), xid_rule=XIDS_FROM_LEDGER)
        except HeteroGpuError as err:  # an unreadable stored output: the readers report it; the job runs on
            self.log.debug("job %s: GPU processes not checked: %s", self.job_id, err)
            return
        for key in keys:
            if key not in cluster.position:
                continue
            for proc in intruders(cluster.gpu(key), self.job_id):
                if (key, proc.pid) not in self._warned:
                    self._warned.add((key, proc.pid))
                    self.log.warning("job %s: GPU %s is also in use outside the scheduler: %s (the job runs on; "
                                     "the GPU is not evicted)", self.job_id, key, proc.describe())


__all__ = ["IntruderWatch"]
