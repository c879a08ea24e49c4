"""The typed records one admission pass's walk and its rules hand each other (docs/queue.md):
what a rule says about an entry (:class:`Verdict`), why an entry waits (:class:`Reason`, with a
:class:`ReasonKind` beside its text), and where an entry ended up in the pass (:class:`Held`).
"""

from __future__ import annotations

import enum

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

import numpy as np

from airflow_hetero_gpu.core.admission.model import Claim, QueueEntry, ReasonKind  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from airflow_hetero_gpu.core.admission.passstate import Shape


@dataclass(frozen=True)
class Reason:
    kind: ReasonKind
    text: str = ""


class Stage(enum.Enum):
    """Which walk over the queue an entry is visited in: the one walk in order (no teams), or,
    with teams, the walk in order of the jobs within quota, then the borrowers'."""

    IN_ORDER = "in_order"
    WITHIN_QUOTA = "within_quota"
    BORROWING = "borrowing"


class Item(NamedTuple):
    """One entry as the walk visits it: its place in the queue (``rank``, 1 = first), its team
    (None without teams) and the stage. (A named tuple: the walk makes one or two per waiting job
    every pass.)"""

    rank: int
    entry: QueueEntry
    team: str | None = None
    stage: Stage = Stage.IN_ORDER


class Outcome(enum.Enum):
    STARTED = "started"
    HELD = "held"  # it waits: head, waiting or impossible (recorded)
    DEFERRED = "deferred"  # a rule put it off to a later stage (not recorded yet)


@dataclass
class Verdict:
    """A rule's say on an entry: the pools it may use now (a mask over the cluster's pools), the
    GPUs it would borrow per such pool, and, when no pool is left, why (``refusal``; ``defer``:
    it is visited again in a later stage rather than waiting now)."""

    pools: np.ndarray
    borrow: dict[int, int] = field(default_factory=dict)
    refusal: Reason | None = None
    defer: bool = False


class Held(NamedTuple):
    """An entry that does not start in this pass, as the walk recorded it (a named tuple: one per
    waiting job every pass)."""

    position: int
    entry: QueueEntry
    state: str  # head, waiting, impossible
    claim: Claim | None
    shape: "Shape"
    heads: Sequence[Any]  # the heads it waits behind (a shared empty tuple for none)
    refusal: Reason | None = None  # the rule that stopped it (then its reason is the rule's)
    notes: tuple[Reason, ...] = ()  # the rules' remarks added after the reason
