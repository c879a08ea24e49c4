"""The task's team in and out of Airflow's multi-team mode (operators/team.py, docs/teams.md): the
DAG run's team (its bundle's) in multi-team mode, a ``team`` naming another one refused in one
line before anything is queued or reserved, a bundle without a team on ``[hetero_gpu]
default_team``; the teams file's ``airflow_teams`` translating the Airflow team to the fleet team
whose quota the job is charged (real SQLite ledger)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml
from airflow.sdk.exceptions import AirflowFailException

from airflow_hetero_gpu.core.admission import teams_from_mapping
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.decorators.hetero_train import HeteroTrainDecoratedOperator
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator
from airflow_hetero_gpu.operators.placement import Placement
from airflow_hetero_gpu.operators.queue_wait import QueueWait
from airflow_hetero_gpu.operators.team import resolve_team, run_team
from test_ledger_queue import fill

A_VS_B = ("team: this DAG's bundle belongs to team 'team_a', and team='team_b' names another team; in Airflow's "
          "multi-team mode a task draws on its bundle's team: leave team out")
NO_TEAM_VS_B = ("team: this DAG's bundle belongs to no team, so its tasks draw on [hetero_gpu] default_team "
                "'shared', and team='team_b' names another team; in Airflow's multi-team mode a task draws on "
                "its bundle's team: leave team out, or give the bundle a team_name")
NO_TEAM_VS_B_DEFAULT = NO_TEAM_VS_B.replace("'shared'", "'default'")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ("AIRFLOW__CORE__MULTI_TEAM", "AIRFLOW__HETERO_GPU__DEFAULT_TEAM", "AIRFLOW_CTX_TEAM_NAME",
                "AIRFLOW_CONTEXT_TEAM_NAME"):
        monkeypatch.delenv(var, raising=False)


def _context(team: str | None) -> dict:
    return {"dag_run": SimpleNamespace(run_id="r", team_name=team)}


@pytest.mark.parametrize("multi, run, setting, argument, expected", [
    # outside multi-team mode: nothing changes (the argument, else the setting, whose default is `default`);
    # the run's team is ignored
    (False, None, None, None, ("default", True)),
    (False, None, "shared", None, ("shared", True)),
    (False, None, "shared", "team_b", ("team_b", True)),
    (False, "team_a", None, "team_b", ("team_b", True)),
    (False, "team_a", None, "", ("default", True)),
    # multi-team mode: the bundle's team; team= may name it again
    (True, "team_a", None, None, ("team_a", True)),
    (True, "team_a", "shared", None, ("team_a", True)),
    (True, "team_a", None, "", ("team_a", True)),
    (True, "team_a", None, "team_a", ("team_a", True)),
    (True, "team_a", None, "team_b", A_VS_B),
    (True, "team_a", "team_b", "team_b", A_VS_B),
    # a bundle without a team: [hetero_gpu] default_team (else default), and no other
    (True, None, "shared", None, ("shared", True)),
    (True, None, None, None, ("default", True)),
    (True, None, "shared", "shared", ("shared", True)),
    (True, None, "shared", "team_b", NO_TEAM_VS_B),
    (True, None, None, "team_b", NO_TEAM_VS_B_DEFAULT),
])
def test_resolve_team(monkeypatch, multi, run, setting, argument, expected):
    if multi:
        monkeypatch.setenv("AIRFLOW__CORE__MULTI_TEAM", "True")
    if setting:
        monkeypatch.setenv("AIRFLOW__HETERO_GPU__DEFAULT_TEAM", setting)
    if isinstance(expected, str):
        with pytest.raises(AirflowFailException) as err:
            resolve_team(argument, _context(run))
        assert str(err.value) == expected
    else:
        assert resolve_team(argument, _context(run)) == expected


@pytest.mark.parametrize("context, env, expected", [
    (_context("team_a"), {}, "team_a"),
    (_context("team_a"), {"AIRFLOW_CTX_TEAM_NAME": "team_b"}, "team_a"),  # the run's own first
    ({"dag_run": SimpleNamespace(run_id="r")}, {"AIRFLOW_CTX_TEAM_NAME": "team_b"}, "team_b"),  # an older SDK's run
    ({}, {"AIRFLOW_CONTEXT_TEAM_NAME": "team_c"}, "team_c"),
    (_context(None), {}, None),
    ({}, {}, None),
])
def test_the_run_team_comes_from_the_dag_run_else_the_tasks_environment(monkeypatch, context, env, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert run_team(context) == expected


@pytest.fixture
def url(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger.from_url(url) as led:
        fill(led)  # node01, node02: 8 × A100 each
        led.apply_teams(teams_from_mapping(yaml.safe_load(
            "teams:\n  research: {quota: {'*': 4}, airflow_teams: [research_cv, research_nlp]}\n"
            "  team_a: {quota: {'*': 4}}\n")))
        assert led.enqueue("hold", PlanRequest(12), lease_seconds=3600, team="team_a").admitted
        led.take_admission("hold")
    return url


def _op(url, cls=HeteroTrainOperator, **kwargs):
    args = dict(task_id="t", gpu_count=2, ssh_conn_ids=["node01", "node02"], ledger_url=url, wait_for_capacity=True,
                **kwargs)
    if cls is HeteroTrainOperator:
        return cls(script="train.py", **args)
    return cls(python_callable=lambda: None, **args)


@pytest.mark.parametrize("cls", [HeteroTrainOperator, HeteroTrainDecoratedOperator])
def test_a_team_naming_another_fails_before_anything_is_queued_or_reserved(url, monkeypatch, cls):
    monkeypatch.setenv("AIRFLOW__CORE__MULTI_TEAM", "True")
    op = _op(url, cls, team="team_b")
    with pytest.raises(AirflowFailException) as err:
        QueueWait(Placement(op.specs, op.runtime, {**_context("team_a"), "ti": None}, "j")).place()
    assert str(err.value) == A_VS_B
    with Ledger.open_existing(url) as led:
        assert [e.job_id for e in led.queue()] == [] and led.get("j") is None


@pytest.mark.parametrize("run, expected", [("research_cv", "research"), ("research_nlp", "research"),
                                           ("team_a", "team_a")])
def test_the_airflow_team_is_charged_to_its_fleet_team(url, monkeypatch, run, expected):
    monkeypatch.setenv("AIRFLOW__CORE__MULTI_TEAM", "True")
    op = _op(url)
    placement = Placement(op.specs, op.runtime, {**_context(run), "ti": None}, "j")
    assert (placement.airflow_team, placement.team) == (run, expected)
    entry = op.ledger.enqueue("j", PlanRequest(2), team=placement.team)  # as QueueWait.enqueue passes it
    assert entry.team == expected


def test_two_airflow_teams_draw_on_one_quota(url, monkeypatch):
    """research_cv takes 2 of research's 4; research_nlp the other 2; a third job of either waits
    on research's quota (the 4 GPUs left free belong to team_a's quota, which it uses)."""
    monkeypatch.setenv("AIRFLOW__CORE__MULTI_TEAM", "True")
    states = []
    for job, run in (("cv", "research_cv"), ("nlp", "research_nlp"), ("cv2", "research_cv")):
        op = _op(url)
        team = Placement(op.specs, op.runtime, {**_context(run), "ti": None}, job).team
        entry = op.ledger.enqueue(job, PlanRequest(2), team=team)
        states.append((team, entry.state))
        if entry.admitted:
            op.ledger.take_admission(job)
    assert states[:2] == [("research", "admitted"), ("research", "admitted")]
    assert states[2][0] == "research" and states[2][1] == "waiting"
    with Ledger.open_existing(url) as led:
        assert "team research: 4/4 of its quota in use" in led.queue_entry("cv2").reason
