"""Team quotas in the admission pass (docs/teams.md), on the hand-made cluster of
tests/test_admission.py: hgx-a1 and hgx-a2, 8 × A100 each, rtx-1 with 4 × RTX 4090 (20 GPUs)."""

from __future__ import annotations

import pytest

from airflow_hetero_gpu.core.admission import (
    Admission, QueueEntry, QuotaInput, TeamQuota, Teams, TeamsError, teams_from_mapping,
)
from airflow_hetero_gpu.core.admission.quota import QuotaBook, decay, share_value, specificity
from airflow_hetero_gpu.core.model import PlanRequest
from tests.test_admission import A100, RTX, _cluster, _keys, _reserved

FLEET = [A100] * 16 + [RTX] * 4
TEAMS = {"research": {"quota": {"*": 12}}, "prod": {"quota": {"A100*": 8}}}


def _e(job, team, gpus, gpu_type=None, at=0.0, priority=0):
    return QueueEntry(job, PlanRequest(gpus, gpu_type), priority, at, (), team)


def _pass(teams, reserved, queue, history=None, now=100.0):
    t = teams_from_mapping({"teams": teams})
    held = _reserved(reserved)
    team_of = {job: job.split("-")[0] for job in reserved}
    quotas = QuotaInput(t, {j: {"r": "research", "p": "prod", "i": "intern"}[t_] for j, t_ in team_of.items()},
                        history or {})
    return Admission(_cluster()).run(queue, now=now, reserved=held, quotas=quotas)


def _gpus(result, job):
    return sorted(result.get(job).gpus)


RESEARCH_AT_QUOTA = {"r-run1": "hgx-a2:0-7", "r-run2": "rtx-1:0-3"}  # 12 = research's quota


def test_a_job_within_quota_goes_before_an_earlier_job_that_would_borrow():
    result = _pass(TEAMS, RESEARCH_AT_QUOTA, [_e("r-4", "research", 4, "A100*", at=1), _e("p-8", "prod", 8, at=2)])
    p8 = result.get("p-8")
    assert p8.gpus and sorted(p8.gpus) == _keys("hgx-a1:0-7") and p8.team == "prod" and p8.borrowed == 0
    r4 = result.get("r-4")
    assert r4.state == "waiting" and r4.claim is None
    assert "blocked by quota: team research: 12/12 of its quota in use, may borrow without limit" in r4.reason
    assert "borrowable now 0; needs 4" in r4.reason  # prod's quota is all in use


def test_idle_quota_is_lent_and_the_admission_says_how_much_is_borrowed():
    result = _pass(TEAMS, RESEARCH_AT_QUOTA, [_e("r-4", "research", 4, "A100*", at=1)])
    r4 = result.get("r-4")
    assert _gpus(result, "r-4") == _keys("hgx-a1:0-3") and r4.team == "research" and r4.borrowed == 4
    rows = {(r.team, r.pattern): r for r in result.teams}
    assert (rows[("research", "*")].in_use, rows[("research", "*")].borrowed) == (16, 4)
    assert (rows[("prod", "A100*")].quota, rows[("prod", "A100*")].lent) == (8, 4)


def test_lending_limit_caps_what_others_borrow():
    teams = {**TEAMS, "prod": {"quota": {"A100*": 8}, "lending_limit": {"A100*": 2}}}
    result = _pass(teams, RESEARCH_AT_QUOTA, [_e("r-4", "research", 4, at=1), _e("r-2", "research", 2, at=2)])
    assert "borrowable now 2 (prod lends 2 of its idle 8 (lending limit 2))" in result.get("r-4").reason
    assert result.get("r-2").borrowed == 2


def test_borrowing_limit_caps_a_team():
    teams = {**TEAMS, "research": {"quota": {"*": 12}, "borrowing_limit": {"*": 2}}}
    result = _pass(teams, RESEARCH_AT_QUOTA, [_e("r-4", "research", 4, at=1), _e("r-2", "research", 2, at=2),
                                              _e("r-1", "research", 1, at=3)])
    assert "12/12 of its quota in use, may borrow 2" in result.get("r-4").reason
    assert result.get("r-2").borrowed == 2
    assert "may borrow 0" in result.get("r-1").reason  # never above quota + borrowing limit


