"""``hetero-gpu simulate --events-out FILE``: the replay step by step, one CSV line per event:

    time_s,event,job_id,gpus,detail

``start`` and ``end`` of every run of a job, ``preempt`` when the admission pass chose it as a
victim (detail: the preemptor) and ``stopped`` when its grace ended and it freed its GPUs
(detail: the work it lost), so a replay can be audited (docs/preemption.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from airflow_hetero_gpu.sim.jobs_out import _s, _write

EVENT_COLUMNS = ("time_s", "event", "job_id", "gpus", "detail")


def write_events(path: str | Path, events: Sequence[tuple]) -> None:
    rows = [(_s(t), event, job, gpus, detail) for t, event, job, gpus, detail in events]
    _write(path, "--events-out", EVENT_COLUMNS, rows)
