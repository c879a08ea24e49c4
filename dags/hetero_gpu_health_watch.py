"""Cluster health watch: every 10 minutes, check every GPU, evict abnormal ones from the pools,
replace them in running jobs, and notice new GPUs (seed steps S10-S12)."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag

from airflow_hetero_gpu.sensors.gpu_health import GpuHealthSensor


@dag(
    dag_id="hetero_gpu_health_watch",
    schedule=timedelta(minutes=10),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["hetero-gpu", "health"],
    doc_md=__doc__,
)
def hetero_gpu_health_watch():
    GpuHealthSensor(
        task_id="watch",
        mode_kind="watch",
        watch_duration=timedelta(minutes=9),
        stop_when_idle=False,
        poke_interval=60,
        deferrable=True,
    )


hetero_gpu_health_watch()
