"""Preemption as a rule of the admission pass (core/admission/preemption.py) on a hand-made cluster.

Cluster (as tests/test_admission.py): hgx-a1 and hgx-a2, 8 × A100 each (NV12); rtx-1, 4 × RTX 4090.
"""

from __future__ import annotations

import numpy as np
import pytest

from airflow_hetero_gpu.core.admission import Admission, PreemptionRules, QueueEntry, RunningJob
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.errors import RequestError
from tests.test_admission import _cluster, _keys

RULES = PreemptionRules(min_runtime_s=600, delay_s=60)
NOW = 10_000.0


def _run(spec: str, job: str, priority=0, started=0.0, checkpoint=None, preemptible=True, preempting=None,
         borrowed=False, team=None):
    keys = [k for part in spec.split(" ") for k in _keys(part)]
    return RunningJob(job, tuple(keys), priority, started, checkpoint, team, preemptible, borrowed, preempting)


def _pass(queue, running, rules=RULES, now=NOW):
    reserved = {k: j.job_id for j in running for k in j.gpus}
    return Admission(_cluster()).run(queue, now=now, reserved=reserved, running=running, preemption=rules)


def _hi(gpus=8, priority=5, at=NOW - 120):
    return QueueEntry("hi", PlanRequest(gpus, "A100*"), priority, at)


def test_the_victim_is_the_job_losing_least_work_and_the_preemptor_claims_its_gpus():
    running = [_run("hgx-a1:0-7", "lo-a", 1, started=0, checkpoint=NOW - 100),    # loses 800 GPU-s
               _run("hgx-a2:0-7", "lo-b", 1, started=0, checkpoint=NOW - 30)]     # loses 240 GPU-s
    result = _pass([_hi()], running)
    assert [p.victims for p in result.preemptions] == [("lo-b",)]
    pre = result.preemptions[0]
    assert pre.lost_gpu_s == {"lo-b": 240.0} and pre.reasons == {"lo-b": "priority 5 > 1"}
    head = result.get("hi")
    assert head.state == "head" and set(head.claim.gpus) == set(_keys("hgx-a2:0-7"))
    assert "preempting lo-b for it" in head.reason


def test_whole_jobs_only_and_the_smallest_set_on_the_host_plan_chooses():
    # four 2-GPU jobs on hgx-a1 and one 8-GPU job on hgx-a2; the 8-GPU preemptor needs a whole host:
    # the four small ones lose least each, but together 4 jobs; releasing in order of lost work
    # reaches 8 on hgx-a1 only after all four: the set is exactly them, never a part of hgx-a2's job
    running = [_run(f"hgx-a1:{2 * i}-{2 * i + 1}", f"s{i}", 0, checkpoint=NOW - 10 * (i + 1)) for i in range(4)]
    running.append(_run("hgx-a2:0-7", "big", 0, checkpoint=NOW - 500))
    pre = _pass([_hi()], running).preemptions[0]
    assert sorted(pre.victims) == ["s0", "s1", "s2", "s3"]
    assert set(pre.gpus) == set(_keys("hgx-a1:0-7"))


def test_a_four_gpu_preemptor_stops_only_what_it_needs():
    running = [_run(f"hgx-a1:{2 * i}-{2 * i + 1}", f"s{i}", 0, checkpoint=NOW - 10 * (i + 1)) for i in range(4)]
    running.append(_run("hgx-a2:0-7", "big", 0, checkpoint=NOW - 50))  # loses 400 GPU-s
    pre = _pass([_hi(gpus=4)], running).preemptions[0]
    assert sorted(pre.victims) == ["s0", "s1"] and pre.lost_gpu_s == {"s0": 20.0, "s1": 40.0}
    # the 8-GPU job losing least of all (40 GPU-s) goes alone rather than two small ones (60)
    running[-1] = _run("hgx-a2:0-7", "big", 0, checkpoint=NOW - 5)
    assert _pass([_hi(gpus=4)], running).preemptions[0].victims == ("big",)


