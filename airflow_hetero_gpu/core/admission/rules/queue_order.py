"""The queue order rule: the entries visited one by one in queue order
(:mod:`~airflow_hetero_gpu.core.admission.order`: priority with aging, then time enqueued).

Without reasons (``explain=False``, the simulator) the walk stops once nothing behind can start
or claim: every request still to come is known dead in this pass and no entry still to come
holds a claim (held and claimed GPUs only grow within a pass).
"""

from __future__ import annotations

from typing import Callable, Sequence

from airflow_hetero_gpu.core.admission.model import QueueEntry
from airflow_hetero_gpu.core.admission.records import Item, Outcome


class QueueOrder:
    """The walk in queue order (the :class:`~.base.Ordering` of a pass without teams)."""

    def walk(self, walk, entries: Sequence[QueueEntry], visit: Callable[[Item], Outcome]) -> None:
        stop = None if walk.explain else _Shortcut(entries)
        for rank, entry in enumerate(entries, 1):
            shape = walk.shape_of(entry)
            if stop is not None and stop.done(entry, shape):
                break
            visit(Item(rank, entry))
            if stop is not None and shape.dead:
                stop.live.discard(id(shape))


class _Shortcut:
    """Whether anything still to come could start or claim (see the module docstring)."""

    def __init__(self, entries: Sequence[QueueEntry]) -> None:
        self.unseen = {id(e.request) for e in entries}
        self.claims_left = sum(1 for e in entries if e.claim)
        self.live: set[int] = set()  # ids of the shapes seen that are not dead

    def done(self, entry: QueueEntry, shape) -> bool:
        if id(entry.request) in self.unseen:
            self.unseen.discard(id(entry.request))
            if not shape.dead:
                self.live.add(id(shape))
        if entry.claim:
            self.claims_left -= 1
            return False
        return not self.unseen and not self.live and not self.claims_left
