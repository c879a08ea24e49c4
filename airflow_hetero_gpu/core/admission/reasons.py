"""The human reason of every waiting job, as the queue view and the operator's log print it.

    head of the queue: claims hgx-a1 GPU 0-7 (pool A100), 3 of them held by j1, j2×2
    3rd in the queue, first for its pool: claims rtx-1 GPU 0-3 (pool RTX 4090), all free
    4th in the queue, 2nd for pool A100, behind j7 (head for pool A100, claims hgx-a1 GPU 0-7, 3 of them
    held); now: A100: needs 4 available, has 2: 6 reserved (by j1×4, j2×2)
    can never start on this cluster as it is: A100: needs 16 GPUs, has 8 healthy of 8; ...
"""

from __future__ import annotations

from typing import Mapping, Sequence

from airflow_hetero_gpu.core.admission.model import Claim
from airflow_hetero_gpu.core.admission.order import ordinal
from airflow_hetero_gpu.core.model import PlanRequest

MAX_LISTED = 3


def _where(position: int) -> str:
    return "head of the queue" if position == 1 else f"{ordinal(position)} in the queue"


def impossible(request: PlanRequest, rejected: Mapping[str, str]) -> str:
    items = sorted(rejected.items())
    parts = [f"{pool}: {why}" for pool, why in items[:MAX_LISTED]]
    more = f"; +{len(items) - MAX_LISTED} more pools" if len(items) > MAX_LISTED else ""
    body = "; ".join(parts) + more if parts else "the cluster has no GPUs"
    return f"can never start on this cluster as it is (a mistake in the request, or hosts lost): {body}"


def refused(position: int, kind, why: str) -> str:
    """A job a rule stops: ``3rd in the queue, blocked by quota: team intern: ...``, ``2nd in the
    queue, waits: team intern runs its 4 of max_jobs 4``."""
    if kind.value == "quota":
        return f"{_where(position)}, blocked by quota: {why}"
    return f"{_where(position)}, waits: {why}"


def head(position: int, claim: Claim) -> str:
    lead = "head of the queue" if position == 1 else f"{ordinal(position)} in the queue, first for its pool"
    return f"{lead}: {claim.describe()}"


def behind(heads: Sequence[Claim]) -> str:
    """``, behind j7 (head for pool A100, ...)``: the heads a waiting job is behind ("" for none)."""
    if not heads:
        return ""
    listed = "; ".join(f"{h.job_id} ({h.short()})" for h in heads[:MAX_LISTED])
    more = f"; +{len(heads) - MAX_LISTED} more heads" if len(heads) > MAX_LISTED else ""
    return f", behind {listed}{more}"


def waiting(position: int, heads: Sequence[Claim], single_pool: str | None,
            pool_position: int | None, why_not_now: str | None, no_target: str | None,
            behind_text: str | None = None) -> str:
    """``behind_text``: :func:`behind` of ``heads``, when the caller has it already."""
    text = _where(position)
    if single_pool is not None and pool_position is not None:
        text = f"{ordinal(position)} in the queue, {ordinal(pool_position)} for pool {single_pool}"
    if heads:
        text += behind(heads) if behind_text is None else behind_text
    elif no_target:
        text += f"; no pool can hold it even when running jobs end: {no_target}"
    if why_not_now:
        text += f"; now: {why_not_now}"
    return text


#: a waiting job whose pools lack the healthy GPUs it needs repeats its warning every this many looks
WARN_EVERY_LOOKS = 10


class WaitNotes:
    """What a waiting job's log says at each look at its queue entry: a new standing at info; while
    it is ``impossible`` (its pools have the GPUs, but not that many healthy: hosts or GPUs lost),
    a warning at the first look and again every ``every`` looks, so a long wait keeps saying why.
    A request larger than its pools at all never waits (:mod:`airflow_hetero_gpu.core.request_check`)."""

    def __init__(self, every: int = WARN_EVERY_LOOKS):
        self.every = max(1, every)
        self._said: str | None = None
        self._looks = 0

    def note(self, standing: str | None, text: str) -> tuple[str, str] | None:
        """``(level, line)`` to log now, or None."""
        if standing == "impossible":
            due = text != self._said or self._looks % self.every == 0
            self._looks = 1 if text != self._said else self._looks + 1
            self._said = text
            if due:
                return "warning", f"waits until hosts or GPUs come back (its pools lack that many healthy GPUs): {text}"
            return None
        self._looks = 0
        if text == self._said:
            return None
        self._said = text
        return "info", text
