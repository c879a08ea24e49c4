"""The simulator's event loop on tiny traces computed by hand: the three queue disciplines,
release, gang all-or-nothing, backfill, spanning, rejection, the distance slowdown, the metrics.

Cluster for every case (hosts a, b under one leaf):
  a: 4 x T4, the 4-GPU PCIe layout: 0-1 NODE (5), 2-3 NODE (5), every other pair SYS (6)
  b: 2 x T4, PHB (4)
Policy: first-fit (first host by name with room, lowest free indices), so every start is fixed.
"""

from __future__ import annotations

import math

import pytest

from airflow_hetero_gpu.sim.engine import run_time, simulate
from airflow_hetero_gpu.sim.fleet import Node, build_fleet
from airflow_hetero_gpu.sim.metrics import summarize
from airflow_hetero_gpu.sim.policies import make_policy
from airflow_hetero_gpu.sim.trace import Job

NODES = [Node("a", 4, "T4"), Node("b", 2, "T4")]


@pytest.fixture(scope="module")
def cluster():
    return build_fleet(NODES, hosts_per_leaf=16).cluster


def _jobs(rows):
    return [Job(id, arrival, duration, gpus, tuple(types)) for id, arrival, duration, gpus, *types in rows]


def _starts(result):
    return {r.id: (r.start, r.end, [f"{k.host}{k.index}" for k in r.keys]) for r in result.records}


# (case, jobs (id, arrival, duration, gpus[, type]), backfill, expected {id: (start, end, GPUs)})
CASES = [
    ("one job starts at once",
     [("j1", 0, 10, 2)], 0,
     {"j1": (0, 10, ["a0", "a1"])}),
    ("a gang waits for all its GPUs, then starts when they are released",
     [("j1", 0, 10, 4), ("j2", 1, 5, 4)], 0,
     {"j1": (0, 10, ["a0", "a1", "a2", "a3"]), "j2": (10, 15, ["a0", "a1", "a2", "a3"])}),
    ("strict FIFO: a small job behind a waiting head waits too",
     [("j1", 0, 10, 4), ("j2", 1, 5, 4), ("j3", 2, 3, 1)], 0,
     {"j1": (0, 10, ["a0", "a1", "a2", "a3"]), "j2": (10, 15, ["a0", "a1", "a2", "a3"]),
      "j3": (10, 13, ["b0"])}),
    ("backfill 1: the small job starts at once on the free host",
     [("j1", 0, 10, 4), ("j2", 1, 5, 4), ("j3", 2, 3, 1)], 1,
     {"j1": (0, 10, ["a0", "a1", "a2", "a3"]), "j2": (10, 15, ["a0", "a1", "a2", "a3"]),
      "j3": (2, 5, ["b0"])}),
    ("backfill looks at most N jobs behind the head",
     [("j1", 0, 10, 4), ("j2", 1, 5, 4), ("j3", 2, 3, 4), ("j4", 3, 1, 1)], 1,
     {"j1": (0, 10, ["a0", "a1", "a2", "a3"]), "j2": (10, 15, ["a0", "a1", "a2", "a3"]),
      "j3": (15, 18, ["a0", "a1", "a2", "a3"]), "j4": (10, 11, ["b0"])}),
    ("GPUs freed at an instant are reused at that instant",
     [("j1", 0, 5, 6), ("j2", 5, 1, 6)], 0,
     {"j1": (0, 5, ["a0", "a1", "a2", "a3", "b0", "b1"]), "j2": (5, 6, ["a0", "a1", "a2", "a3", "b0", "b1"])}),
    ("no host holds 5: the gang spans a and b",
     [("j1", 0, 10, 5)], 0,
     {"j1": (0, 10, ["a0", "a1", "a2", "a3", "b0"])}),
    ("arrival order, not file order",
     [("late", 3, 1, 6), ("early", 0, 4, 6)], 0,
     {"early": (0, 4, ["a0", "a1", "a2", "a3", "b0", "b1"]), "late": (4, 5, ["a0", "a1", "a2", "a3", "b0", "b1"])}),
]


@pytest.mark.parametrize("case,rows,backfill,expected", CASES, ids=[c[0] for c in CASES])
def test_first_fit_schedule_fifo(cluster, case, rows, backfill, expected):
    result = simulate(cluster, _jobs(rows), make_policy("first-fit"), queue="fifo", backfill=backfill)
    assert _starts(result) == expected
    assert result.rejected == []


