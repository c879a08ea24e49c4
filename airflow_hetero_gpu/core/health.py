"""Health rules (SPEC §4): each a small function from one GPU's facts to a reason or ``None``.

A GPU is unhealthy (abnormal) when any rule gives a reason. The rules run in the order of
:data:`RULES`; a GPU's ``reasons`` list every rule that fired, in that order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from airflow_hetero_gpu.capture.xid import APPLICATION_XIDS
from airflow_hetero_gpu.core.config import Thresholds


@dataclass(frozen=True)
class GpuFacts:
    """What the collection said about one GPU, in the units the rules need."""

    host_error: str | None = None  # the host's collection failed (error.txt, driver gone, ...)
    lost: bool = False  # [Unknown Error] / [GPU requires reset] / "Unable to determine the device handle"
    ecc_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    temperature_c: float | None = None
    xids: tuple[int, ...] = field(default_factory=tuple)


Rule = Callable[[GpuFacts, Thresholds], "str | list[str] | None"]


def unreachable(f: GpuFacts, th: Thresholds) -> str | None:
    return "unreachable" if f.host_error is not None else None


def lost(f: GpuFacts, th: Thresholds) -> str | None:
    return "lost" if f.lost else None


def ecc(f: GpuFacts, th: Thresholds) -> str | None:
    return "ecc" if f.ecc_uncorrected is not None and f.ecc_uncorrected > 0 else None


def retired_pages(f: GpuFacts, th: Thresholds) -> str | None:
    return "retired-pages-pending" if f.retired_pages_pending else None


def temperature(f: GpuFacts, th: Thresholds) -> str | None:
    if f.temperature_c is not None and f.temperature_c >= th.max_temperature_c:
        return "temperature"
    return None


def xid(f: GpuFacts, th: Thresholds) -> list[str] | None:
    codes = sorted({x for x in f.xids if x not in APPLICATION_XIDS})
    return [f"xid-{x}" for x in codes] or None


RULES: list[Rule] = [unreachable, lost, ecc, retired_pages, temperature, xid]


def health_reasons(facts: GpuFacts, thresholds: Thresholds) -> tuple[str, ...]:
    """Every reason the GPU is abnormal; empty when it is healthy."""
    out: list[str] = []
    for rule in RULES:
        r = rule(facts, thresholds)
        if isinstance(r, str):
            out.append(r)
        elif r:
            out.extend(r)
    return tuple(out)