def test_a_waiting_job_within_quota_keeps_its_quota_from_borrowers():
    reserved = {**RESEARCH_AT_QUOTA, "r-run3": "hgx-a1:0-3"}  # research borrows 4 of prod's quota
    result = _pass(TEAMS, reserved, [_e("p-8", "prod", 8, at=1), _e("r-1", "research", 1, at=2)])
    p8 = result.get("p-8")
    assert p8.state == "head" and sorted(p8.claim.gpus) == _keys("hgx-a1:0-7")
    assert "within its quota" in p8.reason
    r1 = result.get("r-1")
    assert r1.state == "waiting" and "blocked by quota" in r1.reason
    assert "prod lends 0 of its idle 0 (8 kept for its waiting jobs)" in r1.reason


def test_an_in_quota_job_is_not_held_behind_a_borrowing_head():
    # research's borrowing 8-GPU head claimed hgx-a1 last pass; prod's job within quota starts there anyway
    reserved = {**RESEARCH_AT_QUOTA, "r-run3": "hgx-a1:0"}
    queue = [QueueEntry("r-8", PlanRequest(8, "A100*"), 0, 1.0, tuple(_keys("hgx-a1:0-7")), "research"),
             _e("p-4", "prod", 4, at=2)]
    result = _pass(TEAMS, reserved, queue)
    assert result.get("p-4").gpus and result.get("p-4").borrowed == 0
    assert result.get("r-8").state == "waiting" and "blocked by quota" in result.get("r-8").reason


@pytest.mark.parametrize("history, first", [({}, "r-8"), ({"research": 3600.0 * 24 * 10}, "i-8")])
def test_among_borrowers_the_lowest_fair_share_goes_first(history, first):
    teams = {"research": {"quota": {"*": 8}}, "intern": {"quota": {"*": 4}}, "prod": {"quota": {"A100*": 8}}}
    reserved = {"r-run": "hgx-a2:0-7", "i-run": "rtx-1:0-3"}
    result = _pass(teams, reserved, [_e("r-8", "research", 8, at=1), _e("i-8", "intern", 8, at=2)], history)
    assert result.get(first).gpus and result.get(first).borrowed == 8
    other = ({"r-8", "i-8"} - {first}).pop()
    assert result.get(other).state == "waiting" and "blocked by quota" in result.get(other).reason


def test_no_teams_configured_is_the_pass_without_quotas():
    queue = [QueueEntry("big", PlanRequest(8), 0, 1.0), QueueEntry("small", PlanRequest(1), 0, 2.0)]
    held = _reserved({"j1": "hgx-a1:0-6", "j2": "hgx-a2:0-7"})
    plain = Admission(_cluster()).run(queue, now=10.0, reserved=held).to_json()
    empty = Admission(_cluster()).run(queue, now=10.0, reserved=held, quotas=QuotaInput(Teams({}))).to_json()
    assert plain == empty and "teams" not in plain


def test_several_patterns_of_a_team_fill_the_most_specific_first():
    assert sorted(["*", "A100*", "NVIDIA A100-SXM4-80GB", "A*"], key=specificity) == [
        "NVIDIA A100-SXM4-80GB", "A100*", "A*", "*"]
    t = teams_from_mapping({"teams": {"prod": {"quota": {"A100*": 8, "*": 2}}}})
    book = QuotaBook(t, {A100: 16, RTX: 4}, {("prod", A100): 9})
    assert book.room("prod", A100) == 1 and book.room("prod", RTX) == 1 and book.borrowed("prod") == 0
    book.take("prod", RTX, 2)
    assert book.borrowed("prod") == 1  # the "*" bucket is full: the second RTX GPU is borrowed


def test_fair_share_decays_by_its_half_life():
    assert decay(100.0, 3600.0, 3600.0) == pytest.approx(50.0)
    assert share_value(2, 0.0, 2.0, 3600.0) == 1.0
    assert share_value(0, 3600.0, 1.0, 3600.0) == pytest.approx(0.6931, abs=1e-4)


@pytest.mark.parametrize("data, message", [
    ({"teams": {"prod": {"quota": {"A100*": 8}, "gpus": 3}}}, "team prod: unknown key 'gpus'"),
    ({"teams": {"prod": {"quota": {"A100*": -1}}}}, "team prod: quota: 'A100*': expected a number >= 0, got -1"),
    ({"teams": {"prod": {"quota": {"A100*": 8}, "weight": -2}}}, "team prod: weight: expected a number > 0"),
    ({"teams": {"prod": {"quota": {"A100*": 8}, "lending_limit": {"H100*": 1}}}},
     "team prod: lending_limit: pattern 'H100*' is not a pattern of its quota"),
    ({"team": {}}, "unknown key 'team'"),
    ({"teams": {"prod": {"quota": {"A100*": 8}}}, "usage_half_life": "soon"}, "usage_half_life"),
])
def test_bad_teams_mappings_are_one_line_naming_team_and_key(data, message):
    with pytest.raises(TeamsError, match=None) as err:
        teams_from_mapping(data, "teams.yaml")
    assert message in str(err.value) and "\n" not in str(err.value) and str(err.value).startswith("teams.yaml: ")


