"""S3/S4: the pool supports the requested training-task type (any when none is asked for)."""

from __future__ import annotations

from airflow_hetero_gpu.core.view import PoolView


def task_type_filter(view: PoolView) -> str | None:
    wanted = view.request.task_type
    if wanted is None or wanted in view.pool.task_types:
        return None
    return f"does not support task type {wanted!r} (supports {', '.join(view.pool.task_types)})"