# j1 holds a0-a2 until 10 and j1b all of b until 50; j2 (4 GPUs) arrives at 1 and can only ever
# have all of a. The admission queue claims a0-a3 for it, so j3 (1 GPU, 100 s) may not take the
# free a3 and waits; greedy gives j3 a3 at once, and j2 then waits until b frees at 50 and spans.
CLAIM_ROWS = [("j1", 0, 10, 3), ("j1b", 0, 50, 2), ("j2", 1, 5, 4), ("j3", 2, 100, 1)]
QUEUE_CASES = [
    ("admission: a small job behind a waiting head starts outside the head's claim",
     [("j1", 0, 10, 4), ("j2", 1, 5, 4), ("j3", 2, 3, 1)], "admission",
     {"j1": (0, 10, ["a0", "a1", "a2", "a3"]), "j2": (10, 15, ["a0", "a1", "a2", "a3"]), "j3": (2, 5, ["b0"])}),
    ("admission: the head's claim keeps a free GPU from a job behind it",
     CLAIM_ROWS, "admission",
     {"j1": (0, 10, ["a0", "a1", "a2"]), "j1b": (0, 50, ["b0", "b1"]), "j2": (10, 15, ["a0", "a1", "a2", "a3"]),
      "j3": (15, 115, ["a0"])}),
    ("greedy: the small job takes the free GPU and the gang waits for the other host",
     CLAIM_ROWS, "greedy",
     {"j1": (0, 10, ["a0", "a1", "a2"]), "j1b": (0, 50, ["b0", "b1"]), "j3": (2, 102, ["a3"]),
      "j2": (50, 55, ["a0", "a1", "a2", "b0"])}),
    ("fifo: the small job waits behind the gang",
     CLAIM_ROWS, "fifo",
     {"j1": (0, 10, ["a0", "a1", "a2"]), "j1b": (0, 50, ["b0", "b1"]), "j2": (10, 15, ["a0", "a1", "a2", "a3"]),
      "j3": (15, 115, ["a0"])}),
    ("greedy: a small job behind a waiting head starts at once",
     [("j1", 0, 10, 4), ("j2", 1, 5, 4), ("j3", 2, 3, 1)], "greedy",
     {"j1": (0, 10, ["a0", "a1", "a2", "a3"]), "j2": (10, 15, ["a0", "a1", "a2", "a3"]), "j3": (2, 5, ["b0"])}),
]


@pytest.mark.parametrize("case,rows,queue,expected", QUEUE_CASES, ids=[c[0] for c in QUEUE_CASES])
def test_first_fit_schedule_by_queue(cluster, case, rows, queue, expected):
    result = simulate(cluster, _jobs(rows), make_policy("first-fit"), queue=queue)
    assert _starts(result) == expected
    assert result.queue == queue


def test_priority_and_aging_in_the_simulator(cluster):
    """low (arrives 1) and high (priority 1, arrives 5) both need all 6 GPUs, free at 20 (j0 holds b
    until then). With an aging interval of 10 s (or none) high goes first; at 2 s one level is
    worth 2 s of waiting, low was enqueued 4 s earlier and goes first."""
    jobs = [Job("j1", 0, 10, 4), Job("j0", 0, 20, 2), Job("low", 1, 10, 6), Job("high", 5, 10, 6, priority=1)]
    slow = _starts(simulate(cluster, jobs, make_policy("first-fit"), aging_interval_s=10))
    fast = _starts(simulate(cluster, jobs, make_policy("first-fit"), aging_interval_s=2))
    none = _starts(simulate(cluster, jobs, make_policy("first-fit"), aging_interval_s=None))
    assert slow["high"][0] == 20 and slow["low"][0] == 30
    assert none["high"][0] == 20 and none["low"][0] == 30
    assert fast["low"][0] == 20 and fast["high"][0] == 30


def test_backfill_is_a_fifo_setting(cluster):
    with pytest.raises(ValueError, match="backfill"):
        simulate(cluster, _jobs([("j1", 0, 1, 1)]), make_policy("first-fit"), backfill=2)
    with pytest.raises(ValueError, match="queue"):
        simulate(cluster, _jobs([("j1", 0, 1, 1)]), make_policy("first-fit"), queue="lifo")


def test_jobs_that_can_never_fit_are_rejected_not_queued(cluster):
    jobs = _jobs([("big", 0, 1, 7), ("v100", 0, 1, 1, "V100M32"), ("ok", 1, 1, 1)])
    result = simulate(cluster, jobs, make_policy("first-fit"))
    assert [r.id for r in result.records] == ["ok"]
    assert [j for j, _ in result.rejected] == ["big", "v100"]
    assert "asks for 7 GPUs of any; the largest allowed card type has 6" in result.rejected[0][1]


