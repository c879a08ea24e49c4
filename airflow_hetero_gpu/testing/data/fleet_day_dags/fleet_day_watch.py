"""The health watch of ``hetero-gpu``'s fleet day: ``hetero_gpu_health_watch`` with the day's
interval (``HG_FLEET_DAY``: ``watch_interval`` seconds between checks, ``watch_seconds`` in all),
over the day's hosts file and the one ssh connection that reaches them all (``hosts_file``,
``fleet_conn_id``): one connection lookup, whatever the fleet's size."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pendulum
from airflow.sdk import dag

from airflow_hetero_gpu.sensors.gpu_health import GpuHealthSensor

CFG = json.loads(os.environ.get("HG_FLEET_DAY") or "{}")


@dag(dag_id="fleet_day_health_watch", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
     catchup=False, max_active_runs=1, tags=["hetero-gpu", "health", "fleet-day"])
def fleet_day_health_watch():
    GpuHealthSensor(
        task_id="watch",
        hosts_file=CFG.get("hosts_file"),
        ssh_conn_id=CFG.get("fleet_conn_id"),
        mode_kind="watch",
        watch_duration=timedelta(seconds=float(CFG.get("watch_seconds", 3600))),
        stop_when_idle=False,
        poke_interval=float(CFG.get("watch_interval", 60)),
        thresholds=CFG.get("thresholds"),
        deferrable=True,
        timeout=float(CFG.get("watch_seconds", 3600)) + 3600,
    )


fleet_day_health_watch()
