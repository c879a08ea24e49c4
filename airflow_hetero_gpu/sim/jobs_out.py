"""``hetero-gpu simulate --jobs-out FILE``: one CSV line per job that ran, so anyone can compute
waits, shares or lost work over any window:

    job_id,team,priority,gpus,arrival_s,start_s,end_s,preemptions,lost_gpu_s

``start_s`` is the job's first start, ``end_s`` its last end; ``preemptions`` how often it was
preempted and ``lost_gpu_s`` the GPU-seconds of work it lost to them (docs/preemption.md).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

from airflow_hetero_gpu.errors import HeteroGpuError

JOB_COLUMNS = ("job_id", "team", "priority", "gpus", "arrival_s", "start_s", "end_s", "preemptions", "lost_gpu_s")


def write_jobs(path: str | Path, records: Sequence) -> None:
    """Write ``records`` (engine.JobRecord) to ``path``; an unwritable path is a one-line error."""
    rows = [(r.id, r.team, r.priority, r.gpus, _s(r.arrival), _s(r.start), _s(r.end), r.preemptions,
             _s(r.lost_gpu_s)) for r in records]
    _write(path, "--jobs-out", JOB_COLUMNS, rows)


def _s(x: float) -> str:
    return f"{x:.3f}".rstrip("0").rstrip(".") if x == x else ""


def _write(path: str | Path, option: str, header: Sequence[str], rows) -> None:
    try:
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(header)
            w.writerows(rows)
    except OSError as err:
        raise HeteroGpuError(f"{option} {path}: cannot write: {err.strerror or err}") from None
