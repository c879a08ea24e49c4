"""The queue's vocabulary: what waits (:class:`QueueEntry`), what an admission pass decides
(:class:`Admitted`, :class:`Waiting`, :class:`Claim`) and the whole answer (:class:`AdmissionResult`).

Plain frozen dataclasses, no I/O: a caller (the ledger inside one transaction, the simulator)
builds entries from its own rows and stores the answer back; ``to_json``/``from_json`` give the
JSON form for a database column or ``hetero-gpu queue --json``.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, Sequence

from airflow_hetero_gpu.core.model import Decision, GpuKey, PlanRequest
from airflow_hetero_gpu.errors import RequestError

STATES = ("head", "waiting", "impossible")


class ReasonKind(enum.Enum):
    """What kind of reason a waiting entry has; the text says the rest."""

    QUEUE = "queue"  # it waits its turn behind the heads, or for GPUs to free up
    HEAD = "head"  # it heads a pool with a claim
    IMPOSSIBLE = "impossible"  # no pool of the cluster as it is can hold it
    QUOTA = "quota"  # its team's quota (and what others lend) stops it
    MAX_JOBS = "max_jobs"  # its team runs as many jobs as its max_jobs
    NOTE = "note"  # a rule's remark added after the reason (team within quota, borrowing)


def describe_gpus(keys) -> str:
    """``hgx-a1 GPU 0-7``, ``a GPU 0,2, b GPU 1-3``: GPUs grouped by host, runs of indices joined."""
    by_host: dict[str, list[int]] = {}
    for k in sorted(GpuKey(*k) for k in keys):
        by_host.setdefault(k.host, []).append(k.index)
    parts = []
    for host, idx in by_host.items():
        runs, start, prev = [], idx[0], idx[0]
        for i in idx[1:] + [None]:
            if i is not None and i == prev + 1:
                prev = i
                continue
            runs.append(f"{start}" if start == prev else f"{start}-{prev}")
            if i is not None:
                start = prev = i
        parts.append(f"{host} GPU {','.join(runs)}")
    return ", ".join(parts)


def describe_holders(holders) -> str:
    """``j1, j2×2``: job ids by how many GPUs each holds (most first, at most three named)."""
    counts = Counter(holders)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    named = [f"{job}×{n}" if n > 1 else job for job, n in ranked[:3]]
    more = f", +{len(ranked) - 3} more" if len(ranked) > 3 else ""
    return ", ".join(named) + more


@dataclass(frozen=True)
class QueueEntry:
    """One waiting job as the caller stores it.

    ``enqueued_at`` and the pass's ``now`` are seconds on one clock (the ledger: epoch seconds;
    the simulator: its own). ``claim`` is what the previous pass claimed for the job (empty: none);
    a pass keeps it while it stays valid, so the head does not chase a moving target.
    """

    job_id: str
    request: PlanRequest
    priority: int = 0
    enqueued_at: float = 0.0
    claim: tuple[GpuKey, ...] = ()
    team: str | None = None  # None: the default team (matters only when teams are configured)

    def __post_init__(self) -> None:
        if not isinstance(self.job_id, str) or not self.job_id.strip():
            raise RequestError(f"queue entry: job_id: expected a non-empty string, got {self.job_id!r}")
        if not isinstance(self.request, PlanRequest):
            raise RequestError(f"queue entry {self.job_id}: request: expected a PlanRequest, got {self.request!r}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise RequestError(f"queue entry {self.job_id}: priority: expected an integer, got {self.priority!r}")
        if (isinstance(self.enqueued_at, bool) or not isinstance(self.enqueued_at, (int, float))
                or not math.isfinite(self.enqueued_at)):
            raise RequestError(f"queue entry {self.job_id}: enqueued_at: expected seconds, got {self.enqueued_at!r}")
        if self.team is not None and (not isinstance(self.team, str) or not self.team.strip()):
            raise RequestError(f"queue entry {self.job_id}: team: expected a non-empty string, got {self.team!r}")
        object.__setattr__(self, "claim", tuple(GpuKey(*k) for k in self.claim))

    def to_json(self) -> dict:
        out = {"job_id": self.job_id, "request": self.request.to_json(), "priority": self.priority,
               "enqueued_at": self.enqueued_at, "claim": [list(k) for k in self.claim]}
        if self.team is not None:
            out["team"] = self.team
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "QueueEntry":
        req = dict(data["request"])
        return cls(str(data["job_id"]), PlanRequest(**req), int(data.get("priority", 0)),
                   float(data.get("enqueued_at", 0.0)), tuple(GpuKey(h, int(i)) for h, i in data.get("claim") or ()),
                   data.get("team"))


@dataclass(frozen=True)
class Claim:
    """The GPUs held for a head: its target set, in one pool.

    ``held_by``: claimed GPUs a running job holds (job id each; a job admitted in the same pass
    counts as running). The rest are free now and kept idle for the head: no job behind it may
    start on any claimed GPU.
    """

    job_id: str
    pool: str
    gpus: tuple[GpuKey, ...]
    held_by: Mapping[GpuKey, str] = field(default_factory=dict)
    kept: bool = False  # the previous pass's claim, still valid

    @property
    def free(self) -> tuple[GpuKey, ...]:
        return tuple(k for k in self.gpus if k not in self.held_by)

    @property
    def waiting_on(self) -> int:
        """Claimed GPUs not free yet."""
        return len(self.held_by)

    @cached_property
    def gpus_text(self) -> str:
        """``hgx-a1 GPU 0-7``: written once (every job waiting behind a head names its claim)."""
        return describe_gpus(self.gpus)

    def describe(self) -> str:
        """``claims hgx-a1 GPU 0-7 (pool A100), 3 of them held by j1, j2×2``."""
        text = f"claims {self.gpus_text} (pool {self.pool})"
        if self.held_by:
            text += f", {len(self.held_by)} of them held by {describe_holders(self.held_by.values())}"
        if not self.waiting_on:
            text += ", all free"
        return text

    def short(self) -> str:
        """``head for pool A100, claims hgx-a1 GPU 0-7, 3 of them held``."""
        return self.short_text

    @cached_property
    def short_text(self) -> str:
        """:meth:`short`'s text, written once (every job waiting behind a head names it)."""
        held = f"{len(self.held_by)} of them held" if self.held_by else "all free"
        return f"head for pool {self.pool}, claims {self.gpus_text}, {held}"

    def to_json(self) -> dict:
        return {"job_id": self.job_id, "pool": self.pool, "gpus": [list(k) for k in self.gpus],
                "held_by": {str(k): j for k, j in self.held_by.items()},
                "free": len(self.free), "kept": self.kept}


