"""The teams file's ``airflow_teams`` against Airflow's own teams (``hetero-gpu teams apply``).

In Airflow's multi-team mode every Airflow team a fleet team lists must exist in Airflow's
metadata database (``airflow teams create``): a mapping to a team that does not exist is refused
in one line when the database answers, and a warning when it does not (an admin may apply the
file from a machine without it). Outside multi-team mode Airflow has no teams to check against:
the mapping translates the names the tasks' ``team`` argument gives.
"""

from __future__ import annotations

from airflow_hetero_gpu.core.admission.teams import Teams, TeamsError


def airflow_team_names() -> set[str] | None:
    """Airflow's teams, read from its metadata database; None outside multi-team mode. An
    unreachable database is a RuntimeError saying why."""
    try:
        from airflow.configuration import conf

        if not conf.getboolean("core", "multi_team", fallback=False):
            return None
        from airflow.models.team import Team

        return set(Team.get_all_team_names())
    except Exception as err:  # noqa: BLE001  (no database, no table, a driver missing: all say "unreachable")
        raise RuntimeError(" ".join(f"{type(err).__name__}: {err}".split())[:300]) from None


def check_airflow_teams(teams: Teams, source: str, warn) -> None:
    """Refuse (TeamsError) a listed Airflow team that Airflow does not have; ``warn(line)`` when
    Airflow's database cannot be read. Only explicit ``airflow_teams`` are checked (a fleet team
    need not be an Airflow team)."""
    listed = [(name, t) for name, team in sorted(teams.teams.items()) for t in team.airflow_teams]
    if not listed:
        return
    try:
        known = airflow_team_names()
    except RuntimeError as err:
        warn(f"{source}: the Airflow teams of airflow_teams were not checked: Airflow's metadata database "
             f"could not be read ({err})")
        return
    if known is None:
        return
    for name, airflow_team in listed:
        if airflow_team not in known:
            have = ", ".join(sorted(known)) or "none"
            raise TeamsError(f"{source}: team {name}: airflow_teams: Airflow team {airflow_team!r} does not exist "
                             f"(Airflow's teams: {have}; `airflow teams create {airflow_team}`)")
