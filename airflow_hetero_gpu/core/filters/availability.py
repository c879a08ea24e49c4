"""S5: at least k of the pool's GPUs are available now: healthy, not reserved, load at most
``busy_utilization``, and free memory at least ``gpu_memory_mib`` when asked (SPEC §6.3)."""

from __future__ import annotations

from airflow_hetero_gpu.core.filters.explain import describe_unavailable
from airflow_hetero_gpu.core.view import PoolView


def enough_available(view: PoolView) -> str | None:
    k = view.request.gpus
    avail = view.available_count
    if avail >= k:
        return None
    return f"needs {k} available, has {avail}: {describe_unavailable(view)}"
