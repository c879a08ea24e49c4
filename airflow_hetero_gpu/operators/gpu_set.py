"""The replacement path of a running job (SPEC §8, S12) as the operator sees it.

At every tick of the run loop: has the ledger changed the job's GPU set (the health watch
replaced an evicted GPU)? If a GPU of the job is evicted with no replacement yet, try to replace
it now; with none available, ``on_no_replacement`` decides (``fail`` stops the job, ``wait``
keeps it running on what it has and tries again at the next tick).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from airflow.sdk.exceptions import AirflowException

GpuList = list[tuple[str, int]]


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
        self._waiting_for: set[tuple[str, int]] = set()

    def next_gpus(self, gpus: Sequence[tuple[str, int]]) -> GpuList | None:
        """The job's new GPU set when the ledger changed it (a replacement), else None."""
        ledger = self._ledger()
        res = ledger.get(self.job_id)
        if res is None:
            return None
        current = [(g.host, g.index) for g in res.gpus]
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
                msg = (f"job {self.job_id}: GPU {key[0]}:{key[1]} is abnormal ({', '.join(evicted[key])}) and no "
                       "healthy GPU of its pool can replace it")
                if self.on_no_replacement == "fail":
                    self._kill()
                    raise AirflowException(msg)
                if key not in self._waiting_for:
                    self._waiting_for.add(key)
                    self.log.warning("%s; waiting for one (on_no_replacement='wait')", msg)
            else:
                self.log.info("job %s: GPU %s:%s replaced by %s:%s", self.job_id, key[0], key[1], new.host, new.index)
                changed = True
        if changed:
            res = ledger.get(self.job_id)
            return [(g.host, g.index) for g in res.gpus]
        return None
