"""The health check of a GPU fleet, shared by the sensor, its trigger and ``hetero-gpu check``.

The names below are imported when first used (PEP 562): ``hetero-gpu``'s parser registers the
``check`` command without importing the check and the ledger behind it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_hetero_gpu.lazy import exports

if TYPE_CHECKING:
    from airflow_hetero_gpu.healthcheck.check import CheckReport, HealthWatch
    from airflow_hetero_gpu.healthcheck.metrics import Metrics
    from airflow_hetero_gpu.healthcheck.spec import (GATE_MET, IDLE, MODE_KINDS, WATCH_OVER, WatchSpec,
                                                     merged_config)

_WHERE = {
    "CheckReport": "check", "HealthWatch": "check", "Metrics": "metrics",
    "GATE_MET": "spec", "IDLE": "spec", "MODE_KINDS": "spec", "WATCH_OVER": "spec", "WatchSpec": "spec",
    "merged_config": "spec",
}

__all__ = sorted(_WHERE)
__getattr__, __dir__ = exports(__name__, _WHERE)
