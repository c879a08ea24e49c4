"""S4: the pool holds at least k healthy GPUs (card count >= requested)."""

from __future__ import annotations

from airflow_hetero_gpu.core.filters.explain import describe_unhealthy
from airflow_hetero_gpu.core.view import PoolView


def enough_healthy(view: PoolView) -> str | None:
    k = view.request.gpus
    healthy = view.healthy_count
    if healthy >= k:
        return None
    text = f"needs {k} GPU{'s' if k > 1 else ''}, has {healthy} healthy of {view.gpu_count}"
    why = describe_unhealthy(view)
    return f"{text}: {why}" if why else text
