"""Health rules (SPEC §4): each a small function from one GPU's facts to a reason or ``None``.

A GPU is unhealthy (abnormal) when any rule gives a reason. The rules run in the order of
:data:`RULES`; a GPU's ``reasons`` list every rule that fired, in that order.

Besides SPEC §4's rules, optional ones read fields that older drivers lack (the collector
asks for them where the driver knows them, see docs/health.md): row remapping
(``row-remap-failure``, ``row-remap-pending``), hardware slowdown (``hw-slowdown``) and the
NVLink fabric (``fabric-registering``, ``fabric-error``, ``fabric-unhealthy``,
``fabric-degraded``). A fact that was not collected is ``None`` and never fires a rule. How long a reason must last before
it evicts a GPU is :mod:`airflow_hetero_gpu.core.watch`'s business, not the rules'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

from airflow_hetero_gpu.capture.xid import APPLICATION_XIDS
from airflow_hetero_gpu.core.config import Thresholds

if TYPE_CHECKING:
    from airflow_hetero_gpu.capture.query import QueryRow


@dataclass(frozen=True)
class GpuFacts:
    """What the collection said about one GPU, in the units the rules need."""

    host_error: str | None = None  # the host's collection failed (error.txt, driver gone, ...)
    stale: bool = False  # the host's inventory is older than the planner accepts
    lost: bool = False  # [Unknown Error] / [GPU requires reset] / "Unable to determine the device handle"
    ecc_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    temperature_c: float | None = None
    xids: tuple[int, ...] = field(default_factory=tuple)
    remapped_rows_failure: bool | None = None  # remapped_rows.failure
    remapped_rows_pending: bool | None = None  # remapped_rows.pending
    hw_slowdown: bool | None = None  # clocks_event_reasons.hw_slowdown (clocks_throttle_reasons.*)
    fabric_state: str | None = None  # fabric.state ... of a GPU on a multi-node NVLink platform
    fabric_status: str | None = None
    fabric_health_summary: str | None = None
    fabric_bandwidth: str | None = None
    multinode_nvlink: bool = False  # GB200/GB300 tray, or a non-zero fabric cluster UUID

    @classmethod
    def from_row(cls, row: "QueryRow", *, host_error: str | None = None,
                 xids: Iterable[int] = (), stale: bool = False) -> "GpuFacts":
        """The facts of one ``--query-gpu`` row, its host's error and its Xids."""
        return cls(
            host_error=host_error,
            stale=stale,
            lost=bool(row.problems),
            ecc_uncorrected=row.ecc_uncorrected,
            retired_pages_pending=row.retired_pages_pending,
            temperature_c=row.temperature_c,
            xids=tuple(xids),
            remapped_rows_failure=row.remapped_rows_failure,
            remapped_rows_pending=row.remapped_rows_pending,
            hw_slowdown=row.hw_slowdown,
            fabric_state=row.fabric_state,
            fabric_status=row.fabric_status,
            fabric_health_summary=row.fabric_health_summary,
            fabric_bandwidth=row.fabric_health_bandwidth,
            multinode_nvlink=multinode_nvlink(row.name, row.fabric_cluster_uuid),
        )


#: Grace-Blackwell superchips: their trays join a multi-node NVLink domain (NVL72/NVL36).
MULTINODE_NVLINK_NAMES = ("nvidia gb200", "nvidia gb300")
_NO_VALUE = {"", "n/a", "not supported", "[n/a]"}


def multinode_nvlink(name: str | None, cluster_uuid: str | None) -> bool:
    """Whether a GPU sits on a multi-node NVLink platform: a GB200/GB300 by name, or any GPU
    whose fabric reports a non-zero cluster UUID. An HGX H100/H200 (NVSwitch inside one host)
    is not one: its registration status says nothing about the placement across hosts."""
    uuid = (cluster_uuid or "").strip().lower()
    if uuid and uuid not in _NO_VALUE and not set(uuid) <= set("0-"):
        return True
    return (name or "").strip().lower().startswith(MULTINODE_NVLINK_NAMES)


Rule = Callable[[GpuFacts, Thresholds], "str | list[str] | None"]


def stale(f: GpuFacts, th: Thresholds) -> str | None:
    return "stale" if f.stale else None


def unreachable(f: GpuFacts, th: Thresholds) -> str | None:
    return "unreachable" if f.host_error is not None else None


def lost(f: GpuFacts, th: Thresholds) -> str | None:
    return "lost" if f.lost else None


def ecc(f: GpuFacts, th: Thresholds) -> str | None:
    return "ecc" if f.ecc_uncorrected is not None and f.ecc_uncorrected > 0 else None


def retired_pages(f: GpuFacts, th: Thresholds) -> str | None:
    return "retired-pages-pending" if f.retired_pages_pending else None


def row_remap(f: GpuFacts, th: Thresholds) -> list[str] | None:
    """A failed row remap (the memory is out of spare rows) or one waiting for a GPU reset."""
    if not th.check_row_remap:
        return None
    out = []
    if f.remapped_rows_failure:
        out.append("row-remap-failure")
    if f.remapped_rows_pending:
        out.append("row-remap-pending")
    return out or None


def temperature(f: GpuFacts, th: Thresholds) -> str | None:
    if f.temperature_c is not None and f.temperature_c >= th.max_temperature_c:
        return "temperature"
    return None


def hw_slowdown(f: GpuFacts, th: Thresholds) -> str | None:
    """HW Slowdown engaged: clocks cut by half or more (thermal or external power brake)."""
    return "hw-slowdown" if th.check_hw_slowdown and f.hw_slowdown else None


def fabric(f: GpuFacts, th: Thresholds) -> list[str] | None:
    """The NVLink fabric of a multi-node NVLink GPU: its registration must have completed with
    success (until then CUDA cannot use the fabric); on any GPU, a fabric health summary other
    than Healthy, or degraded bandwidth, is a fault too (N/A on GPUs without a fabric)."""
    out = []
    state = (f.fabric_state or "").strip().lower()
    if f.multinode_nvlink and state not in _NO_VALUE:
        if state != "completed":
            out.append("fabric-registering")
        elif (f.fabric_status or "").strip().lower() not in _NO_VALUE | {"success"}:
            out.append("fabric-error")
    summary = (f.fabric_health_summary or "").strip().lower()
    if summary == "unhealthy":
        out.append("fabric-unhealthy")
    degraded = summary == "limited capacity" or (f.fabric_bandwidth or "").strip().lower().startswith("degraded")
    if degraded:
        out.append("fabric-degraded")
    return out or None


def xid(f: GpuFacts, th: Thresholds) -> list[str] | None:
    codes = sorted({x for x in f.xids if x not in APPLICATION_XIDS})
    return [f"xid-{x}" for x in codes] or None


RULES: list[Rule] = [stale, unreachable, lost, ecc, retired_pages, row_remap, temperature, hw_slowdown, fabric,
                     xid]


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
