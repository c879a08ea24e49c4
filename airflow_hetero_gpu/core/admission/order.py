"""The queue's order: priority, then time enqueued, with aging so no job waits forever.

A job's **effective priority** at time ``now`` is

    priority + (now - enqueued_at) / aging_interval_s

so every ``aging_interval_s`` seconds waited is worth one priority level. The queue is sorted by
effective priority, highest first; ties go to the job enqueued first, then to the job id.

Because every waiting job ages at the same rate, the order between two jobs never changes while
they wait: job X (priority p, enqueued at t_x) is ahead of job Y (q, t_y) exactly when
``t_x - p * A < t_y - q * A`` (A = ``aging_interval_s``). So sorting by that *virtual enqueue time*
is the same as sorting by effective priority at any instant, and:

* a higher-priority job passes a lower one that waited longer only if it was enqueued less than
  ``(q - p) * A`` seconds after it;
* **the bound**: a job of priority p is never passed by a job enqueued more than
  ``(q_max - p) * A`` seconds after it, q_max the highest priority in use; after that window only
  the finitely many jobs already ahead of it stand between it and the head.

``aging_interval_s=None`` turns aging off: strict priority, then time enqueued (a low-priority job
can then wait as long as higher-priority work keeps coming).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from airflow_hetero_gpu.core.admission.defaults import DEFAULT_AGING_INTERVAL_S  # noqa: F401 - re-exported
from airflow_hetero_gpu.core.admission.model import QueueEntry
from airflow_hetero_gpu.errors import RequestError


def check_aging(aging_interval_s: float | None) -> float | None:
    if aging_interval_s is None:
        return None
    if (isinstance(aging_interval_s, bool) or not isinstance(aging_interval_s, (int, float))
            or not math.isfinite(aging_interval_s) or aging_interval_s <= 0):
        raise RequestError(f"aging_interval_s: expected a positive number of seconds or None, got {aging_interval_s!r}")
    return float(aging_interval_s)


def rank_key(entry: QueueEntry, aging_interval_s: float | None) -> tuple:
    """Sort key: smaller is earlier in the queue."""
    if aging_interval_s is None:
        return (-entry.priority, entry.enqueued_at, entry.job_id)
    return (entry.enqueued_at - entry.priority * aging_interval_s, entry.enqueued_at, entry.job_id)


def effective_priority(entry: QueueEntry, now: float, aging_interval_s: float | None) -> float:
    if aging_interval_s is None:
        return float(entry.priority)
    return entry.priority + (now - entry.enqueued_at) / aging_interval_s


def ordered(entries: Iterable[QueueEntry], aging_interval_s: float | None) -> list[QueueEntry]:
    """The entries in queue order; a job id twice is a caller's mistake."""
    out = sorted(entries, key=lambda e: rank_key(e, aging_interval_s))
    seen: set[str] = set()
    for e in out:
        if e.job_id in seen:
            raise RequestError(f"queue: job {e.job_id!r} is queued twice")
        seen.add(e.job_id)
    return out


def passing_window_s(p: int, q: int, aging_interval_s: float | None) -> float:
    """How long after a priority-``p`` job a priority-``q`` job may be enqueued and still pass it."""
    if q <= p:
        return 0.0
    return math.inf if aging_interval_s is None else (q - p) * aging_interval_s


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


__all__: Sequence[str] = ("DEFAULT_AGING_INTERVAL_S", "rank_key", "effective_priority", "ordered",
                          "passing_window_s", "ordinal", "check_aging")
