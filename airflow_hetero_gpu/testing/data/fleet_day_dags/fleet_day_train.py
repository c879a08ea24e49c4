"""The training stream of ``hetero-gpu``'s fleet day (airflow_hetero_gpu/testing/fleet_day.py).

Two DAGs, one per priority: ``fleet_day_train`` (priority 0) and ``fleet_day_urgent`` (priority 5).
Each run trains ``conf["gpus"]`` GPUs (of ``conf["gpu_type"]`` when given) for team ``conf["team"]``
for ``conf["seconds"]`` seconds:
the command appends its start (host clock, host, GPUs) to ``RESULTS/<job id>.start`` and sleeps.
``pre_execute`` writes when the task's first ``execute()`` began to ``RESULTS/<run id>.exec``, so
the day measures execute() -> job running on the same clock. Settings come from the environment
(``HG_FLEET_DAY``, JSON), read when the file is parsed.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import dag

from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator

CFG = json.loads(os.environ.get("HG_FLEET_DAY") or "{}")
RESULTS = CFG.get("results", "/tmp")
COMMAND = ('echo "$(date +%s.%N) $HETERO_GPU_HOST $CUDA_VISIBLE_DEVICES" >> '
           f'{RESULTS}/"$HETERO_GPU_JOB_ID".start; exec sleep "$1"')


def note_execute(context) -> None:
    """The first execute() of the run's task: its start time, once (a resume keeps the first)."""
    path = Path(RESULTS) / f"{context['ti'].run_id}.exec"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{time.time():.6f}\n")


def training_dag(dag_id: str, priority: int):
    @dag(dag_id=dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
         max_active_runs=1000, tags=["hetero-gpu", "fleet-day"])
    def stream():
        HeteroTrainOperator(
            task_id="train",
            gpu_count="{{ dag_run.conf['gpus'] }}",
            gpu_type="{{ dag_run.conf.get('gpu_type', '') }}",  # empty: any card
            team="{{ dag_run.conf['team'] }}",
            command=["sh", "-c", COMMAND, "fleet-day-job", "{{ dag_run.conf['seconds'] }}"],
            priority=priority,
            wait_for_capacity=True,
            deferrable=True,
            capacity_poll_interval=float(CFG.get("capacity_poll_interval", 5)),
            capacity_timeout=float(CFG.get("capacity_timeout", 3600)),
            lease_seconds=float(CFG.get("lease_seconds", 120)),
            durable=bool(CFG.get("durable", False)),
            pre_execute=note_execute,
            retries=int(CFG.get("retries", 1)),
            retry_delay=timedelta(seconds=float(CFG.get("retry_delay", 5))),
        )

    return stream()


training_dag("fleet_day_train", 0)
training_dag("fleet_day_urgent", 5)
