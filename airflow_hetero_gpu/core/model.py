"""The planner's vocabulary: GPUs, hosts, requests, pools and decisions.

Plain dataclasses, no Airflow, no I/O. Everything here serialises to the JSON of SPEC §10.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from airflow_hetero_gpu.errors import RequestError


class GpuKey(NamedTuple):
    """A GPU's address in the cluster: host name and nvidia-smi index."""

    host: str
    index: int

    def __str__(self) -> str:
        return f"{self.host}:{self.index}"


@dataclass(frozen=True)
class Gpu:
    """One GPU as collected (SPEC §4). ``load`` and availability are the planner's business."""

    host: str
    index: int
    uuid: str
    name: str
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    utilization: float | None = None  # 0..1, None when nvidia-smi said [N/A]
    temperature_c: float | None = None
    power_w: float | None = None
    pci_bus_id: str | None = None
    healthy: bool = True
    reasons: tuple[str, ...] = ()
    task_types: tuple[str, ...] = ()  # sorted; filled from cluster.yaml rules

    @property
    def key(self) -> GpuKey:
        return GpuKey(self.host, self.index)

    @property
    def base_load(self) -> float:
        """``u = max(utilization, memory.used / memory.total)`` clamped to [0, 1] (SPEC §4)."""
        u = self.utilization or 0.0
        if self.memory_total_mib and self.memory_used_mib is not None and self.memory_total_mib > 0:
            u = max(u, self.memory_used_mib / self.memory_total_mib)
        return min(1.0, max(0.0, u))

    @property
    def memory_free_mib(self) -> float | None:
        if self.memory_total_mib is None:
            return None
        return self.memory_total_mib - (self.memory_used_mib or 0.0)

    def ref(self) -> dict:
        """The short form used in decisions: host, index, uuid, name."""
        return {"host": self.host, "index": self.index, "uuid": self.uuid, "name": self.name}

    def to_json(self) -> dict:
        return {
            "host": self.host,
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "memory_total_mib": self.memory_total_mib,
            "memory_used_mib": self.memory_used_mib,
            "utilization": self.utilization,
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
            "healthy": self.healthy,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True)
class PlanRequest:
    """What a job asks for: k GPUs, optionally of a card type, task type and free memory each."""

    gpus: int
    gpu_type: str | tuple[str, ...] | None = None
    task_type: str | None = None
    gpu_memory_mib: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int):
            raise RequestError(f"gpus: expected a positive integer, got {self.gpus!r}")
        if self.gpus <= 0:
            raise RequestError(f"gpus: must be at least 1, got {self.gpus}")
        if self.gpu_memory_mib is not None:
            if isinstance(self.gpu_memory_mib, bool) or not isinstance(self.gpu_memory_mib, (int, float)):
                raise RequestError(f"gpu_memory_mib: expected a number of MiB, got {self.gpu_memory_mib!r}")
            if self.gpu_memory_mib < 0:
                raise RequestError(f"gpu_memory_mib: must not be negative, got {self.gpu_memory_mib}")
        if isinstance(self.gpu_type, list):
            object.__setattr__(self, "gpu_type", tuple(self.gpu_type))
        types = self.gpu_types
        if any(not isinstance(t, str) or not t.strip() for t in types):
            raise RequestError(f"gpu_type: expected card type names, got {self.gpu_type!r}")
        if self.task_type is not None and (not isinstance(self.task_type, str) or not self.task_type.strip()):
            raise RequestError(f"task_type: expected a task type name, got {self.task_type!r}")

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The acceptable card types (empty: any)."""
        if self.gpu_type is None:
            return ()
        if isinstance(self.gpu_type, str):
            return (self.gpu_type,)
        return tuple(self.gpu_type)

    def to_json(self) -> dict:
        return {
            "gpus": self.gpus,
            "gpu_type": list(self.gpu_types) if len(self.gpu_types) > 1 else (self.gpu_types[0] if self.gpu_types else None),
            "task_type": self.task_type,
            "gpu_memory_mib": self.gpu_memory_mib,
        }


@dataclass(frozen=True)
class Score:
    """The evaluation of a pool: E = w1·LB + w2·FR + w3·TS + w4·FB (SPEC §7 plus free blocks).

    ``terms`` holds every scorer's value by name (``load_balance``, ``fragmentation``,
    ``topology``, ``free_blocks``, and any scorer added to the registry); ``total`` is the
    weighted sum.
    """

    terms: dict[str, float]
    total: float

    @property
    def load_balance(self) -> float:
        return self.terms["load_balance"]

    @property
    def fragmentation(self) -> float:
        return self.terms["fragmentation"]

    @property
    def topology(self) -> float:
        return self.terms["topology"]

    @property
    def free_blocks(self) -> float | None:
        return self.terms.get("free_blocks")

    def to_json(self) -> dict:
        return {**self.terms, "total": self.total}


STAGES = ("rejected", "primary", "preselected", "scheduling")


@dataclass
class PoolReport:
    """One candidate pool's fate for one request: its stage, why it stopped there, its score."""

    pool: str
    card_type: str
    task_types: tuple[str, ...]
    gpus: int
    healthy: int
    available: int
    stage: str = "rejected"
    reason: str | None = None
    score: Score | None = None
    selection: tuple[GpuKey, ...] = ()  # the k GPUs this pool would give the job (preselected pools)
    mean_distance: float | None = None

    @property
    def hosts_spanned(self) -> int:
        return len({k.host for k in self.selection})

    def to_json(self) -> dict:
        return {
            "pool": self.pool,
            "card_type": self.card_type,
            "task_types": list(self.task_types),
            "gpus": self.gpus,
            "healthy": self.healthy,
            "available": self.available,
            "stage": self.stage,
            "reason": self.reason,
            "score": self.score.to_json() if self.score else None,
        }


@dataclass
class Decision:
    """The scheduling pool and the k GPUs chosen in it."""

    pool: str
    gpus: list[Gpu]
    score: Score
    mean_distance: float

    @property
    def hosts(self) -> list[str]:
        seen: dict[str, None] = {}
        for g in self.gpus:
            seen.setdefault(g.host, None)
        return list(seen)

    @property
    def keys(self) -> list[GpuKey]:
        return [g.key for g in self.gpus]

    def to_json(self) -> dict:
        return {
            "pool": self.pool,
            "gpus": [g.ref() for g in self.gpus],
            "hosts": self.hosts,
            "score": self.score.to_json(),
        }


@dataclass
class PlanResult:
    """Everything one planning step found: the decision (or None) and every pool's report."""

    request: PlanRequest
    decision: Decision | None
    pools: list[PoolReport]
    unhealthy: list[Gpu] = field(default_factory=list)
    host_errors: dict[str, str] = field(default_factory=dict)

    @property
    def placed(self) -> bool:
        return self.decision is not None

    def to_json(self) -> dict:
        return {
            "decision": self.decision.to_json() if self.decision else None,
            "pools": [p.to_json() for p in self.pools],
            "unhealthy": [
                {"host": g.host, "index": g.index, "reasons": list(g.reasons)} for g in self.unhealthy
            ],
        }
