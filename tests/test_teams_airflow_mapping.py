"""The teams file's ``airflow_teams`` (docs/teams.md#with-airflows-multi-team-mode): which Airflow
teams draw on a fleet team's quota. Strict parsing (one line naming the file, team, key and value),
an Airflow team mapped to two fleet teams refused, the mapping kept in the ledger (SQLite and
PostgreSQL), the translation, and ``hetero-gpu teams`` showing it."""

from __future__ import annotations

import json

import pytest
import yaml

from airflow_hetero_gpu.cli.app import main
from airflow_hetero_gpu.core.admission import TeamsError, teams_from_mapping
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)
from test_ledger_queue import fill

MAPPED = """\
teams:
  research: {quota: {"*": 4}, airflow_teams: [research_cv, research_nlp]}
  prod:     {quota: {"*": 4}}
"""


def _parse(text: str):
    return teams_from_mapping(yaml.safe_load(text), "teams.yaml")


@pytest.mark.parametrize("airflow_team, fleet", [
    ("research_cv", "research"), ("research_nlp", "research"),
    ("prod", "prod"),  # no airflow_teams: the Airflow team of its own name
    ("research", "research"),  # a name no team maps is itself (as outside multi-team mode)
    ("intern", "intern"),
])
def test_an_airflow_team_draws_on_its_fleet_teams_quota(airflow_team, fleet):
    assert _parse(MAPPED).fleet_team(airflow_team) == fleet


def test_the_mapping_defaults_to_the_teams_own_name_and_round_trips():
    teams = _parse(MAPPED)
    assert teams.mapping() == {"prod": ["prod"], "research": ["research_cv", "research_nlp"]}
    assert teams.to_json()["teams"]["research"]["airflow_teams"] == ["research_cv", "research_nlp"]
    assert "airflow_teams" not in teams.to_json()["teams"]["prod"]  # the default is not written out
    assert teams_from_mapping(teams.to_json()).to_json() == teams.to_json()


