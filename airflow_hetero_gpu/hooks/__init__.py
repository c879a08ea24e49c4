"""Airflow hooks of the provider: thin skins over :mod:`airflow_hetero_gpu.collect` and the core."""

from __future__ import annotations

from airflow_hetero_gpu.hooks.hetero_gpu import HeteroGpuHook

__all__ = ["HeteroGpuHook"]
