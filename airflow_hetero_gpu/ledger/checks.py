"""Checks of the values the ledger's methods take: one-line LedgerError naming the value."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Iterable

from sqlalchemy.exc import DBAPIError

from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.core.names import JOB_ID, TEAM, name_problem
from airflow_hetero_gpu.durations import MAX_DURATION_S
from airflow_hetero_gpu.ledger import schema
from airflow_hetero_gpu.ledger.errors import LedgerError

DEFAULT_EVICTION_REASON = "abnormal"


def first_line(err: DBAPIError) -> str:
    text = str(err.orig) if err.orig is not None else str(err)
    return (text.strip().splitlines() or [type(err).__name__])[0]


def check_job_id(job_id: object) -> str:
    """A job id by the one rule (:mod:`airflow_hetero_gpu.core.names`), else a one-line LedgerError."""
    problem = name_problem(job_id, JOB_ID)
    if problem is not None:
        raise LedgerError(problem)
    return job_id  # type: ignore[return-value]


def check_team(team: object) -> str | None:
    """A team name by the one rule, or None (the default team); else a one-line LedgerError."""
    if team is None:
        return None
    problem = name_problem(team, TEAM)
    if problem is not None:
        raise LedgerError(problem)
    return team  # type: ignore[return-value]


#: A job's priority: an integer within +-MAX_PRIORITY (the column is a 32-bit integer on PostgreSQL,
#: and aging adds to it; a million levels is far more than any scheme uses).
MAX_PRIORITY = 1_000_000


def check_priority(priority: object, job_id: str) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise LedgerError(f"job {job_id!r}: priority: expected an integer, got {priority!r}")
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise LedgerError(f"job {job_id!r}: priority: expected an integer from {-MAX_PRIORITY} to {MAX_PRIORITY}, "
                          f"got {priority}")
    return priority


def check_lease(seconds: object) -> timedelta:
    """A lease: a positive number of seconds, at most :data:`MAX_DURATION_S` (365 days)."""
    if (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds)
            or not 0 < seconds <= MAX_DURATION_S):
        raise LedgerError(f"lease_seconds: expected a positive number of seconds, at most {MAX_DURATION_S:.0f} "
                          f"(365 days), got {seconds!r}")
    return timedelta(seconds=float(seconds))


def check_key(key: object) -> GpuKey:
    """A GPU as (host, index), or a MIG instance as (host, index, instance)."""
    if isinstance(key, (str, bytes)):
        raise LedgerError(f"GPU: expected (host, index), got {key!r}")
    try:
        host, index, *rest = key  # type: ignore[misc]
    except (TypeError, ValueError):
        raise LedgerError(f"GPU: expected (host, index), got {key!r}") from None
    instance = rest[0] if rest else None
    if (not isinstance(host, str) or not host or isinstance(index, bool) or not isinstance(index, int) or index < 0
            or len(rest) > 1 or (instance is not None and (isinstance(instance, bool) or not isinstance(instance, int)
                                                           or instance < 0))):
        raise LedgerError(f"GPU: expected (host, index >= 0[, MIG instance >= 0]), got {key!r}")
    return GpuKey(host, index, instance)


def instance_column(instance: int | None) -> int:
    """``reservation_gpus.mig_instance`` of a unit: its MIG device index, or WHOLE_GPU."""
    return schema.WHOLE_GPU if instance is None else instance


def instance_of(column: int | None) -> int | None:
    return None if column is None or column == schema.WHOLE_GPU else column


def check_reasons(reasons: Iterable[str] | str) -> tuple[str, ...]:
    if isinstance(reasons, str):
        reasons = (reasons,)
    out = tuple(dict.fromkeys(str(r) for r in reasons if str(r).strip()))
    return out or (DEFAULT_EVICTION_REASON,)