# each row: why nothing is preempted, and the same pass with only that cause removed (which must
# preempt: the row's reason is what stops it, not something else)
NO_PREEMPTION = [
    ("equal priority",
     lambda fix: [_run("hgx-a1:0-7", "a", 1 if fix else 5), _run("hgx-a2:0-7", "b", 5)], lambda fix: _hi()),
    ("ran less than min_runtime",
     lambda fix: [_run("hgx-a1:0-7", "a", 1, started=NOW - (600 if fix else 599)),
                  _run("hgx-a2:0-7", "b", 1, started=NOW - 10)], lambda fix: _hi()),
    ("preemptible=False",
     lambda fix: [_run("hgx-a1:0-7", "a", 1, preemptible=fix), _run("hgx-a2:0-7", "b", 1, preemptible=False)],
     lambda fix: _hi()),
    ("waited less than the delay",
     lambda fix: [_run("hgx-a1:0-7", "a", 1), _run("hgx-a2:0-7", "b", 1)], lambda fix: _hi(at=NOW - (60 if fix else 59))),
    ("would not fit afterwards: 16 GPUs but one victim is not preemptible",
     lambda fix: [_run("hgx-a1:0-7", "a", 1), _run("hgx-a2:0-7", "b", 1, preemptible=fix)], lambda fix: _hi(gpus=16)),
    ("already being stopped for another job",
     lambda fix: [_run("hgx-a1:0-7", "a", 1, preempting=None if fix else "x"),
                  _run("hgx-a2:0-7", "b", 1, preempting="x")], lambda fix: _hi()),
]


@pytest.mark.parametrize("why, running, entry", NO_PREEMPTION, ids=[row[0] for row in NO_PREEMPTION])
def test_no_preemption(why, running, entry):
    result = _pass([entry(False)], running(False))
    assert result.preemptions == [], why
    hi = result.get("hi")
    assert hi.state == "head" and "preempting" not in hi.reason and "held by" in hi.reason
    fixed = _pass([entry(True)], running(True))  # only the row's cause removed: it preempts
    assert [p.preemptor for p in fixed.preemptions] == ["hi"], why
    assert "preempting " in fixed.get("hi").reason


def test_non_preemptible_job_is_skipped_for_a_preemptible_one_that_loses_more():
    running = [_run("hgx-a1:0-7", "keep", 0, preemptible=False, checkpoint=NOW - 1),
               _run("hgx-a2:0-7", "lose", 0, checkpoint=NOW - 5000)]
    assert _pass([_hi()], running).preemptions[0].victims == ("lose",)


def test_borrowers_go_before_in_quota_jobs_at_equal_lost_work_then_lower_priority():
    # prod (quota 16) runs in-quota; intern (quota 0) borrows: prod's job, within its quota, may
    # stop either (its own lower-priority job, or a reclaim); at equal lost work the borrower goes
    running = [_run("hgx-a1:0-7", "in-quota", 0, checkpoint=NOW - 60, team="prod"),
               _run("hgx-a2:0-7", "borrower", 2, checkpoint=NOW - 60, team="intern")]
    hi = QueueEntry("hi", PlanRequest(8, "A100*"), 5, NOW - 120, team="prod")
    teams = {"prod": {"quota": {"A100*": 16}}, "intern": {"quota": {"*": 0}}}
    assert _teams_pass([hi], running, teams).preemptions[0].victims == ("borrower",)
    running = [_run("hgx-a1:0-7", "p2", 2, checkpoint=NOW - 60), _run("hgx-a2:0-7", "p1", 1, checkpoint=NOW - 60)]
    assert _pass([_hi()], running).preemptions[0].victims == ("p1",)


def test_a_preemptor_whose_victims_still_stop_does_not_preempt_again_and_others_do_not_share_victims():
    running = [_run("hgx-a1:0-7", "a", 1, preempting="hi"), _run("hgx-a2:0-7", "b", 1)]
    result = _pass([_hi()], running)
    assert result.preemptions == []
    assert "preempting a for it" in result.get("hi").reason
    # two preemptors in one pass take different victims
    running = [_run("hgx-a1:0-7", "a", 1), _run("hgx-a2:0-7", "b", 1)]
    q = [_hi(), QueueEntry("hi2", PlanRequest(8, "A100*"), 4, NOW - 300)]
    result = _pass(q, running)
    # one pool (A100), one head: the second waits behind the first and preempts nothing
    assert [p.preemptor for p in result.preemptions] == ["hi"]


