"""Kept planner reports (core/plankept.py): every answer is plan()'s for the same arguments, and a
pass over a cluster that kept reports from passes before, after a change to the holdings, the
queue, the quotas, the drains or the evictions, decides what a pass from scratch decides.

The cluster is ``benchmarks/plan_latency.py``'s synthetic one (hosts of 8 with real wirings, four
card types, task-type pools, loads, unhealthy GPUs, racks under leaves under spines), small.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest

from airflow_hetero_gpu.core.admission import (
    Admission, PreemptionRules, QueueEntry, QuotaInput, RunningJob, teams_from_mapping,
)
from airflow_hetero_gpu.core.admission.placer import PlannerPlacer
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.core.plankept import KeptPlans
from airflow_hetero_gpu.core.planner import plan

_SPEC = importlib.util.spec_from_file_location(
    "plan_latency", Path(__file__).resolve().parent.parent / "benchmarks" / "plan_latency.py")
plan_latency = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(plan_latency)
CARDS = [None, plan_latency.KINDS[0][0], plan_latency.KINDS[1][0]]


@pytest.fixture(scope="module")
def cluster():
    return plan_latency.synthetic_cluster(1600, seed=3)


def _facts(result):
    reports = [(r.pool, r.stage, r.gpus, r.healthy, r.available, r.selection, r.mean_distance,
                None if r.score is None else r.score.to_json(), r.reason_text()) for r in result.pools]
    decision = None if result.decision is None else result.decision.to_json()
    return decision, reports, [g.key for g in result.unhealthy]


def _holders(c, mask):
    return {c.gpus[p].key: f"job-{p // 3}" for p in np.flatnonzero(mask).tolist()}


@pytest.mark.parametrize("seed", range(4))
def test_a_stream_of_questions_gets_plans_answers(cluster, seed):
    """Questions as a pass asks them: each decision's GPUs then held (its pool's slice changes),
    sometimes a job ends (GPUs freed), sometimes a pool ruled out whole; evictions and drains
    with it. Each answer, reasons read on demand included, is plan()'s; every other answer's
    reasons are first read once the later questions have patched the arrays it was computed on."""
    rng = random.Random(seed)
    c = cluster
    evicted = {c.gpus[5].key: ("xid-79",)} if seed % 2 else {}
    drained = {c.hosts[3]: "upgrade"} if seed >= 2 else {}
    kept = KeptPlans(c, evicted=evicted, drained=drained)
    mask = rng_mask(c, rng, 0.9)
    asked, later = 0, []
    for _ in range(60):
        req = PlanRequest(rng.choice((1, 2, 4, 8, 16)), rng.choice(CARDS),
                          gpu_memory_mib=rng.choice((None, None, 30000)))
        blocked = mask | (c.pool_of == rng.randrange(len(c.pools))) if rng.random() < 0.2 else mask.copy()
        holders = _holders(c, blocked)
        got = kept.plan(req, holders, blocked)
        want = plan(c, req, reserved=holders, reserved_mask=blocked, evicted=evicted, drained=drained,
                    explain=False)
        if asked % 2:
            later.append((got, want))
        else:
            assert _facts(got) == _facts(want)
        asked += 1
        if got.decision is not None:
            mask[[c.position[k] for k in got.decision.keys]] = True
        if rng.random() < 0.2:  # a job ends
            held = np.flatnonzero(mask)
            mask[rng.sample(held.tolist(), min(8, len(held)))] = False
    for got, want in later:
        assert _facts(got) == _facts(want)
    assert kept.computed < asked * len(c.pools)  # it did keep reports


def rng_mask(c, rng, share):
    return np.array([rng.random() < share for _ in c.gpus], dtype=bool)


def test_a_decision_is_never_the_gpus_just_taken(cluster):
    """The kept report of a pool whose GPUs were then taken is not given again."""
    c = cluster
    kept = KeptPlans(c)
    mask = rng_mask(c, random.Random(1), 0.8)
    req = PlanRequest(4)
    first = kept.plan(req, {}, mask)
    mask[[c.position[k] for k in first.decision.keys]] = True
    second = kept.plan(req, {}, mask)
    assert not set(second.decision.keys) & set(first.decision.keys)
    assert _facts(second) == _facts(plan(c, req, reserved={}, reserved_mask=mask, explain=False))


def test_target_questions_on_a_released_copy(cluster):
    """A target question (the GPUs of running jobs counted idle) is plan()'s on the released copy:
    before any start question, and after one (the copy's parts then share what depends on the
    GPUs' health alone with the cluster's)."""
    c = cluster
    rng = random.Random(5)
    placer = PlannerPlacer(c)
    held = rng_mask(c, rng, 0.7)
    for i in range(10):
        if i == 5:  # a start question: the cluster's own parts exist from here on
            placer(QueueEntry("s", PlanRequest(1)), held, {})
        idle = held & rng_mask(c, rng, 0.5)
        blocked = held & ~idle
        entry = QueueEntry("t", PlanRequest(rng.choice((2, 8, 16)), rng.choice(CARDS)))
        got = placer(entry, blocked, {}, idle=idle)
        released = placer.released(idle)
        want = plan(released, entry.request, reserved={}, reserved_mask=blocked, explain=False)
        assert _facts(got.result) == _facts(want)


# --- whole passes ----------------------------------------------------------------------------
TEAMS = {"a": {"quota": {"*": 500}, "weight": 2}, "b": {"quota": {"*": 300}},
         "c": {"quota": {"*": 100}, "borrowing_limit": {"*": 100}}}


def _queue(n, rng):
    return [QueueEntry(f"w{i}", PlanRequest(rng.choice((1, 2, 4, 8, 16)), rng.choice(CARDS)), rng.choice((0, 1, 2)),
                       rng.uniform(0, 3600), team="abc"[i % 3]) for i in range(n)]


def _held(c, rng, share):
    out, n = {}, 0
    for p in np.flatnonzero(rng_mask(c, rng, share)).tolist():
        out[c.gpus[p].key] = f"run-{n // 4}"
        n += 1
    return out


def _running(held, now, team_of):
    by_job: dict[str, list] = {}
    for k, j in held.items():
        by_job.setdefault(j, []).append(k)
    return [RunningJob(j, tuple(ks), 0, now - 3600, now - 600, team_of.get(j)) for j, ks in by_job.items()]


def _pass(c, queue, held, *, quotas=None, drained=None, evicted=None, now=3600.0):
    team_of = dict(quotas.team_of) if quotas else {}
    result = Admission(c, drained=drained, evicted=evicted).run(
        queue, now=now, reserved=held, quotas=quotas, running=_running(held, now, team_of),
        preemption=PreemptionRules())
    return result.to_json(), [(p.preemptor, list(p.victims)) for p in result.preemptions], result


def test_passes_after_changes_decide_what_a_pass_from_scratch_decides(cluster):
    """One cluster object kept between passes (as the ledger keeps it); after each change the
    pass equals one on a fresh copy of the cluster (nothing kept)."""
    rng = random.Random(11)
    c = copy.copy(cluster)  # its own kept state
    queue, held = _queue(60, rng), _held(c, rng, 0.9)
    teams = teams_from_mapping({"teams": TEAMS})
    quotas = QuotaInput(teams, {j: "abc"[hash(j) % 3] for j in set(held.values())})

    def check(**kw):
        kept = _pass(c, queue, held, **kw)
        fresh = _pass(copy.copy(cluster), queue, held, **kw)
        assert kept[:2] == fresh[:2]
        return kept[2]

    result = check()
    # holdings: the admitted start, the others keep their claims
    held = held | {k: a.job_id for a in result.admitted for k in a.gpus}
    claims = {j: cl.gpus for j, cl in result.claims.items()}
    started = {a.job_id for a in result.admitted}
    assert started, "the first pass admits someone"
    queue = [dataclasses.replace(e, claim=claims.get(e.job_id, ())) for e in queue if e.job_id not in started]
    check()
    # a renewal: nothing changed
    check()
    # jobs end: their GPUs are free again
    ending = set(rng.sample(sorted(set(held.values())), 40))
    held = {k: j for k, j in held.items() if j not in ending}
    check()
    # the queue changes: new jobs, some leave
    queue = queue[5:] + _queue(70, random.Random(12))[60:]
    check()
    # quotas
    check(quotas=quotas)
    quotas = QuotaInput(teams_from_mapping({"teams": {**TEAMS, "c": {"quota": {"*": 400}}}}), quotas.team_of)
    check(quotas=quotas)
    # a drain, then an eviction, then both gone
    check(quotas=quotas, drained={c.hosts[7]: "maintenance"})
    check(quotas=quotas, evicted={c.gpus[40].key: ("xid-48",)})
    check(quotas=quotas)


def test_a_request_plan_refuses_is_refused(cluster):
    """A request that is a mistake (k > 1 of MIG instances) is refused as plan() refuses it."""
    from airflow_hetero_gpu.errors import RequestError

    req = PlanRequest(2, "A100 MIG 1g.10gb")
    mask = np.zeros(len(cluster.gpus), dtype=bool)
    with pytest.raises(RequestError) as want:
        plan(cluster, req, reserved={}, reserved_mask=mask, explain=False)
    with pytest.raises(RequestError) as got:
        KeptPlans(cluster).plan(req, {}, mask)
    assert str(got.value) == str(want.value)