@dataclass(frozen=True)
class Admitted:
    """A job that starts now on ``gpus``; ``decision`` is plan()'s (None for another placer).

    With teams configured (docs/teams.md), ``team`` is its team and ``borrowed`` how many of its
    GPUs are above its team's quota, on other teams' idle quota (0: all within quota); a reclaim
    of borrowed quota starts from these.
    """

    job_id: str
    position: int  # its place in the queue at this pass, 1 = first
    gpus: tuple[GpuKey, ...]
    pool: str
    decision: Decision | None = None
    team: str | None = None
    borrowed: int = 0

    def to_json(self) -> dict:
        out = {"job_id": self.job_id, "position": self.position, "pool": self.pool,
               "gpus": [list(k) for k in self.gpus],
               "decision": self.decision.to_json() if self.decision else None}
        if self.team is not None:
            out.update(team=self.team, borrowed=self.borrowed)
        return out


@dataclass(frozen=True)
class Waiting:
    """A job that does not start now, with its place in the queue and why.

    ``state``: ``head`` (it holds ``claim``), ``waiting`` (behind the heads named in ``behind``,
    or nothing can hold it until GPUs busy outside the ledger free up) or ``impossible`` (no pool
    of the cluster as it is can ever hold it: a user mistake or lost hosts; it claims nothing and
    blocks nobody).
    """

    job_id: str
    position: int
    state: str
    reason: str
    effective_priority: float
    claim: Claim | None = None
    behind: tuple[str, ...] = ()
    kind: ReasonKind = ReasonKind.QUEUE  # what kind of reason (the rule that stopped it, or its state)

    def to_json(self) -> dict:
        return {"job_id": self.job_id, "position": self.position, "state": self.state, "reason": self.reason,
                "kind": self.kind.value,
                "effective_priority": self.effective_priority, "behind": list(self.behind),
                "claim": self.claim.to_json() if self.claim else None}


@dataclass
class AdmissionResult:
    """One pass: who starts now (in queue order) and where everyone else stands.

    ``order`` lists every entry's job id in queue order. With ``explain=False`` (the simulator)
    ``waiting`` holds only the heads and impossible entries and reasons are left empty.
    """

    now: float
    admitted: list[Admitted]
    waiting: list[Waiting]
    entries: Sequence[QueueEntry] = field(default=(), repr=False)  # the queue, in order
    teams: list | None = None  # with teams configured: quota.BucketStanding per team and pattern
    preemptions: list = field(default_factory=list)  # preemption.Preemption decided in this pass

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(e.job_id for e in self.entries)

    @property
    def claims(self) -> dict[str, Claim]:
        return {w.job_id: w.claim for w in self.waiting if w.claim is not None}

    def get(self, job_id: str) -> Admitted | Waiting | None:
        for item in (*self.admitted, *self.waiting):
            if item.job_id == job_id:
                return item
        return None

    def to_json(self) -> dict:
        out = {"now": self.now, "order": list(self.order), "admitted": [a.to_json() for a in self.admitted],
               "waiting": [w.to_json() for w in self.waiting]}
        if self.teams is not None:
            out["teams"] = [row.to_json() for row in self.teams]
        return out