def test_the_gang_never_holds_part_of_its_gpus(cluster):
    """While j2 (4 GPUs) waits, 2 GPUs are free all the time and none is given to it."""
    result = simulate(cluster, _jobs([("j1", 0, 10, 4), ("j2", 1, 5, 4)]), make_policy("first-fit"))
    assert list(result.times) == [0, 1, 10, 15]
    assert list(result.allocated) == [4, 4, 4, 0]
    assert list(result.queued) == [0, 1, 0, 0]


@pytest.mark.parametrize("duration,distance,gpus,cost,expected", [
    (100, 7.4, 5, 0.05, 132.0),  # 1 + 0.05 * 6.4
    (100, 1.0, 8, 0.05, 100.0),  # all NVLink: no slowdown
    (100, 30.0, 1, 0.05, 100.0),  # one GPU does not communicate
    (100, 7.4, 5, 0.0, 100.0),  # cost 0: the trace's durations
])
def test_run_time(duration, distance, gpus, cost, expected):
    assert run_time(duration, distance, gpus, cost) == pytest.approx(expected)


def test_spanning_job_runs_longer_with_a_communication_cost(cluster):
    # a0-a3 + b0: pairs inside a sum to 5+6+6+6+6+5 = 34, 4 pairs a-b at 10: d = 74 / 10 = 7.4
    result = simulate(cluster, _jobs([("j1", 0, 100, 5)]), make_policy("first-fit"), comm_cost=0.05)
    rec = result.records[0]
    assert rec.distance == pytest.approx(7.4)
    assert rec.end == pytest.approx(132.0)
    assert summarize(result)["run_time_overhead"] == pytest.approx(0.32)


def test_span_never_makes_a_job_that_fits_a_host_wait_for_one(cluster):
    # j1 takes a0-a2; then 3 GPUs are free (a3, b0, b1) but no host has 3: as needed, j2 spans
    # a and b at once; with span never it waits for j1's end.
    jobs = _jobs([("j1", 0, 10, 3), ("j2", 1, 5, 3)])
    as_needed = simulate(cluster, jobs, make_policy("first-fit"))
    never = simulate(cluster, jobs, make_policy("first-fit"), span="never")
    assert _starts(as_needed)["j2"] == (1, 6, ["a3", "b0", "b1"])
    assert _starts(never)["j2"] == (10, 15, ["a0", "a1", "a2"])


def test_metrics_of_the_fifo_case(cluster):
    """j1 0-10 on 4 GPUs; j2 waits 1-10, j3 waits 2-10 while 4 of 6 GPUs are held."""
    result = simulate(cluster, _jobs([("j1", 0, 10, 4), ("j2", 1, 5, 4), ("j3", 2, 3, 1)]), make_policy("first-fit"),
                      queue="fifo")
    m = summarize(result)
    expected = {
        "jobs": 3, "rejected": 0,
        "wait_mean_s": (0 + 9 + 8) / 3,
        "wait_p95_s": 8.9,  # numpy's linear quantile of [0, 8, 9]
        "wait_max_s": 9.0,
        "makespan_s": 15.0,
        "allocation_mean": 4 / 6,  # from the first (0) to the last (2) arrival
        "unallocated_while_waiting": 2 / 6,  # jobs wait from 1 to 10 while 2 of 6 GPUs are free
        "waiting_time_share": 9 / 15,
        "multi_gpu_jobs": 2,
        "distance_mean": 34 / 6,  # both 4-GPU jobs on all of a
        "one_host_share": 1.0,
        "spanning_jobs": 0,
        "run_time_overhead": 0.0,
    }
    for key, value in expected.items():
        assert m[key] == pytest.approx(value), key
    # 1-GPU: j3 waited 8; 4-GPU: j1 0 and j2 9 (p95 of [0, 9]: 8.55)
    assert m["wait_by_gpus"] == {"1": {"jobs": 1, "mean_s": 8.0, "p95_s": 8.0, "max_s": 8.0},
                                 "4": {"jobs": 2, "mean_s": 4.5, "p95_s": pytest.approx(8.55), "max_s": 9.0}}
    assert m["decisions"] == 3 and m["decision_ms_mean"] >= 0


def test_a_run_is_deterministic(cluster):
    jobs = _jobs([(f"j{i}", i * 0.5, 3 + (i * 7) % 5, 1 + i % 3) for i in range(40)])
    a = simulate(cluster, jobs, make_policy("random", seed=3))
    b = simulate(cluster, jobs, make_policy("random", seed=3))
    assert _starts(a) == _starts(b)
    assert not math.isnan(summarize(a)["wait_mean_s"])