def test_without_rules_or_running_jobs_the_pass_is_unchanged():
    running = [_run("hgx-a1:0-7", "a", 1), _run("hgx-a2:0-7", "b", 1)]
    reserved = {k: j.job_id for j in running for k in j.gpus}
    adm = Admission(_cluster())
    plain = adm.run([_hi()], now=NOW, reserved=reserved)
    off = adm.run([_hi()], now=NOW, reserved=reserved, running=running, preemption=None)
    assert plain.preemptions == off.preemptions == []
    assert plain.get("hi").reason == off.get("hi").reason


def test_bad_rules_are_one_line_errors():
    with pytest.raises(RequestError, match="min_runtime_s: expected a number of seconds >= 0, got -1"):
        PreemptionRules(min_runtime_s=-1)
    assert GpuKey("hgx-a1", 0) in _run("hgx-a1:0", "x").gpus


def test_a_victim_that_would_queue_ahead_of_the_preemptor_is_not_chosen():
    # aging: one level an hour; the preemptor (priority 5) was enqueued at NOW - 120. A priority-1
    # job enqueued more than 4 h before that would rank ahead of it back in the queue and take
    # its GPUs straight back: never a victim. One enqueued 3 h before is.
    old = _run("hgx-a1:0-7", "old", 1, checkpoint=NOW - 1)
    object.__setattr__(old, "enqueued_at", NOW - 120 - 4 * 3600 - 1)
    recent = _run("hgx-a2:0-7", "recent", 1, checkpoint=NOW - 900)
    object.__setattr__(recent, "enqueued_at", NOW - 120 - 3 * 3600)
    assert _pass([_hi()], [old, recent]).preemptions[0].victims == ("recent",)


# --- reclaim: a job within its team's quota stops other teams' borrowers ----------------------
def _teams_pass(queue, running, teams):
    from airflow_hetero_gpu.core.admission import QuotaInput, teams_from_mapping

    reserved = {k: j.job_id for j in running for k in j.gpus}
    quotas = QuotaInput(teams_from_mapping({"teams": teams}), {j.job_id: j.team for j in running})
    return Admission(_cluster()).run(queue, now=NOW, reserved=reserved, running=running, preemption=RULES,
                                     quotas=quotas)


TEAMS = {"prod": {"quota": {"A100*": 8}}, "intern": {"quota": {"*": 0}}}


def _interns(borrowed=True, preemptible=True):
    return [_run("hgx-a1:0-7", "intern-1", 5, checkpoint=NOW - 100, borrowed=borrowed, team="intern",
                 preemptible=preemptible),
            _run("hgx-a2:0-7", "intern-2", 5, checkpoint=NOW - 30, borrowed=borrowed, team="intern",
                 preemptible=preemptible)]


def test_a_job_within_its_quota_reclaims_it_from_a_borrower_of_higher_priority():
    prod = QueueEntry("prod-1", PlanRequest(8, "A100*"), 0, NOW - 120, team="prod")
    result = _teams_pass([prod], _interns(preemptible=False), TEAMS)  # a borrower is always reclaimable
    (pre,) = result.preemptions
    assert pre.victims == ("intern-2",)  # the one losing least work
    assert pre.reasons["intern-2"] == "team prod, priority 0 < 5; reclaim of prod's quota"
    assert set(result.get("prod-1").claim.gpus) == set(_keys("hgx-a2:0-7"))


def test_no_reclaim_beyond_the_quota_nor_from_jobs_within_theirs():
    from airflow_hetero_gpu.core.admission.preemption import eligible

    beyond = QueueEntry("prod-2", PlanRequest(16, "A100*"), 0, NOW - 120, team="prod")  # 16 > its quota of 8
    assert _teams_pass([beyond], _interns(), TEAMS).preemptions == []
    prod = QueueEntry("prod-1", PlanRequest(8, "A100*"), 0, NOW - 120, team="prod")
    borrower, owner = _interns()[0], _interns(borrowed=False)[0]
    assert eligible(prod, borrower, NOW, RULES, reclaim=True)
    assert not eligible(prod, owner, NOW, RULES, reclaim=True)  # within its own quota, higher priority
    assert not eligible(prod, borrower, NOW, RULES, reclaim=False)  # a borrower of the job's own round
    young = _run("hgx-a1:0-7", "intern-3", 5, started=NOW - 60, borrowed=True, team="intern")
    assert not eligible(prod, young, NOW, RULES, reclaim=True)  # min_runtime holds for reclaims too


