"""The health watch (SPEC §8, S10-S12): which faults evict a GPU, when, and when it comes back.

Pure and synchronous: no Airflow, no SSH, no database. One *check* is: the captures of one
collection (:func:`evaluate`) and, per GPU, the memory of earlier checks (soft-fault streaks,
the last kernel-log Xid line already acted on) plus its eviction in the ledger, go through
:func:`step`, which says what the ledger must do. The ledger applies the steps in one
transaction (:mod:`airflow_hetero_gpu.ledger.watch`); the sensor and its trigger only call these
functions, so poke mode and deferrable mode decide alike.

The policy per fault kind (docs/health.md has the reasoning):

============  ==============================================  ===================================
kind          reasons                                         evicts
============  ==============================================  ===================================
hard          lost, ecc, retired-pages-pending,                at the first check that sees it
              row-remap-failure, row-remap-pending, xid-<n>
soft          temperature, hw-slowdown                         after ``soft_fault_checks`` (3)
                                                               consecutive checks that see it
unreachable   unreachable                                      after ``unreachable_checks`` (2)
                                                               consecutive checks that see it
============  ==============================================  ===================================

An evicted GPU comes back after ``readmit_after_healthy_checks`` (3) consecutive checks with no
reason at all (a soft fault below its count breaks the run without re-evicting), or at once
with ``hetero-gpu uncordon``.

An Xid stays in the kernel log until the host reboots, so an Xid counts once: only lines that
are *new* since the last collection stored in the ledger (the host's cursor) are evaluated. Without that a GPU that once
had an Xid would be evicted again at every check and never come back. Faults that persist in the
GPU (the volatile ECC counter until a GPU reset, pending retirements or remaps until a reset, a
lost GPU) keep it out through their own rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from airflow_hetero_gpu.capture.directory import CaptureSet
from airflow_hetero_gpu.core import occupancy
from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.config import ClusterConfig, Thresholds
from airflow_hetero_gpu.core.health import GpuFacts, health_reasons
from airflow_hetero_gpu.core.inventory import XIDS_FROM_LEDGER, cluster_from_captures
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest, PlanResult
from airflow_hetero_gpu.core.planner import cluster_state, plan

HARD = "hard"
SOFT = "soft"
UNREACHABLE = "unreachable"

#: Reasons whose eviction waits for consecutive bad checks; every other reason is hard. A fabric
#: registration in progress and degraded fabric bandwidth often clear by themselves (route
#: recovery); a fabric error or an unhealthy fabric does not.
SOFT_REASONS = frozenset({"temperature", "hw-slowdown", "fabric-registering", "fabric-degraded"})

# What a step asks of the ledger.
OK = "ok"                        # not evicted, nothing wrong
PENDING = "pending"              # not evicted, a soft fault counting towards eviction
EVICT = "evict"                  # newly evicted
STILL_EVICTED = "still-evicted"  # evicted, and a fault that evicts is still there (count back to 0)
HOLD = "hold"                    # evicted, a soft fault below its count: count back to 0, no new reason
HEALTHY_CHECK = "healthy-check"  # evicted, one more healthy check
READMIT = "readmit"              # evicted, the last healthy check needed: back in the pools
ACTIONS = (OK, PENDING, EVICT, STILL_EVICTED, HOLD, HEALTHY_CHECK, READMIT)


def fault_kind(reason: str) -> str:
    """``hard``, ``soft`` or ``unreachable``; unknown reasons are hard (a safe default)."""
    if reason == "unreachable":
        return UNREACHABLE
    if reason in SOFT_REASONS:
        return SOFT
    return HARD


@dataclass(frozen=True)
class WatchPolicy:
    """How many consecutive checks each fault kind needs to evict, and healthy ones to readmit."""

    soft_fault_checks: int = 3
    unreachable_checks: int = 2
    readmit_after: int = 3

    def __post_init__(self) -> None:
        for name in ("soft_fault_checks", "unreachable_checks", "readmit_after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")

    @classmethod
    def from_thresholds(cls, th: Thresholds) -> "WatchPolicy":
        return cls(th.soft_fault_checks, th.unreachable_checks, th.readmit_after_healthy_checks)

    def checks_to_evict(self, reason: str) -> int:
        kind = fault_kind(reason)
        if kind == SOFT:
            return self.soft_fault_checks
        if kind == UNREACHABLE:
            return self.unreachable_checks
        return 1


# --- Xid lines: only new ones count ------------------------------------------------------------
@dataclass(frozen=True)
class XidMarker:
    """The last kernel-log Xid line of one GPU already acted on: its text and which occurrence
    of that exact text it was (journal lines have one-second timestamps, so two may be equal)."""

    text: str
    occurrence: int = 1

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "occurrence": self.occurrence}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> "XidMarker | None":
        if not data or not isinstance(data.get("text"), str):
            return None
        return cls(data["text"], int(data.get("occurrence") or 1))


def split_new_lines(lines: Sequence[str], marker: XidMarker | None) -> tuple[int, XidMarker | None]:
    """(index of the first new line, the marker to keep) for one GPU's Xid lines, oldest first.

    No marker: every line is new (first check). Marker found: the lines after it are new. Marker
    not found: the log no longer holds it (a reboot, or the ring buffer dropped it together with
    everything older), so every line left came after it and is new. No lines: nothing is new
    and the marker is kept (the log may just have been unreadable this time).
    """
    if not lines:
        return 0, marker
    start = 0
    if marker is not None:
        seen = 0
        for i, text in enumerate(lines):
            if text == marker.text:
                seen += 1
                if seen == marker.occurrence:
                    start = i + 1
                    break
    last = lines[-1]
    return start, XidMarker(last, sum(1 for text in lines if text == last))


# --- one GPU, one check ------------------------------------------------------------------------
@dataclass(frozen=True)
class Observation:
    """What one check saw of one GPU: its reasons (new Xids only)."""

    key: GpuKey
    uuid: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Step:
    """The decision for one GPU at one check (see the module docstring for the actions)."""

    key: GpuKey
    uuid: str
    reasons: tuple[str, ...]  # everything wrong now
    action: str
    evict_reasons: tuple[str, ...] = ()  # the reasons that evict now (EVICT, STILL_EVICTED)
    healthy_checks: int = 0  # consecutive healthy checks after this one (evicted GPUs)
    streaks: Mapping[str, int] = field(default_factory=dict)  # soft/unreachable reason -> bad checks in a row

    @property
    def evicted_after(self) -> bool:
        return self.action in (EVICT, STILL_EVICTED, HOLD, HEALTHY_CHECK)


def step(obs: Observation, streaks: Mapping[str, int], healthy_checks: int | None,
         policy: WatchPolicy) -> Step:
    """Decide one GPU's fate at one check.

    ``streaks``: consecutive bad checks per soft/unreachable reason before this one.
    ``healthy_checks``: None when the GPU is not evicted, else its consecutive healthy checks.
    """
    new_streaks: dict[str, int] = {}
    evicting: list[str] = []
    for reason in obs.reasons:
        need = policy.checks_to_evict(reason)
        if fault_kind(reason) != HARD:
            new_streaks[reason] = int(streaks.get(reason, 0)) + 1
            if new_streaks[reason] >= need:
                evicting.append(reason)
        else:
            evicting.append(reason)
    evict_reasons = tuple(evicting)
    base = dict(key=obs.key, uuid=obs.uuid, reasons=obs.reasons, streaks=new_streaks)
    if healthy_checks is None:
        if evict_reasons:
            return Step(action=EVICT, evict_reasons=evict_reasons, **base)
        return Step(action=PENDING if obs.reasons else OK, **base)
    if evict_reasons:
        return Step(action=STILL_EVICTED, evict_reasons=evict_reasons, **base)
    if obs.reasons:
        return Step(action=HOLD, **base)
    count = healthy_checks + 1
    if count >= policy.readmit_after:
        return Step(action=READMIT, **base)
    return Step(action=HEALTHY_CHECK, healthy_checks=count, **base)


# --- a whole collection --------------------------------------------------------------------------
@dataclass
class Evaluation:
    """One collection as the watch sees it.

    ``cluster`` is the planner's cluster with every GPU's health judged on *new* Xids only and
    with the optional rules (row remapping, hw slowdown) applied; ``observations`` hold one
    entry per GPU, in the cluster's order.
    """

    cluster: Cluster
    observations: list[Observation]


def evaluate(captures: CaptureSet, config: ClusterConfig,
             new_xids: Mapping[GpuKey, Sequence[int]] | None = None) -> Evaluation:
    """Judge every GPU of a parsed collection (SPEC §4 rules plus the optional ones).

    ``new_xids``: per GPU, the Xid numbers of the kernel-log lines that no earlier collection
    acted on (the ledger's per-host cursor decides which lines are new); the captures' own Xid
    lines are not read, so an old line never counts twice.
    """
    new_xids = new_xids or {}
    th = config.thresholds
    bare = CaptureSet(captures.root, {name: replace(cap, xid=[]) for name, cap in captures.hosts.items()},
                      captures.switches, captures.config_path)
    raw = cluster_from_captures(bare, config, xid_rule=XIDS_FROM_LEDGER)
    rows: dict[str, dict[int, Any]] = {
        name: {r.index: r for r in (cap.query.rows if cap.query else [])} for name, cap in bare.hosts.items()}
    gpus = []
    observations = []
    judged: dict[GpuKey, tuple[str, ...]] = {}
    for g in raw.gpus:
        if g.instance is not None:  # a MIG instance is as healthy as its GPU (judged first: order)
            reasons = judged.get(g.key.gpu, g.reasons)
            gpus.append(replace(g, healthy=not reasons, reasons=reasons))
            continue
        cap = bare.hosts[g.host]
        xids = tuple(new_xids.get(g.key, ()))
        row = rows[g.host].get(g.index)
        if row is not None:
            facts = GpuFacts.from_row(row, host_error=cap.error, xids=xids, stale=cap.stale is not None)
        else:  # a GPU nvidia-smi could not open: the inventory placed it at a free index
            facts = GpuFacts(host_error=cap.error, lost=True, xids=xids, stale=cap.stale is not None)
        reasons = health_reasons(facts, th)
        judged[g.key] = reasons
        gpus.append(replace(g, healthy=not reasons, reasons=reasons))
        observations.append(Observation(g.key, g.uuid, reasons))
    cluster = Cluster(gpus, dict(raw.wiring), raw.net, raw.config, dict(raw.host_errors))
    cluster.host_notes = dict(raw.host_notes)
    return Evaluation(cluster, observations)


# --- what the pools look like -----------------------------------------------------------------
def available_keys(cluster: Cluster, reserved: Mapping[GpuKey, str] | None = None,
                   evicted: Mapping[GpuKey, Sequence[str]] | None = None) -> set[GpuKey]:
    """GPUs a one-GPU request could get now: healthy, not evicted, not reserved, not busy."""
    state = cluster_state(cluster, PlanRequest(gpus=1), reserved, evicted)
    return {cluster.gpus[int(p)].key for p in np.flatnonzero(state.available)}


def pool_counts(cluster: Cluster, reserved: Mapping[GpuKey, str] | None = None,
                evicted: Mapping[GpuKey, Sequence[str]] | None = None,
                drained: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Per candidate pool: GPUs, healthy (and not evicted), evicted, available now
    (:func:`airflow_hetero_gpu.core.occupancy.pool_counts`, the numbers the CLI and the page show)."""
    return [{"pool": c.pool, "gpus": c.gpus, "healthy": c.healthy, "evicted": c.evicted, "available": c.available}
            for c in occupancy.pool_counts(cluster, reserved, evicted, drained=drained)]


@dataclass(frozen=True)
class GateStatus:
    """Whether some pool can host ``request`` now (the gate sensor's condition)."""

    met: bool
    result: PlanResult

    def to_json(self) -> dict[str, Any]:
        pools = [p for p in self.result.pools]
        return {
            "met": self.met,
            "request": self.result.request.to_json(),
            "pool": self.result.decision.pool if self.result.decision else None,
            "pools": [{"pool": p.pool, "healthy": p.healthy, "available": p.available, "stage": p.stage,
                       "reason": p.reason} for p in pools],
        }


def gate_status(cluster: Cluster, request: PlanRequest, reserved: Mapping[GpuKey, str] | None = None,
                evicted: Mapping[GpuKey, Sequence[str]] | None = None,
                drained: Mapping[str, str] | None = None) -> GateStatus:
    """The planner's answer for ``request`` (k = the gate's ``min_healthy``): met when some pool
    of the wanted card/task type has k healthy GPUs available now, reservations and evictions
    applied (and drained hosts: none of their GPUs counts)."""
    result = plan(cluster, request, reserved=reserved, evicted=evicted, drained=drained)
    return GateStatus(result.decision is not None, result)


def evicted_in(steps: Iterable[Step]) -> dict[GpuKey, tuple[str, ...]]:
    """GPU -> reasons for the steps that leave the GPU evicted with an evicting reason now."""
    return {s.key: s.evict_reasons for s in steps if s.action in (EVICT, STILL_EVICTED)}
