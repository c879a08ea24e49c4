"""S4: a pool of MIG instances serves 1-GPU jobs only (NCCL cannot span MIG instances: each
process sees one instance, and instances do not talk to each other over NVLink)."""

from __future__ import annotations

from airflow_hetero_gpu.core.view import PoolView


def mig_single_gpu(view: PoolView) -> str | None:
    k = view.request.gpus
    if not view.pool.mig or k <= 1:
        return None
    return f"MIG instances serve 1-GPU jobs only, the job asks for {k}"
