"""Process-wide settings of the interpreter changed while some work runs, and put back by the
last of the threads doing it (:class:`HeldSetting`); and :func:`gc_paused`, the cyclic garbage
collector paused while an inventory is parsed and built.

Parsing the stored inventory of 1,250 hosts and building its cluster makes a few hundred
thousand long-lived objects (GPUs, keys, links, parsed rows). While they are made, the cyclic
collector runs again and again over the growing heap, and finds nothing to free: in a task
process that spent about half of the build's CPU (``benchmarks/inventory_build.py``,
docs/performance.md). The collector is paused for the build and resumed after it (an explicit
``gc.disable()`` of the process is left alone): the objects are then looked at once, not at
every few hundred allocations.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Callable, ContextManager, Iterator


class HeldSetting:
    """A process-wide setting, changed by ``change`` when the first holder enters and put back by
    the undo it returned (None: nothing to put back) when the last holder leaves: nested and
    concurrent holders share one change."""

    def __init__(self, change: Callable[[], Callable[[], None] | None]) -> None:
        self._change = change
        self._lock = threading.Lock()
        self._holders = 0
        self._undo: Callable[[], None] | None = None

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._holders == 0:
                self._undo = self._change()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0 and self._undo is not None:
                    undo, self._undo = self._undo, None
                    undo()


def _pause_gc() -> Callable[[], None] | None:
    if not gc.isenabled():
        return None  # paused by the process itself: it stays so
    gc.disable()
    return gc.enable


_GC = HeldSetting(_pause_gc)


def gc_paused() -> ContextManager[None]:
    """The cyclic collector paused for the block or the decorated function (see the module
    docstring)."""
    return _GC.held()


__all__ = ["HeldSetting", "gc_paused"]
