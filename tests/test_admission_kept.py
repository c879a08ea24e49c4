"""What a pass keeps for the next (core/admission/kept.py, and the quota book's answers per
version): a pass after any change to its inputs, even one made in place on the same objects,
decides what a pass from scratch decides; equal inputs in another order give the same pass.

The cluster is ``benchmarks/plan_latency.py``'s synthetic one, small.
"""

from __future__ import annotations

import copy
import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest

from airflow_hetero_gpu.core.admission import (
    Admission, PreemptionRules, QueueEntry, QuotaBook, QuotaInput, RunningJob, teams_from_mapping,
)
from airflow_hetero_gpu.core.model import PlanRequest

_SPEC = importlib.util.spec_from_file_location(
    "plan_latency", Path(__file__).resolve().parent.parent / "benchmarks" / "plan_latency.py")
plan_latency = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(plan_latency)

TEAMS = {"a": {"quota": {"*": 500}, "weight": 2}, "b": {"quota": {"*": 300}},
         "c": {"quota": {"*": 100}, "borrowing_limit": {"*": 100}}}


@pytest.fixture(scope="module")
def cluster():
    return plan_latency.synthetic_cluster(1600, seed=5)


def _held(c, share, seed=3):
    rng = random.Random(seed)
    usable = np.flatnonzero(c.base_load < 0.5).tolist()
    keys = [c.gpus[p].key for p in rng.sample(usable, int(share * len(usable)))]
    return {k: f"run-{i // 4}" for i, k in enumerate(sorted(keys))}


def _queue(n, seed=4):
    rng = random.Random(seed)
    return [QueueEntry(f"w{i}", PlanRequest(rng.choice((1, 2, 4, 8))), rng.choice((0, 1, 2)), rng.uniform(0, 3600),
                       team="abc"[i % 3]) for i in range(n)]


def _running(held, team_of):
    by_job: dict[str, list] = {}
    for k, j in held.items():
        by_job.setdefault(j, []).append(k)
    return [RunningJob(j, tuple(ks), 0, 0.0, 3000.0, team_of.get(j)) for j, ks in by_job.items()]


def _decided(c, queue, held, quotas):
    result = Admission(c).run(queue, now=3600.0, reserved=held, quotas=quotas,
                              running=_running(held, dict(quotas.team_of) if quotas else {}),
                              preemption=PreemptionRules())
    teams = None if result.teams is None else [row.to_json() for row in result.teams]
    return result.to_json(), [(p.preemptor, list(p.victims)) for p in result.preemptions], teams


def test_a_change_made_in_place_is_seen(cluster):
    """The caller changes its reservations dict and its teams dict in place between passes: each
    pass equals one on a fresh copy of the cluster (nothing kept)."""
    c = copy.copy(cluster)  # its own kept state
    held = _held(c, 0.95)
    queue = _queue(40)
    team_of = {j: "abc"[int(j.split("-")[1]) % 3] for j in set(held.values())}
    quotas = QuotaInput(teams_from_mapping({"teams": TEAMS}), team_of)
    seen = []

    def check():
        kept = _decided(c, queue, held, quotas)
        fresh = _decided(copy.copy(cluster), queue, dict(held), QuotaInput(quotas.teams, dict(team_of)))
        assert kept == fresh
        seen.append(kept)

    check()
    check()  # the same inputs: answered from what was kept
    # jobs end: their GPUs leave the same dict object
    for job in sorted(set(held.values()))[:30]:
        for k in [k for k, j in held.items() if j == job]:
            del held[k]
    check()
    assert seen[2][0]["admitted"] != seen[1][0]["admitted"], "the freed GPUs admit jobs"
    # another holder on the same GPUs (the keys stay): the teams' holdings follow the job
    first = next(iter(held))
    held[first] = "moved-job"
    team_of["moved-job"] = "c"
    check()
    # a job changes team, the reservations stay equal: the holdings are counted again
    job = next(j for j, t in team_of.items() if t == "a" and j in set(held.values()))
    team_of[job] = "c"
    check()
    assert seen[-1][2] != seen[-2][2], "the standing follows the job to its new team"


def test_equal_reservations_in_another_order(cluster):
    """A dict equal to the last one but built in another order (as a database may return the rows)
    gives the pass of that dict."""
    c = copy.copy(cluster)
    held = _held(c, 0.9, seed=8)
    queue = _queue(30, seed=9)
    quotas = QuotaInput(teams_from_mapping({"teams": TEAMS}),
                        {j: "abc"[int(j.split("-")[1]) % 3] for j in set(held.values())})
    first = _decided(c, queue, held, quotas)
    shuffled = list(held.items())
    random.Random(1).shuffle(shuffled)
    assert _decided(c, queue, dict(shuffled), quotas) == first
    assert _decided(copy.copy(cluster), queue, dict(shuffled), quotas) == first


