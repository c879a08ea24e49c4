"""Pool filters (SPEC §6), after the Kubernetes scheduler's filter plugins.

A filter takes a :class:`~airflow_hetero_gpu.core.view.PoolView` and answers ``None`` (pass) or
a human reason why the pool cannot host the request. :data:`PRIMARY` filters decide the primary
candidate pools (S4), :data:`PRESELECT` filters the preselected ones among them (S5).
"""

from __future__ import annotations

from typing import Callable

from airflow_hetero_gpu.core.filters.availability import enough_available
from airflow_hetero_gpu.core.filters.card_type import card_type_filter
from airflow_hetero_gpu.core.filters.healthy import enough_healthy
from airflow_hetero_gpu.core.filters.mig import mig_single_gpu
from airflow_hetero_gpu.core.filters.task_type import task_type_filter
from airflow_hetero_gpu.core.view import PoolView

Filter = Callable[[PoolView], "str | None"]

PRIMARY: list[Filter] = [card_type_filter, task_type_filter, mig_single_gpu, enough_healthy]
PRESELECT: list[Filter] = [enough_available]

__all__ = ["PRIMARY", "PRESELECT", "Filter"]
