"""The replacement path of a running job (SPEC §8, S12) as its watcher sees it.

At every tick of the run loop: has the ledger changed the job's GPU set (the health watch
replaced an evicted GPU)? If a GPU of the job is evicted with no replacement yet, try to replace
it now; with none available, ``on_no_replacement`` decides (``fail`` stops the job, ``wait``
keeps it running on what it has and tries again at the next tick).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from airflow.sdk.exceptions import AirflowException

from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.watching.intruders import IntruderWatch

GpuList = list[GpuKey]  # in rank order: the ledger keeps a job's GPUs in slot order


class GpuSetWatch:
    """Watch one job's GPU set in the ledger.

    ``ledger`` returns the open ledger; ``cluster`` returns the inventory to choose a
    replacement from (called only when a replacement is needed); ``kill`` stops the workers.
    """

    def __init__(self, ledger: Callable[[], Any], job_id: str, on_no_replacement: str, *,
                 cluster: Callable[[], Any], kill: Callable[[], None], log: Any):
        self._ledger = ledger
        self.job_id = job_id
        self.on_no_replacement = on_no_replacement
        self._cluster = cluster
        self._kill = kill
        self.log = log
        self._waiting_for: set[GpuKey] = set()
        self._devices: dict[GpuKey, str] = {}
        self._intruders = IntruderWatch(ledger, job_id, log)

    def remember(self, gpus: Iterable[Any]) -> None:
        """The ``MIG-<uuid>`` of each MIG instance among ``gpus`` (decision GPUs or the ledger's
        reserved GPUs: anything with ``key`` and ``uuid``)."""
        for g in gpus:
            if g.key.instance is not None and g.uuid:
                self._devices[g.key] = g.uuid

    def device(self, key: tuple) -> int | str:
        """What CUDA_VISIBLE_DEVICES names a GPU of the job by: its index, or a MIG instance's UUID."""
        key = GpuKey(*key)
        if key.instance is None:
            return key.index
        if key not in self._devices:
            raise AirflowException(f"job {self.job_id}: no MIG UUID known for {key}")
        return self._devices[key]

    def next_gpus(self, gpus: Sequence[tuple]) -> GpuList | None:
        """The job's new GPU set when the ledger changed it (a replacement), else None. Processes
        outside the scheduler that appeared on the job's GPUs are warned about on the way."""
        self._intruders.check(gpus)
        ledger = self._ledger()
        res = ledger.get(self.job_id)
        if res is None:
            return None
        self.remember(res.gpus)
        current = [g.key for g in res.gpus]
        if sorted(current) != sorted(gpus):
            return current
        evicted = ledger.evicted_map()
        bad = [g for g in current if g in evicted]
        if not bad:
            return None
        cluster = self._cluster()
        changed = False
        for key in bad:
            new = ledger.replace(self.job_id, key, cluster, reasons=evicted[key])
            if new is None:
                msg = (f"job {self.job_id}: GPU {key} is abnormal ({', '.join(evicted[key])}) and no "
                       "healthy GPU of its pool can replace it")
                if self.on_no_replacement == "fail":
                    self._kill()
                    raise AirflowException(msg)
                if key not in self._waiting_for:
                    self._waiting_for.add(key)
                    self.log.warning("%s; waiting for one (on_no_replacement='wait')", msg)
            else:
                self.log.info("job %s: GPU %s replaced by %s", self.job_id, key, new)
                changed = True
        if changed:
            res = ledger.get(self.job_id)
            self.remember(res.gpus)
            return [g.key for g in res.gpus]
        return None