def test_a_pattern_matching_no_card_of_the_fleet():
    t = teams_from_mapping({"teams": {"prod": {"quota": {"H100*": 8}}}})
    with pytest.raises(TeamsError) as err:
        t.check_fleet(FLEET, "teams.yaml")
    assert "teams.yaml: team prod: quota: pattern 'H100*' matches no card of the fleet" in str(err.value)
    teams_from_mapping({"teams": TEAMS}).check_fleet(FLEET)


DOC_TEAMS = {"research": {"quota": {"*": 8}, "weight": 2},
             "prod": {"quota": {"A100*": 8}, "lending_limit": {"A100*": 4}},
             "intern": {"quota": {"*": 4}, "borrowing_limit": {"*": 4}}}
DOC_QUEUE = [_e("i-2", "intern", 2, at=0), _e("r-4", "research", 4, at=60), _e("p-4", "prod", 4, "A100*", at=120),
             _e("i-4", "intern", 4, at=180)]


@pytest.mark.parametrize("history, admitted, blocked", [
    ({}, {"p-4": ("hgx-a1:0-3", 0), "i-2": ("hgx-a1:4-5", 2)}, {"r-4": "borrowable now 2", "i-4": "may borrow 2"}),
    ({"intern": 345_600.0}, {"p-4": ("hgx-a1:0-3", 0), "r-4": ("hgx-a1:4-7", 4)},
     {"i-2": "borrowable now 0", "i-4": "borrowable now 0"}),
])
def test_the_worked_example_of_docs_teams_md(history, admitted, blocked):
    result = _pass(DOC_TEAMS, {"r-run": "hgx-a2:0-7", "i-run": "rtx-1:0-3"}, DOC_QUEUE, history, now=900.0)
    assert {a.job_id: (sorted(a.gpus), a.borrowed) for a in result.admitted} == {
        job: (_keys(where), n) for job, (where, n) in admitted.items()}
    for job, text in blocked.items():
        w = result.get(job)
        assert w.state == "waiting" and "blocked by quota" in w.reason and text in w.reason
    if not history:
        assert result.get("r-4").reason == (
            "head of the queue, blocked by quota: team research: 8/8 of its quota in use, may borrow without limit; "
            "borrowable now 2 (prod lends 2 of its idle 4 (2 already lent, lending limit 4)); needs 4")


@pytest.mark.parametrize("odd", [
    {"quota": {"*": 10 ** 20}},
    {"quota": {"*": 2}, "weight": 1e-320},
    {"quota": {"*": 10 ** 20}, "borrowing_limit": {"*": 10 ** 20}, "lending_limit": {"*": 10 ** 20}},
], ids=["quota-1e20", "weight-1e-320", "limits-1e20"])
@pytest.mark.parametrize("half_life", [24 * 3600.0, 1.7e308])
def test_one_teams_absurd_numbers_never_fail_the_pass_for_the_others(odd, half_life):
    """Numbers fed straight to the pass (the teams file bounds them; the pass must not rely on it):
    the odd team's job and the other teams' jobs are still decided, and prod's starts."""
    teams = Teams({name: TeamQuota(name, spec["quota"], spec.get("borrowing_limit", {}), spec.get("lending_limit", {}),
                                   spec.get("weight", 1.0))
                   for name, spec in {"odd": odd, "prod": {"quota": {"A100*": 8}}}.items()}, half_life)
    quotas = QuotaInput(teams, {"r-run1": "odd"}, {"odd": 1e300, "prod": 5.0})
    held = _reserved({"r-run1": "hgx-a2:0-3"})
    queue = [_e("o-2", "odd", 2, "RTX*", at=1), _e("p-8", "prod", 8, "A100*", at=2), _e("o-16", "odd", 16, at=3)]
    result = Admission(_cluster()).run(queue, now=100.0, reserved=held, quotas=quotas)
    assert sorted(result.get("p-8").gpus) == _keys("hgx-a1:0-7")
    assert result.get("o-2").gpus  # RTX GPUs are free: the odd team's own job starts too
    assert result.get("o-16").state in ("waiting", "impossible", "head")
    assert {r.team for r in result.teams} >= {"odd", "prod"}
