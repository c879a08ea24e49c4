"""The protocol between the walk and its rules (docs/queue.md, "Rules").

A :class:`Rule` may narrow the pools an entry may use now (:meth:`Rule.verdict`), offer a claim
for an entry that cannot start (:meth:`Rule.blocked`: preemption), keep its accounts as entries
start or wait (:meth:`Rule.started`, :meth:`Rule.held`), remark on a waiting entry's reason
(:meth:`Rule.note`) and finish the result (:meth:`Rule.finish`). Every method has a do-nothing
default, so a rule says only what it decides.

An :class:`Ordering` decides in what order the walk visits the entries: it calls ``visit`` for
each and learns the :class:`~.records.Outcome`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Protocol

from airflow_hetero_gpu.core.admission.records import Item, Outcome, Reason, Verdict

if TYPE_CHECKING:
    from airflow_hetero_gpu.core.admission.model import Admitted, AdmissionResult, Claim, QueueEntry
    from airflow_hetero_gpu.core.admission.passstate import Shape
    from airflow_hetero_gpu.core.admission.walk import Walk


class Rule:
    """A rule of the admission pass; subclasses override what they decide."""

    def verdict(self, walk: "Walk", item: Item, shape: "Shape") -> Verdict | None:
        """The pools ``item`` may use now (None: this rule has no say)."""
        return None

    def blocked(self, walk: "Walk", item: Item, shape: "Shape") -> "Claim | None":
        """A claim for an entry that cannot start now, decided by this rule (None: the usual claim)."""
        return None

    def started(self, walk: "Walk", item: Item, admitted: "Admitted", pool: int) -> None:
        """``item`` starts now in the cluster's pool number ``pool``."""

    def held(self, walk: "Walk", item: Item, shape: "Shape", claim: "Claim | None", refused: bool) -> None:
        """``item`` waits (``refused``: a rule stopped it); ``shape`` holds the pools it could use."""

    def note(self, walk: "Walk", item: Item) -> Reason | None:
        """A remark added after a waiting entry's reason."""
        return None

    def finish(self, walk: "Walk", result: "AdmissionResult") -> "AdmissionResult":
        return result


class Ordering(Protocol):
    def walk(self, walk: "Walk", entries: Iterable["QueueEntry"],
             visit: Callable[[Item], Outcome]) -> None: ...  # pragma: no cover - protocol
