"""The operator's team (docs/teams.md) against a real SQLite ledger: the argument, else the
deployment setting `[hetero_gpu] default_team`, else `default`; templated (and on
`@task.hetero_train`); a malformed name fails the task before anything is enqueued; the entry it
enqueues carries the team."""

from __future__ import annotations

import re

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.decorators.hetero_train import HeteroTrainDecoratedOperator
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator
from airflow_hetero_gpu.operators.placement import Placement
from airflow_hetero_gpu.operators.queue_wait import QueueWait
from test_ledger_queue import fill


@pytest.fixture
def url(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger.from_url(url) as led:
        fill(led)
        assert led.enqueue("hold", PlanRequest(16), lease_seconds=3600).admitted
        led.take_admission("hold")
    return url


def _op(url, **kwargs) -> HeteroTrainOperator:
    return HeteroTrainOperator(task_id="t", gpu_count=2, script="train.py", ssh_conn_ids=["node01", "node02"],
                               ledger_url=url, wait_for_capacity=True, **kwargs)


@pytest.mark.parametrize("argument, setting, expected", [
    ("prod", "research", "prod"), (None, "research", "research"), (None, None, "default"), ("", None, "default"),
])
def test_the_team_is_the_argument_else_the_setting_else_default(url, monkeypatch, argument, setting, expected):
    if setting is not None:
        monkeypatch.setenv("AIRFLOW__HETERO_GPU__DEFAULT_TEAM", setting)
    else:
        monkeypatch.delenv("AIRFLOW__HETERO_GPU__DEFAULT_TEAM", raising=False)
    op = _op(url, team=argument)
    placement = Placement(op.specs, op.runtime, {}, "j")
    entry = op.ledger.enqueue("j", PlanRequest(2), team=placement.team)  # as QueueWait.enqueue passes it
    assert entry.team == expected and entry.state == "waiting"
    op.ledger.leave_queue("j")


@pytest.mark.parametrize("team", ["research team", "a\n", "<script>", "t" * 65])
def test_a_malformed_team_fails_before_anything_is_enqueued(url, team):
    op = _op(url, team=team)
    with pytest.raises(AirflowFailException, match=r"team: expected a team name .* got " + re.escape(repr(team))):
        QueueWait(Placement(op.specs, op.runtime, {"ti": None}, "j")).enqueue()
    with Ledger.open_existing(url) as led:
        assert [e.job_id for e in led.queue()] == []


def test_team_is_templated_on_the_operator_and_the_decorator():
    assert "team" in HeteroTrainOperator.template_fields
    assert "team" in HeteroTrainDecoratedOperator.template_fields


def test_a_team_the_teams_file_does_not_name_runs_with_one_warning(url, monkeypatch):
    """A typo'd team (team="visoin") still runs, on quota 0, borrowing only; the task log says so
    once, naming the teams the file has and the closest one."""
    from airflow_hetero_gpu.core.admission import teams_from_mapping

    with Ledger.open_existing(url) as led:
        led.apply_teams(teams_from_mapping({"teams": {"vision": {"quota": {"*": 8}}, "prod": {"quota": {"*": 8}}}}))
    op = _op(url, team="visoin")
    warned = []
    log = type("Log", (), {"warning": lambda self, *a: warned.append(a[0] % a[1:])})()
    monkeypatch.setattr(Placement, "log", property(lambda self: log))
    placement = Placement(op.specs, op.runtime, {}, "j")
    assert placement.team == "visoin" and placement.team == "visoin"
    assert warned == ["job j: team 'visoin' is not in the teams file (its teams: prod, vision); did you mean "
                      "'vision'? A team the file does not name has quota 0: its jobs only borrow"]
    op = _op(url, team="vision")
    assert Placement(op.specs, op.runtime, {}, "j").unknown_team("vision") is None
