"""The health check of a GPU fleet, shared by the sensor, its trigger and ``hetero-gpu check``."""

from airflow_hetero_gpu.healthcheck.check import CheckReport, HealthWatch
from airflow_hetero_gpu.healthcheck.metrics import Metrics
from airflow_hetero_gpu.healthcheck.spec import GATE_MET, IDLE, MODE_KINDS, WATCH_OVER, WatchSpec, merged_config

__all__ = ["GATE_MET", "IDLE", "MODE_KINDS", "WATCH_OVER", "CheckReport", "HealthWatch", "Metrics", "WatchSpec",
           "merged_config"]
