"""The max_jobs rule (core/admission/rules/max_jobs.py; docs/teams.md), as a table, and through the
pass on the hand-made cluster of tests/test_admission.py (hgx-a1, hgx-a2: 8 × A100; rtx-1: 4 × RTX 4090)."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_hetero_gpu.core.admission import Admission, QueueEntry, QuotaInput, TeamsError, teams_from_mapping
from airflow_hetero_gpu.core.admission.model import ReasonKind
from airflow_hetero_gpu.core.admission.records import Item
from airflow_hetero_gpu.core.admission.rules.max_jobs import MaxJobsRule, max_jobs_rule
from airflow_hetero_gpu.core.model import PlanRequest
from tests.test_admission import _cluster, _reserved


class _Shape:
    ok = np.array([True, True])


@pytest.mark.parametrize("caps, running, team, refusal", [
    ({"intern": 4}, {"a": "intern", "b": "intern", "c": "intern"}, "intern", None),  # 3 of 4
    ({"intern": 4}, {f"j{i}": "intern" for i in range(4)}, "intern", "team intern runs its 4 of max_jobs 4"),
    ({"intern": 1}, {"a": "intern", "b": "prod"}, "intern", "team intern runs its 1 of max_jobs 1"),
    ({"intern": 1}, {"a": "intern"}, "prod", None),  # no cap of its own
    ({"intern": 2}, {}, "intern", None),
    ({"intern": 2}, {"a": "prod", "b": "prod"}, "intern", None),  # other teams' jobs do not count
])
def test_the_rule_as_a_table(caps, running, team, refusal):
    rule = MaxJobsRule(caps, running)
    said = rule.verdict(None, Item(1, QueueEntry("x", PlanRequest(1), team=team), team), _Shape())
    if refusal is None:
        assert said is None
    else:
        assert said.refusal.kind is ReasonKind.MAX_JOBS and said.refusal.text == refusal
        assert not said.pools.any() and not said.defer


def test_a_start_counts_and_teams_without_a_cap_have_no_rule():
    rule = MaxJobsRule({"intern": 2}, {"a": "intern"})
    item = Item(1, QueueEntry("x", PlanRequest(1), team="intern"), "intern")
    assert rule.verdict(None, item, _Shape()) is None
    rule.started(None, item, None, 0)
    assert rule.verdict(None, item, _Shape()).refusal.text == "team intern runs its 2 of max_jobs 2"
    assert max_jobs_rule(teams_from_mapping({"teams": {"a": {"quota": {"*": 1}}}}), {}) is None


def _pass(teams, reserved, queue):
    t = teams_from_mapping({"teams": teams})
    quotas = QuotaInput(t, {job: job.split("-")[0] for job in reserved})
    return Admission(_cluster()).run(queue, now=100.0, reserved=_reserved(reserved), quotas=quotas)


def test_in_the_pass_the_fifth_job_waits_with_the_rules_reason_and_claims_nothing():
    teams = {"intern": {"quota": {"*": 8}, "max_jobs": 4}, "prod": {"quota": {"A100*": 8}}}
    running = {f"intern-{i}": f"hgx-a1:{i}" for i in range(3)}
    queue = [QueueEntry(f"n{i}", PlanRequest(1), 0, float(i), (), "intern") for i in range(3)]
    queue.append(QueueEntry("p", PlanRequest(1), 0, 9.0, (), "prod"))
    result = _pass(teams, running, queue)
    assert [a.job_id for a in result.admitted] == ["n0", "p"]  # the 4th intern job starts, then prod's
    for job, position in (("n1", 1), ("n2", 2)):
        w = result.get(job)
        assert w.state == "waiting" and w.claim is None and w.kind is ReasonKind.MAX_JOBS
        lead = "head of the queue" if position == 1 else "2nd in the queue"
        assert w.reason == f"{lead}, waits: team intern runs its 4 of max_jobs 4"
    rows = result.to_json()["waiting"]
    assert {r["kind"] for r in rows} == {"max_jobs"}


@pytest.mark.parametrize("value", [0, -1, 100_001, 2.5, "4", True])
def test_max_jobs_must_be_a_whole_number_from_1_to_100000(value):
    with pytest.raises(TeamsError, match=r"^teams: team intern: max_jobs: expected a whole number from 1 to 100000, got"):
        teams_from_mapping({"teams": {"intern": {"quota": {"*": 1}, "max_jobs": value}}})
    assert teams_from_mapping({"teams": {"intern": {"max_jobs": 100_000}}}).teams["intern"].to_json()["max_jobs"] == 100_000
