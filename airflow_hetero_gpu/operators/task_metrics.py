"""A training task's metrics, tagged with its team as Airflow tags its own (docs/operations.md#teams-in-the-metrics).

Every metric the task emits for its job (``resumable_job.*``, ``hetero_gpu.preemptions``) carries:

* ``team_name``: the task's Airflow team, as Airflow's own task metrics carry it
  (``ti.stats_tags["team_name"]``: the DAG run's team in multi-team mode); where the task has
  none (outside multi-team mode, a bundle without a team) the fleet team, so a dashboard can
  always group by ``team_name``;
* ``fleet_team``: the team of the teams file whose quota the job draws on (the Airflow team
  translated by ``airflow_teams``; ``default`` without a teams file), once the task has resolved it.

A metric never stops a job: a backend that fails is ignored.
"""

from __future__ import annotations

from typing import Any, Mapping


def airflow_team(context: Any) -> str | None:
    """The team Airflow tags the task's own metrics with (``ti.stats_tags["team_name"]``), or None."""
    ti = context.get("ti") if hasattr(context, "get") else None
    tags = getattr(ti, "stats_tags", None)
    team = tags.get("team_name") if isinstance(tags, Mapping) else None
    return team if isinstance(team, str) and team else None


def team_tags(context: Any, placement: Any = None) -> dict[str, str]:
    """``{"team_name": ..., "fleet_team": ...}`` of the task (see the module docstring); a part
    that cannot be told (the teams file out of reach, a malformed team) is left out."""
    fleet = None
    if placement is not None:
        try:
            fleet = placement.team
        except Exception:  # noqa: BLE001 - the task fails on it where it reserves; the metric goes on
            fleet = None
    team = airflow_team(context) or fleet
    return {**({"team_name": team} if team else {}), **({"fleet_team": fleet} if fleet else {})}


def incr(name: str, tags: Mapping[str, Any]) -> None:
    """Count ``name`` through Airflow's Stats with ``tags``."""
    try:
        from airflow_hetero_gpu.healthcheck.metrics import Metrics

        Metrics().stats.incr(name, tags=dict(tags))
    except Exception:  # noqa: BLE001 - a metric never stops a job
        pass
