"""The operator's words: why no pool fits, GPU lists (which worker failed first:
:func:`airflow_hetero_gpu.launch.failures.failure_message`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from airflow_hetero_gpu.core.model import PlanResult


def pool_reasons(result: PlanResult) -> str:
    """Every pool's reason, on one line."""
    return "; ".join(f"{p.pool}: {p.reason}" for p in result.pools) or "no GPUs collected"


def fmt_gpus(gpus: Sequence[tuple]) -> str:
    """``host GPU 0,1; other GPU 3`` (``GPU 2 MIG 1`` for a MIG instance)."""
    by: dict[str, list[str]] = {}
    for key in gpus:
        host, index = key[0], key[1]
        instance = key[2] if len(key) > 2 else None
        by.setdefault(host, []).append(str(index) if instance is None else f"{index} MIG {instance}")
    return "; ".join(f"{h} GPU {','.join(ix)}" for h, ix in by.items())


def key_json(key: tuple) -> dict:
    """``{"host", "index"}``, with ``"instance"`` for a MIG instance."""
    instance = key[2] if len(key) > 2 else None
    return {"host": key[0], "index": key[1], **({} if instance is None else {"instance": instance})}

