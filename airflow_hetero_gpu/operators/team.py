"""The team a training task draws on (docs/teams.md#with-airflows-multi-team-mode).

Outside Airflow's multi-team mode the team is what the task names: the operator's (or
``@task.hetero_train``'s) ``team``, else ``[hetero_gpu] default_team``, else ``default``.

In multi-team mode (``[core] multi_team = True``) the team is the DAG bundle's, as Airflow knows
it: the DAG run's ``team_name`` (the task SDK's ``context["dag_run"].team_name``; the
``AIRFLOW_CTX_TEAM_NAME`` variable of the task's environment where a context lacks it). A DAG
author writes no ``team``; one that names another team fails the task at once, in one line
naming both, before anything is queued or reserved. A DAG of a bundle without a team draws on
``[hetero_gpu] default_team`` (else ``default``), and may name no other team: otherwise a bundle
without a team would be a way around every team's quota.

The name found here is the task's Airflow team; the teams file's ``airflow_teams`` mapping
translates it to the fleet team whose quota it counts against
(:meth:`~airflow_hetero_gpu.core.admission.teams.Teams.fleet_team`).
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

#: where a task's environment carries its DAG run's team (Airflow's env format, then its default)
TEAM_ENV = ("AIRFLOW_CTX_TEAM_NAME", "AIRFLOW_CONTEXT_TEAM_NAME")


def multi_team() -> bool:
    """Whether Airflow runs in multi-team mode (``[core] multi_team``)."""
    from airflow.providers.common.compat.sdk import conf

    return conf.getboolean("core", "multi_team", fallback=False)


def run_team(context: Any) -> str | None:
    """The team of the task's DAG run (its bundle's), or None (a bundle without a team)."""
    dag_run = context.get("dag_run") if hasattr(context, "get") else None
    name = getattr(dag_run, "team_name", None)
    if isinstance(name, str) and name:
        return name
    for var in TEAM_ENV:
        if os.environ.get(var):
            return os.environ[var]
    return None


def default_team() -> tuple[str, bool]:
    """``([hetero_gpu] default_team, True)``, else ``("default", False)``."""
    from airflow_hetero_gpu.core.admission.teams import DEFAULT_TEAM
    from airflow_hetero_gpu.settings import setting

    value = setting("default_team")
    return (value, True) if value else (DEFAULT_TEAM, False)


def resolve_team(op_team: Any, context: Any) -> tuple[str, bool]:
    """``(the task's Airflow team, whether it was named)``: named means given by the task, the
    deployment setting or the DAG bundle, not the built-in ``default``. In multi-team mode a
    ``team`` other than the bundle's is an :class:`AirflowFailException` (one line, both names)."""
    named = op_team if op_team not in (None, "") else None
    if not multi_team():
        return (named, True) if named is not None else default_team()
    bundle = run_team(context)
    if bundle is not None:
        if named is not None and named != bundle:
            raise AirflowFailException(
                f"team: this DAG's bundle belongs to team {bundle!r}, and team={named!r} names another team; "
                f"in Airflow's multi-team mode a task draws on its bundle's team: leave team out")
        return bundle, True
    fallback = default_team()
    if named is not None and named != fallback[0]:
        raise AirflowFailException(
            f"team: this DAG's bundle belongs to no team, so its tasks draw on [hetero_gpu] default_team "
            f"{fallback[0]!r}, and team={named!r} names another team; in Airflow's multi-team mode a task "
            f"draws on its bundle's team: leave team out, or give the bundle a team_name")
    return fallback