def test_teams_configured_a_job_preempts_only_its_own_teams_jobs_by_priority():
    research = [_run("hgx-a1:0-7", "a", 1, team="research"), _run("hgx-a2:0-7", "b", 1, team="research")]
    prod = QueueEntry("hi", PlanRequest(8, "A100*"), 5, NOW - 120, team="prod")
    teams = {"prod": {"quota": {"A100*": 8}}, "research": {"quota": {"A100*": 16}}}
    assert _teams_pass([prod], research, teams).preemptions == []  # neither its team's nor borrowed
    mine = [_run("hgx-a1:0-7", "a", 1, team="prod"), _run("hgx-a2:0-7", "b", 1, team="research")]
    (pre,) = _teams_pass([prod], mine, teams).preemptions
    assert pre.victims == ("a",) and pre.reasons["a"] == "team prod, priority 5 > 1"


def test_without_teams_the_whole_fleet_is_one_team_and_reasons_name_none():
    running = [_run("hgx-a1:0-7", "a", 1, team="research"), _run("hgx-a2:0-7", "b", 1, team="research")]
    entry = QueueEntry("hi", PlanRequest(8, "A100*"), 5, NOW - 120, team="prod")  # the operator sends one
    (pre,) = _pass([entry], running).preemptions
    assert pre.team is None and set(pre.reasons.values()) == {"priority 5 > 1"}


@pytest.mark.parametrize("aging", [3600.0, None])
def test_the_pass_finds_candidates_with_numpy_exactly_as_the_rule_says_one_job_at_a_time(aging):
    """Candidates (the pass's arrays) against eligible() and victim_key() on random jobs: the same
    jobs, in the same order, for every waiting job, with and without reclaim."""
    import random

    from airflow_hetero_gpu.core.admission.preemption import Candidates, eligible, victim_key

    rng = random.Random(7)
    teams = [None, "prod", "research"]
    running = []
    for i in range(300):
        started = rng.choice([NOW - 5000, NOW - 700, NOW - 100, rng.uniform(0, NOW)])
        running.append(RunningJob(
            f"r{rng.randrange(1000):03d}-{i}", tuple(GpuKey("h", g) for g in range(rng.choice([1, 2, 8]))),
            rng.choice([0, 1, 2, 5]), started, rng.choice([None, started + 50, started - 10, NOW - 20]),
            rng.choice(teams), rng.random() < 0.8, rng.random() < 0.3,
            rng.choice([None, None, None, "other"]), rng.choice([None, started - 300, 0.0, NOW - 3600])))
    cands = Candidates(running, NOW, RULES, aging)
    assert [j.job_id for j in cands.jobs] == [j.job_id for j in sorted(running, key=victim_key(NOW))]
    checked = 0
    for n in range(12):
        entry = QueueEntry(f"w{n}", PlanRequest(1), rng.choice([0, 1, 2, 5, 9]),
                           rng.choice([NOW - 7200, NOW - 600, rng.uniform(0, NOW), 0.0]), team=rng.choice(teams))
        for reclaim in (False, True):
            mask = cands.eligible(entry, reclaim=reclaim)
            want = [eligible(entry, j, NOW, RULES, aging, reclaim=reclaim) for j in cands.jobs]
            assert mask.tolist() == want, (entry, reclaim)
            checked += sum(want)
    assert checked > 20  # the random jobs make both answers common


def _random_jobs(rng, n=300):
    teams = [None, "prod", "research"]
    out = []
    for i in range(n):
        started = rng.choice([NOW - 5000, NOW - 700, NOW - 100, rng.uniform(0, NOW)])
        out.append(RunningJob(
            f"r{i:03d}", tuple(GpuKey("h", g) for g in range(rng.choice([1, 2, 8]))), rng.choice([0, 1, 2, 5]),
            started, None, rng.choice(teams), rng.random() < 0.7, rng.random() < 0.3,
            rng.choice([None, None, None, "other"]), rng.choice([None, started - 300, 0.0, NOW - 3600])))
    return out


