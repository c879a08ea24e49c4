"""What the ledger hands back: reservations, their GPUs, evictions, the Airflow task identity."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.ledger.errors import LedgerError


@dataclass(frozen=True)
class TaskIdentity:
    """The Airflow task instance a reservation belongs to, when known."""

    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    try_number: int | None = None
    map_index: int | None = None  # mapped tasks; None (or -1, Airflow's "not mapped")

    @classmethod
    def coerce(cls, value: "TaskIdentity | Mapping[str, Any] | None") -> "TaskIdentity | None":
        """Accept a TaskIdentity, a mapping with (some of) its fields, or None."""
        if value is None or isinstance(value, TaskIdentity):
            return value
        if not isinstance(value, Mapping):
            raise LedgerError(
                f"identity: expected a mapping with dag_id, run_id, task_id, try_number, map_index, got {value!r}"
            )
        unknown = set(value) - {"dag_id", "run_id", "task_id", "try_number", "map_index"}
        if unknown:
            raise LedgerError(f"identity: unknown key {sorted(unknown)[0]!r}")
        for name in ("try_number", "map_index"):
            number = value.get(name)
            if number is not None and (isinstance(number, bool) or not isinstance(number, int)):
                raise LedgerError(f"identity: {name} must be an integer, got {number!r}")
        for name in ("dag_id", "run_id", "task_id"):
            text = value.get(name)
            if text is not None and not isinstance(text, str):
                raise LedgerError(f"identity: {name} must be a string, got {text!r}")
        return cls(value.get("dag_id"), value.get("run_id"), value.get("task_id"), value.get("try_number"),
                   value.get("map_index"))

    def to_json(self) -> dict:
        return {"dag_id": self.dag_id, "run_id": self.run_id, "task_id": self.task_id,
                "map_index": self.map_index, "try_number": self.try_number}


@dataclass(frozen=True)
class ReservedGpu:
    """One unit of a reservation: a whole GPU, or a MIG instance (``instance``, its MIG device
    index; ``uuid`` is then the instance's ``MIG-`` UUID). ``slot`` is its place in the job's
    GPU list (rank order)."""

    host: str
    index: int
    uuid: str | None
    slot: int
    instance: int | None = None

    @property
    def key(self) -> GpuKey:
        return GpuKey(self.host, self.index, self.instance)

    def to_json(self) -> dict:
        out = {"host": self.host, "index": self.index, "uuid": self.uuid}
        if self.instance is not None:
            out["instance"] = self.instance
        return out


@dataclass(frozen=True)
class Reservation:
    """A live claim on k GPUs by one job, valid until ``expires_at`` unless renewed."""

    job_id: str
    pool: str
    gpus: tuple[ReservedGpu, ...]
    score: dict[str, float]
    created_at: datetime
    renewed_at: datetime
    expires_at: datetime
    gpu_count: int
    request: dict | None = None
    mean_distance: float | None = None
    identity: TaskIdentity | None = None
    team: str | None = None  # with teams (docs/teams.md): its team, and how many of its GPUs
    borrowed: int | None = None  # were above the team's quota when it was admitted
    #: priority, preemptible, checkpoint_at and, while it is being stopped, preempting (docs/preemption.md)
    preemption: dict | None = None

    @property
    def preempting(self) -> dict | None:
        """``{by, reason, at, priority}`` while the job is being preempted, else None."""
        return (self.preemption or {}).get("preempting")

    @property
    def keys(self) -> list[GpuKey]:
        return [g.key for g in self.gpus]

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(g.host for g in self.gpus))

    def to_json(self) -> dict:
        return {
            "job_id": self.job_id,
            "pool": self.pool,
            "gpus": [g.to_json() for g in self.gpus],
            "hosts": self.hosts,
            "score": dict(self.score),
            "request": self.request,
            "identity": self.identity.to_json() if self.identity else None,
            "created_at": self.created_at.isoformat(),
            "renewed_at": self.renewed_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            **({"team": self.team, "borrowed": self.borrowed or 0} if self.team is not None else {}),
        }


@dataclass(frozen=True)
class Eviction:
    """An abnormal GPU kept out of every pool until readmitted (SPEC §8, S11)."""

    host: str
    index: int
    uuid: str | None
    reasons: tuple[str, ...]
    evicted_at: datetime
    checked_at: datetime | None = None
    healthy_checks: int = 0

    @property
    def key(self) -> GpuKey:
        return GpuKey(self.host, self.index)

    def to_json(self) -> dict:
        return {
            "host": self.host,
            "index": self.index,
            "uuid": self.uuid,
            "reasons": list(self.reasons),
            "evicted_at": self.evicted_at.isoformat(),
            "checked_at": self.checked_at.isoformat() if self.checked_at else None,
            "healthy_checks": self.healthy_checks,
        }