def test_a_pass_after_another_mask_or_no_reservations(cluster):
    """A pass given a reserved mask, or nothing reserved, between two passes with the same dict:
    each is its own (what was kept for the dict is not used for them)."""
    c = copy.copy(cluster)
    held = _held(c, 0.9, seed=12)
    queue = _queue(20, seed=13)
    adm = Admission(c)
    with_dict = adm.run(queue, now=3600.0, reserved=held).to_json()
    nothing = Admission(c).run(queue, now=3600.0, reserved={}).to_json()
    assert nothing == Admission(copy.copy(cluster)).run(queue, now=3600.0, reserved={}).to_json()
    assert nothing["admitted"] != with_dict["admitted"]
    mask = np.zeros(len(c.gpus), dtype=bool)
    mask[[c.position[k] for k in held]] = True
    assert Admission(c).run(queue, now=3600.0, reserved=held, reserved_mask=mask).to_json() == with_dict
    assert Admission(c).run(queue, now=3600.0, reserved=held).to_json() == with_dict


def test_the_quota_books_answers_follow_its_accounts():
    """check() and explain() are answered once per accounts' version: after a job starts or keeps
    quota, the answer is the one a new book with those accounts gives."""
    teams = teams_from_mapping({"teams": {"a": {"quota": {"*": 8}}, "b": {"quota": {"*": 8}}}})
    book = QuotaBook(teams, {"A100": 16}, {("b", "A100"): 8})
    allowed = book.check("b", "A100", 4)
    assert allowed.allowed and allowed.borrow == 4
    assert book.check("b", "A100", 4) is allowed  # the same accounts: the kept answer
    book.take("a", "A100", 8)  # a uses its quota: nothing is idle to lend
    refused = book.check("b", "A100", 4)
    fresh = QuotaBook(teams, {"A100": 16}, {("b", "A100"): 8, ("a", "A100"): 8})
    assert not refused.allowed
    assert refused == fresh.check("b", "A100", 4)
    assert book.explain("b", "A100", 4) == fresh.explain("b", "A100", 4)
    assert book.explain("b", "A100", 2).endswith("; needs 2")
    assert book.explain("b", "A100", 2)[:-len("; needs 2")] == book.explain("b", "A100", 4)[:-len("; needs 4")]


def test_running_jobs_changed_in_place_are_seen(cluster):
    """The running jobs' columns are kept while a pass is given the very same job objects: a job
    replaced in the same list (here: the victims of the last pass, now not preemptible) is seen,
    and the pass equals one from scratch."""
    import dataclasses

    c = copy.copy(cluster)
    held = _held(c, 0.97, seed=21)
    queue = _queue(30, seed=22)
    running = _running(held, {})

    def decided(cl, jobs):
        result = Admission(cl).run(queue, now=3600.0, reserved=held, running=jobs, preemption=PreemptionRules())
        return result.to_json(), [(p.preemptor, list(p.victims)) for p in result.preemptions]

    first = decided(c, running)
    assert first[1], "the pass preempts someone"
    assert decided(c, running) == first  # the same objects: the kept columns
    victims = {v for _, vs in first[1] for v in vs}
    for i, job in enumerate(running):
        if job.job_id in victims:
            running[i] = dataclasses.replace(job, preemptible=False)
    second = decided(c, running)
    assert second == decided(copy.copy(cluster), list(running))
    assert not victims & {v for _, vs in second[1] for v in vs}


def test_the_kept_columns_say_who_stops_and_the_lowest_preemptible_priority():
    """What a pass with preemption reads of the kept running columns is what the jobs say: the
    victims stopping per preemptor (``in_progress``, in the jobs' order) and the lowest priority
    of a job that may be preempted and is not stopping (the jobs' own numbers, floats kept)."""
    from airflow_hetero_gpu.core.admission.preemption import in_progress
    from airflow_hetero_gpu.core.admission.running import RunningColumns
    from airflow_hetero_gpu.core.model import GpuKey

    def job(i, **kw):
        return RunningJob(f"r{i}", (GpuKey(f"h{i}", 0),), **kw)

    jobs = [job(0, priority=3), job(1, priority=1, preempting="w1"), job(2, priority=2, preemptible=False),
            job(3, priority=2.5), job(4, priority=0, preempting="w1"), job(5, priority=4, preempting="w2")]
    cols = RunningColumns(jobs, None)
    assert cols.stopping() == in_progress(jobs) == {"w1": ["r1", "r4"], "w2": ["r5"]}
    cols.stopping()["w1"].append("x")  # the caller's own copy
    assert cols.stopping()["w1"] == ["r1", "r4"]
    assert cols.lowest_preemptible() == 2.5  # r1, r4 stop, r2 may not be preempted
    assert RunningColumns([job(1, preempting="w")], None).lowest_preemptible() == float("inf")


def test_kept_columns_are_handed_back_only_for_the_very_same_jobs(cluster):
    """``build=False`` answers the kept columns for the same job objects in the same order, and
    None (nothing built) for equal jobs that are other objects, or another order."""
    from airflow_hetero_gpu.core.admission.kept import KeptHeld
    from airflow_hetero_gpu.core.model import GpuKey

    jobs = [RunningJob(f"r{i}", (GpuKey(f"h{i}", 0),), priority=i) for i in range(4)]
    kept = KeptHeld()
    assert kept.columns(jobs, cluster, build=False) is None
    cols = kept.columns(jobs, cluster)
    assert kept.columns(list(jobs), cluster, build=False) is cols
    assert kept.columns(copy.copy(jobs[:3]) + [copy.copy(jobs[3])], cluster, build=False) is None
    assert kept.columns(jobs[::-1], cluster, build=False) is None
    assert kept.columns(jobs, cluster, build=False) is not None  # a miss without build keeps what was kept
