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
from typing import Callable, ContextManager

from airflow_hetero_gpu.interpreter import HeldSetting

#: the switch interval while a write of this process holds the ledger lock, in seconds
WRITE_SWITCH_INTERVAL_S = 0.0005


def _lower() -> Callable[[], None] | None:
    found = sys.getswitchinterval()
    if found <= WRITE_SWITCH_INTERVAL_S:
        return None  # the process's own interval is as short: it stays
    sys.setswitchinterval(WRITE_SWITCH_INTERVAL_S)
    ours = sys.getswitchinterval()

    def put_back() -> None:
        if sys.getswitchinterval() == ours:  # nobody else set it meanwhile: theirs stays
            sys.setswitchinterval(found)

    return put_back


_SWITCHING = HeldSetting(_lower)


def prompt_switching() -> ContextManager[None]:
    """Lower the switch interval to :data:`WRITE_SWITCH_INTERVAL_S` for the block (see the module
    docstring); nested and concurrent blocks share one lowering, undone when the last ends."""
    return _SWITCHING.held()


__all__ = ["WRITE_SWITCH_INTERVAL_S", "prompt_switching"]