def test_the_prefilters_are_necessary_conditions_of_the_one_predicate_on_generated_rows():
    """The ledger's SQL prefilter (``may_be_preempted``, on rows of a real SQLite table) and the
    pass's ``bounds`` never rule out a job that the predicate (``Candidates.eligible``) accepts."""
    import random

    import sqlalchemy as sa

    from airflow_hetero_gpu.core.admission.preemption import Candidates, PassPreemption
    from airflow_hetero_gpu.ledger.preemption import may_be_preempted

    rng = random.Random(11)
    running = _random_jobs(rng)
    meta = sa.MetaData()
    rows = sa.Table("rows", meta, sa.Column("job_id", sa.String, primary_key=True),
                    sa.Column("priority", sa.Integer, nullable=True), sa.Column("preemptible", sa.Boolean))
    engine = sa.create_engine("sqlite://")
    meta.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(rows), [{"job_id": j.job_id, "priority": j.priority or None,  # NULL is 0
                                        "preemptible": j.preemptible} for j in running])
    cands = Candidates(running, NOW, RULES, 3600.0)
    bounds = PassPreemption(running, RULES, NOW, 3600.0, borrowing=lambda j: j.borrowed).bounds
    checked = 0
    with engine.connect() as conn:
        for n in range(80):
            entry = QueueEntry(f"w{n}", PlanRequest(1), rng.choice([0, 1, 2, 5, 9]),
                               rng.choice([NOW - 7200, NOW - 600, 0.0]), team=rng.choice([None, "prod", "research"]))
            below = entry.priority + rng.choice([0, 0, 3])  # the highest waiting priority: entry's or above
            kept = {r for (r,) in conn.execute(sa.select(rows.c.job_id).where(may_be_preempted(rows.c, below)))}
            accepted = {cands.jobs[i].job_id for i in np.flatnonzero(cands.eligible(entry)).tolist()}
            assert accepted <= kept, (entry, sorted(accepted - kept))
            for reclaim in (False, True):
                if not cands.eligible(entry, reclaim=reclaim).any():
                    continue
                lowest, borrowers = bounds  # the pass skips the entry when neither lets anything through
                assert entry.priority > lowest or (reclaim and borrowers), (entry, reclaim)
            checked += len(accepted)
    assert checked > 100 and len(kept) < len(running)  # both sides are common: the checks are not vacuous


@pytest.mark.parametrize("seed", range(3))
def test_the_pass_reads_who_stops_and_the_lowest_priority_as_the_columns_do(seed):
    """A pass without kept columns reads both in one walk over the jobs; the columns (kept between
    passes) and in_progress() give the same."""
    import math
    import random

    from airflow_hetero_gpu.core.admission.preemption import PassPreemption, in_progress
    from airflow_hetero_gpu.core.admission.running import RunningColumns

    import dataclasses

    running = _random_jobs(random.Random(seed), n=200 if seed else 0)
    # the lowest priorities are of jobs that may not be preempted, or are being stopped already
    running = [dataclasses.replace(j, priority=0) if not j.preemptible or j.preempting else
               dataclasses.replace(j, priority=max(1, j.priority)) for j in running]
    walked = PassPreemption(running, RULES, NOW, 3600.0)
    cols = RunningColumns(running, None)
    kept = PassPreemption(running, RULES, NOW, 3600.0, columns=lambda jobs, build=True: cols)
    want = min((j.priority for j in running if j.preempting is None and j.preemptible), default=math.inf)
    assert walked.stopping == kept.stopping == in_progress(running)
    assert walked.bounds[0] == kept.bounds[0] == want
    assert (1 <= want < math.inf and walked.stopping) if seed else want == math.inf


def test_a_preemptor_waits_on_the_gpus_its_victims_free_not_on_a_holder_that_never_yields():
    """hi preempted a (hgx-a1) in an earlier pass; while a stops, hgx-a2 has fewer GPUs held, by a
    reservation that can never be preempted (``plan --reserve``): hi's claim stays on a's GPUs and
    its reason names them and a, not the reservation."""
    running = [_run("hgx-a1:0-7", "a", 1, preempting="hi"), _run("hgx-a2:0-3", "reserved", 0, preemptible=False)]
    hi = QueueEntry("hi", PlanRequest(8, "A100*"), 5, NOW - 120, tuple(_keys("hgx-a1:0-7")))
    result = _pass([hi], running)
    w = result.get("hi")
    assert w.state == "head" and set(w.claim.gpus) == set(_keys("hgx-a1:0-7"))
    assert set(w.claim.held_by.values()) == {"a"}
    assert "hgx-a1 GPU 0-7" in w.reason and "held by a" in w.reason and "reserved" not in w.reason
    assert w.reason.endswith("preempting a for it") and result.preemptions == []
