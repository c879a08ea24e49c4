"""S4: the pool's card type matches the requested one (any when none is asked for).

A pool of MIG instances takes only requests that name MIG (``... MIG 1g.10gb``, ``*MIG*``): a
job that asks for any GPU, or for a whole-GPU type, never gets a slice of one.
"""

from __future__ import annotations

from airflow_hetero_gpu.core.cardtype import card_type_matches
from airflow_hetero_gpu.core.view import PoolView


def card_type_filter(view: PoolView) -> str | None:
    wanted = view.request.gpu_types
    if view.pool.mig and not any("mig" in w.lower() for w in wanted):
        return "MIG instances go only to requests that name a MIG card type"
    if not wanted or any(card_type_matches(view.pool.card_type, w) for w in wanted):
        return None
    asked = " or ".join(repr(w) for w in wanted)
    return f"card type {view.pool.card_type!r} is not the requested {asked}"
