"""The planner's vocabulary: GPUs, hosts, requests, pools and decisions.

Plain dataclasses, no Airflow, no I/O. Everything here serialises to the JSON of SPEC §10.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from airflow_hetero_gpu.errors import RequestError


class GpuKey(tuple):
    """A schedulable unit's address: ``(host, index)`` for a whole GPU (host name, nvidia-smi
    index), ``(host, index, instance)`` for a MIG instance (its MIG device index on that GPU).

    A plain tuple of two or three items, so a whole GPU's key equals, hashes and sorts like the
    ``(host, index)`` pair it always was (keys read back from JSON or database rows still find
    their GPU, and an instance sorts right after its GPU). Code that handles MIG instances reads
    ``key.instance`` (``None`` for a whole GPU) and ``key.gpu`` (the physical GPU's key); a
    two-name unpacking ``host, index = key`` fails loudly on an instance's key.
    """

    __slots__ = ()

    def __new__(cls, host: str, index: int, instance: int | None = None) -> "GpuKey":
        return tuple.__new__(cls, (host, index) if instance is None else (host, index, instance))

    def __getnewargs__(self):  # pickle and copy call __new__ with the items
        return tuple(self)

    @property
    def host(self) -> str:
        return self[0]

    @property
    def index(self) -> int:
        return self[1]

    @property
    def instance(self) -> int | None:
        return self[2] if len(self) > 2 else None

    def __repr__(self) -> str:
        extra = "" if self.instance is None else f", instance={self.instance}"
        return f"GpuKey(host={self.host!r}, index={self.index!r}{extra})"

    def __str__(self) -> str:
        if self.instance is None:
            return f"{self.host}:{self.index}"
        return f"{self.host}:{self.index}/mig{self.instance}"

    @property
    def gpu(self) -> "GpuKey":
        """The physical GPU: this key without its MIG instance."""
        return self if self.instance is None else GpuKey(self.host, self.index)

    @property
    def sort_key(self) -> tuple[str, int, int]:
        """Host, index, then instance (the whole GPU first)."""
        return (self.host, self.index, -1 if self.instance is None else self.instance)


def as_key(key) -> GpuKey:
    """A :class:`GpuKey` from a key, a ``(host, index)`` or a ``(host, index, instance)`` tuple."""
    return key if isinstance(key, GpuKey) else GpuKey(*key)


@dataclass(frozen=True)
class Fabric:
    """A GPU's NVLink fabric registration (``fabric.*`` fields) and its compute tray.

    ``domain`` names the multi-node NVLink domain (NVL72 rack partition) the GPU belongs to:
    ``<cluster UUID>/<clique id>`` when the registration completed with success and the cluster
    UUID is not all zeros, else ``None``. An HGX H100 (NVSwitch inside one host only) reports
    ``Completed``, clique 0 and an all-zero cluster UUID: no domain, so equal clique ids alone
    never join hosts.
    """

    state: str | None = None
    status: str | None = None
    clique_id: int | None = None
    cluster_uuid: str | None = None
    health_summary: str | None = None
    bandwidth: str | None = None
    tray_index: int | None = None

    @property
    def registered(self) -> bool:
        return (self.state or "").lower() == "completed" and (self.status or "").lower() == "success"

    @property
    def domain(self) -> str | None:
        uuid = (self.cluster_uuid or "").strip().lower()
        if not self.registered or self.clique_id is None or not uuid or set(uuid) <= set("0-"):
            return None
        return f"{uuid}/{self.clique_id}"

    def to_json(self) -> dict:
        return {"state": self.state, "status": self.status, "clique_id": self.clique_id,
                "cluster_uuid": self.cluster_uuid, "health_summary": self.health_summary,
                "bandwidth": self.bandwidth, "tray_index": self.tray_index, "domain": self.domain}


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU (``nvidia-smi --query-compute-apps``) with its owner and
    process group (``ps``; ``None`` when the process ended between the two reads)."""

    pid: int
    name: str
    memory_mib: float | None = None
    user: str | None = None
    pgid: int | None = None
    job: str | None = None  # the scheduler's job it belongs to (its environment's marker), if known

    def describe(self) -> str:
        """``alice, pid 4242 python3, 1,632 MiB``."""
        memory = "" if self.memory_mib is None else f", {self.memory_mib:,.0f} MiB"
        return f"{self.user or 'unknown user'}, pid {self.pid} {self.name.rsplit('/', 1)[-1]}{memory}"

    def to_json(self) -> dict:
        return {"pid": self.pid, "name": self.name, "memory_mib": self.memory_mib, "user": self.user,
                "pgid": self.pgid, "job": self.job}


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
    # MIG: on a whole GPU the mode now and after the next reset ("Enabled"/"Disabled", None
    # where the GPU has no MIG); on a MIG instance its MIG device index, profile ("3g.40gb")
    # and the UUID of the GPU it is carved from (``uuid`` is then the instance's MIG-... UUID)
    mig_mode: str | None = None
    mig_pending: str | None = None
    instance: int | None = None
    mig_profile: str | None = None
    gpu_uuid: str | None = None
    # why this unit is never handed out although healthy: "mig-enabled" (its instances are
    # handed out instead), "mig-mode-change-pending" (until the GPU is reset)
    unschedulable: tuple[str, ...] = ()
    fabric: Fabric | None = None
    # its compute processes as last collected (core/foreign.py): while no job holds the GPU,
    # it is "in use outside the scheduler"
    outside: tuple[GpuProcess, ...] = ()

    @property
    def key(self) -> GpuKey:
        return GpuKey(self.host, self.index, self.instance)

    @property
    def is_mig_instance(self) -> bool:
        return self.instance is not None

    def load(self, unknown_utilization: float = 1.0) -> float:
        """``u = max(utilization, memory.used / memory.total)`` clamped to [0, 1] (SPEC §4);
        an unknown utilization (nvidia-smi's ``[N/A]``) counts as ``unknown_utilization``
        (cluster.yaml's ``thresholds.unknown_utilization``, default 1: not idle)."""
        u = unknown_utilization if self.utilization is None else self.utilization
        if self.memory_total_mib and self.memory_used_mib is not None and self.memory_total_mib > 0:
            u = max(u, self.memory_used_mib / self.memory_total_mib)
        return min(1.0, max(0.0, u))

    @property
    def base_load(self) -> float:
        """:meth:`load` with the default for an unknown utilization (1)."""
        return self.load()

    @property
    def nvlink_domain(self) -> str | None:
        """The multi-node NVLink domain (``Fabric.domain``) of this GPU, if any."""
        return self.fabric.domain if self.fabric is not None else None

    @property
    def memory_free_mib(self) -> float | None:
        if self.memory_total_mib is None:
            return None
        return self.memory_total_mib - (self.memory_used_mib or 0.0)

    def ref(self) -> dict:
        """The short form used in decisions: host, index, uuid, name (and, for a MIG instance,
        ``instance``: its MIG device index; ``uuid`` is then the instance's ``MIG-`` UUID)."""
        out = {"host": self.host, "index": self.index, "uuid": self.uuid, "name": self.name}
        if self.instance is not None:
            out["instance"] = self.instance
        return out

    @property
    def cuda_device(self) -> str:
        """What ``CUDA_VISIBLE_DEVICES`` names this unit by: the index of a whole GPU, the
        ``MIG-`` UUID of a MIG instance."""
        return self.uuid if self.instance is not None else str(self.index)

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
            "instance": self.instance,
            "mig": self._mig_json(),
            "unschedulable": list(self.unschedulable),
            "fabric": self.fabric.to_json() if self.fabric is not None else None,
            "outside": [p.to_json() for p in self.outside],
        }

    def _mig_json(self) -> dict | None:
        if self.instance is not None:
            return {"profile": self.mig_profile, "gpu_uuid": self.gpu_uuid}
        if self.mig_mode is None and self.mig_pending is None:
            return None
        return {"mode": self.mig_mode, "pending": self.mig_pending}


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
    # plan(explain=False) leaves ``reason`` None where writing it out is costly and puts here what
    # writes it on demand (the admission pass reads one pool's reason, and only when unplaced)
    explain: "Callable[[], str | None] | None" = field(default=None, repr=False, compare=False)

    def reason_text(self) -> str | None:
        if self.reason is None and self.explain is not None:
            self.reason, self.explain = self.explain(), None
        return self.reason

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
                {"host": g.host, "index": g.index, **({} if g.instance is None else {"instance": g.instance}),
                 "reasons": list(g.reasons)} for g in self.unhealthy
            ],
        }
