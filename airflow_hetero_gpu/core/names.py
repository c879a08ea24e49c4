"""The one rule for the names a user types that the ledger stores and the hosts see: team names
and job ids. Every reader checks them here: the teams file, the operator and the decorator, the
command line (``plan --reserve --team/--job-id``, ``release --job-id``) and the ledger's public
methods (``reserve``, ``enqueue``, ...), on SQLite and PostgreSQL alike.

* a **team name**: 1-64 characters of letters, digits, ``_ . @ -``, starting with a letter or a digit;
* a **job id**: 1-128 characters of letters, digits, ``. _ -``, not ``.`` or ``..`` (it names the
  job's pid files on the hosts and is exported as ``HETERO_GPU_JOB_ID``).

The whole value must match (``fullmatch``: ``"a\\n"`` is refused, where ``re.match`` with ``$``
would take it as a team distinct from ``a``). Standard library only.
"""

from __future__ import annotations

import re

from airflow_hetero_gpu.errors import HeteroGpuError

TEAM = "team"
JOB_ID = "job id"
MAX_TEAM_NAME = 64
MAX_JOB_ID = 128

_RULES = {
    TEAM: (re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]*"), MAX_TEAM_NAME,
           "letters, digits, '_', '.', '@' or '-', starting with a letter or digit"),
    JOB_ID: (re.compile(r"[A-Za-z0-9._-]+"), MAX_JOB_ID, "letters, digits, '.', '_' or '-'"),
}


class InvalidName(HeteroGpuError, ValueError):
    """A team name or job id breaks the rule; the message names the kind and the value."""


def name_problem(value: object, kind: str = TEAM) -> str | None:
    """Why ``value`` is not a valid ``kind`` (:data:`TEAM` or :data:`JOB_ID`), or None when it is."""
    pattern, longest, allowed = _RULES[kind]
    if (not isinstance(value, str) or len(value) > longest or pattern.fullmatch(value) is None
            or value in (".", "..")):
        shown = value if not isinstance(value, str) or len(value) <= 80 else value[:80] + "..."
        return f"invalid {kind} {shown!r}: use 1-{longest} {allowed}"
    return None


def check_name(value: object, kind: str = TEAM) -> str:
    """``value`` when it is a valid ``kind`` (:data:`TEAM` or :data:`JOB_ID`), else :class:`InvalidName`."""
    problem = name_problem(value, kind)
    if problem is not None:
        raise InvalidName(problem)
    return value  # type: ignore[return-value]


def valid_name(value: object, kind: str = TEAM) -> bool:
    return name_problem(value, kind) is None


__all__ = ["JOB_ID", "MAX_JOB_ID", "MAX_TEAM_NAME", "TEAM", "InvalidName", "check_name", "name_problem",
           "valid_name"]
