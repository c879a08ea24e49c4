"""The interpreter's thread switching while a write of this process holds the ledger lock.

Every writer of the fleet waits on the ledger lock, so its hold is the fleet's latency. A write
makes a database round trip per statement, and CPython releases its global interpreter lock
(GIL) for each. When another thread of the same process is busy with pure Python meanwhile — in
the triggerer, a health check merging and judging its parts while a trigger's renewal runs its
pass — the writing thread waits, after each round trip, up to the interpreter's switch interval
(5 ms by default) for the busy thread to hand the GIL back: a pass of about 20 statements that
held the lock 10 ms alone held it 190 ms beside one busy thread on PostgreSQL, 414 ms on SQLite
(`benchmarks/pass_beside_busy_thread.py`, docs/performance.md).

:func:`prompt_switching` lowers the process's switch interval to :data:`WRITE_SWITCH_INTERVAL_S`
from the moment one of its writes asks for the lock to its commit, and puts back the interval
it found when the last such write ends. A process whose interval is already as short keeps its
own. The cost is more frequent switches of the busy threads for the lock's few milliseconds.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Iterator

#: the switch interval while a write of this process holds the ledger lock, in seconds
WRITE_SWITCH_INTERVAL_S = 0.0005

_lock = threading.Lock()
_holders = 0
_found: float | None = None  # the interval the first holder found (None: already as short)
_ours: float | None = None  # the interval as set, to tell whether someone changed it meanwhile


@contextmanager
def prompt_switching(interval: float = WRITE_SWITCH_INTERVAL_S) -> Iterator[None]:
    """Lower the switch interval to ``interval`` for the block (see the module docstring); nested
    and concurrent blocks share one lowering, undone when the last ends."""
    global _holders, _found, _ours
    with _lock:
        if _holders == 0:
            current = sys.getswitchinterval()
            if current > interval:
                sys.setswitchinterval(interval)
                _found, _ours = current, sys.getswitchinterval()
            else:
                _found = _ours = None
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _found is not None:
                if sys.getswitchinterval() == _ours:  # nobody else set it meanwhile: theirs stays
                    sys.setswitchinterval(_found)
                _found = _ours = None


__all__ = ["WRITE_SWITCH_INTERVAL_S", "prompt_switching"]
