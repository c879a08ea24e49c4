"""argparse value types of the ``hetero-gpu`` sub-commands: each rejects a bad value with one
line naming it (argparse adds the option's name)."""

from __future__ import annotations

import argparse
import math


def team_name(text: str) -> str:
    """``--team``: a team name by the one rule (:mod:`airflow_hetero_gpu.core.names`)."""
    from airflow_hetero_gpu.core.names import TEAM, name_problem

    problem = name_problem(text, TEAM)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def job_id(text: str) -> str:
    """``--job-id``: a job id by the one rule, as the operator's (:mod:`airflow_hetero_gpu.core.names`)."""
    from airflow_hetero_gpu.core.names import JOB_ID, name_problem

    problem = name_problem(text, JOB_ID)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return value


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def positive_seconds(text: str) -> float:
    """Seconds > 0 and at most 365 days (``--interval``, ``--connect-timeout``; ``1e300`` would
    overflow a sleep or a socket's timeout)."""
    from airflow_hetero_gpu.durations import MAX_DURATION_S

    value = _number(text, "a number of seconds")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    if value > MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_DURATION_S:.0f} seconds (365 days), got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, "a number")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def mib(text: str) -> int | float:
    """A non-negative amount of MiB (an integer when it is whole)."""
    value = _number(text, "a number of MiB")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative number of MiB, got {text!r}")
    return int(value) if value.is_integer() else value