@pytest.mark.parametrize("spec, message", [
    ("airflow_teams: research_cv",
     "teams.yaml: team research: airflow_teams: expected a non-empty list of Airflow team names, got 'research_cv'"),
    ("airflow_teams: []", "teams.yaml: team research: airflow_teams: expected a non-empty list of Airflow team "
                          "names, got []"),
    ("airflow_teams: {a: 1}", "teams.yaml: team research: airflow_teams: expected a non-empty list"),
    ("airflow_teams: [cv]", "teams.yaml: team research: airflow_teams: invalid Airflow team 'cv': use 3-50 "
                            "letters, digits, '_' or '-' (the names `airflow teams create` accepts)"),
    ("airflow_teams: [research.cv]", "invalid Airflow team 'research.cv'"),
    ("airflow_teams: [\"a\\nb\"]", "invalid Airflow team 'a\\nb'"),
    ("airflow_teams: [12345]", "invalid Airflow team 12345"),
    ("airflow_teams: [" + "x" * 51 + "]", "invalid Airflow team 'xxxxxxxxxx"),
    ("airflow_teams: [research_cv, research_cv]",
     "teams.yaml: team research: airflow_teams: Airflow team 'research_cv' given twice"),
])
def test_a_bad_airflow_teams_value_is_one_line_naming_file_team_key_and_value(spec, message):
    with pytest.raises(TeamsError) as err:
        _parse(f"teams:\n  research: {{quota: {{'*': 4}}, {spec}}}\n")
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text, message", [
    # listed by two teams
    ("teams:\n  research: {airflow_teams: [shared_cv]}\n  vision: {airflow_teams: [shared_cv]}\n",
     "teams.yaml: team vision: airflow_teams: Airflow team 'shared_cv' is also mapped to team research "
     "(its airflow_teams); an Airflow team draws on one team's quota"),
    # listed by one, and the other team's own name (its default mapping): the listing team is named
    ("teams:\n  prod: {quota: {'*': 4}}\n  research: {airflow_teams: [prod]}\n",
     "teams.yaml: team research: airflow_teams: Airflow team 'prod' is also mapped to team prod (its own name)"),
    ("teams:\n  research: {airflow_teams: [prod]}\n  prod: {quota: {'*': 4}}\n",
     "teams.yaml: team research: airflow_teams: Airflow team 'prod' is also mapped to team prod (its own name)"),
])
def test_an_airflow_team_mapped_to_two_fleet_teams_is_refused(text, message):
    with pytest.raises(TeamsError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        _parse(text)


def test_a_team_listing_its_own_name_among_others_is_fine():
    teams = _parse("teams:\n  research: {airflow_teams: [research, research_cv]}\n")
    assert teams.fleet_team("research") == teams.fleet_team("research_cv") == "research"


def test_the_ledger_keeps_the_mapping_and_the_cli_shows_it(ledger_db_url, tmp_path, capsys):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:
        fill(led)
    path = tmp_path / "teams.yaml"
    path.write_text(MAPPED)
    assert main(["teams", "apply", str(path), "--ledger", ledger_db_url]) == 0
    with Ledger.from_url(ledger_db_url) as led:
        assert led.teams().mapping() == {"prod": ["prod"], "research": ["research_cv", "research_nlp"]}
        assert led.apply_teams(_parse(MAPPED)) is False  # the same mapping again changes nothing
        # two Airflow teams, one quota: both count against research's 4 GPUs
        for job, team in (("cv", "research"), ("nlp", "research")):
            entry = led.enqueue(job, PlanRequest(2), team=team)
            assert entry.admitted
            led.take_admission(job)
    capsys.readouterr()
    assert main(["teams", "--ledger", ledger_db_url]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[lines.index("") + 1].split() == ["TEAM", "AIRFLOW", "TEAMS"]
    assert [line.split(None, 1) for line in lines[lines.index("") + 3:]] == [
        ["prod", "prod"], ["research", "research_cv, research_nlp"]]
    assert main(["teams", "--ledger", ledger_db_url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["teams"]["research"]["airflow_teams"] == ["research_cv", "research_nlp"]
    assert data["teams"]["prod"]["airflow_teams"] == ["prod"]
    rows = {(r["team"], r["pattern"]): r for r in data["rows"]}
    assert rows[("research", "*")]["in_use"] == 4


def test_without_a_mapping_the_table_is_as_before(ledger_db_url, tmp_path, capsys):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:
        fill(led)
    path = tmp_path / "teams.yaml"
    path.write_text("teams:\n  prod: {quota: {'*': 4}}\n")
    assert main(["teams", "apply", str(path), "--ledger", ledger_db_url]) == 0
    capsys.readouterr()
    assert main(["teams", "--ledger", ledger_db_url]) == 0
    assert "AIRFLOW TEAMS" not in capsys.readouterr().out


def test_a_bad_mapping_changes_nothing_applied(ledger_db_url, tmp_path, capsys):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:
        fill(led)
    path = tmp_path / "teams.yaml"
    path.write_text(MAPPED)
    assert main(["teams", "apply", str(path), "--ledger", ledger_db_url]) == 0
    path.write_text(MAPPED + "  vision: {airflow_teams: [research_cv]}\n")
    capsys.readouterr()
    assert main(["teams", "apply", str(path), "--ledger", ledger_db_url]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"hetero-gpu teams: error: {path}: team vision: airflow_teams: Airflow team 'research_cv' "
                           f"is also mapped to team research (its airflow_teams); an Airflow team draws on one "
                           f"team's quota")
    with Ledger.from_url(ledger_db_url) as led:
        assert sorted(led.teams().teams) == ["prod", "research"]


def test_plan_reserve_translates_an_airflow_team_as_a_task_does(tmp_path, capsys):
    """``plan --reserve --team research_cv`` reserves for research (one line says so); a fleet team
    is taken as it is; a name the file neither names nor maps is refused, nothing reserved."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger.from_url(url) as led:
        fill(led)
        led.apply_teams(_parse(MAPPED))
    argv = ["plan", "--ledger", url, "--gpus", "2", "--reserve", "--job-id", "cv", "--team", "research_cv"]
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err == "hetero-gpu plan: Airflow team 'research_cv' draws on the quota of team 'research'\n", err
    assert main([*argv[:7], "prod", "--team", "prod"]) == 0
    assert capsys.readouterr().err == ""
    assert main([*argv[:7], "rl", "--team", "research_rl"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--team: team 'research_rl' is not in the teams file (its teams: prod, " \
        "research)" in err and "nothing reserved" in err, err
    with Ledger.open_existing(url) as led:
        assert (led.get("cv").team, led.get("prod").team, led.get("rl")) == ("research", "prod", None)
        assert [r["in_use"] for r in led.team_standing()["rows"] if r["team"] == "research"] == [2]
