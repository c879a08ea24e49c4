"""A smaller fleet day (airflow_hetero_gpu/testing/fleet_day.py, the engine of
``benchmarks/fleet_day.py``): 200 emulated hosts of 8 GPUs, PostgreSQL, Redis, Airflow with the
CeleryExecutor (api-server, scheduler, dag-processor, triggerer, two Celery workers), the health
watch every 20 s, three minutes of training runs through the REST API (1-16 GPUs, three teams with
quotas, two priorities, preemption on) and four faults: an Xid 79 and an uncorrectable ECC error
on GPUs jobs hold, a host that stops answering, the same host coming back.

Invariants: every run ends and succeeds (a job whose GPU was faulted gets a replacement and
finishes on it; a run launched on the host that went down before the watch evicted it fails
that try and succeeds on its retry, which waits until the eviction); no GPU was ever used by two
jobs' processes at once nor held by two reservations, no process ran outside its job's
reservation; nothing is left in the ledger (reservations, queue entries) or on the hosts
(processes); each fault became an eviction (the host's return a readmission); the health watch
ran all along. Every wait ends on an event (a run state, a ledger row); the timeouts are safety
nets.

Quotas and preemption act on the day's contended corner (testing/fleet_day_contention.py): two
RTX 4090 hosts open, the others drained, research borrowing beyond its quota of that card and
prod reclaiming its own: a preemption record closed with its lost work, the victim run again to
success, intern never above its quota plus its borrowing limit.
"""

from __future__ import annotations

import pytest

pytest.importorskip("celery", reason="could not import celery (apache-airflow-providers-celery, the test extra)")
pytest.importorskip("airflow.providers.celery", reason="could not import apache-airflow-providers-celery (the test extra)")
pytest.importorskip("httpx", reason="could not import httpx")
pytest.importorskip("psutil", reason="could not import psutil")

from airflow_hetero_gpu.testing.fleet_day import DayConfig, run_day  # noqa: E402
from airflow_hetero_gpu.testing.fleet_day_contention import CARD, OPENING  # noqa: E402
from airflow_hetero_gpu.testing.fleet_day_report import overlaps, render  # noqa: E402
from airflow_hetero_gpu.testing.postgres import PostgresServer, PostgresUnavailable  # noqa: E402
from airflow_hetero_gpu.testing.redis_server import RedisUnavailable, find_redis_server  # noqa: E402

# A whole deployment and 200 hosts; mostly waiting on its stream's real time (3 min), so it runs
# beside the other tests, first (tests/conftest.py orders the longest modules first).
pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    try:
        PostgresServer()
    except PostgresUnavailable as err:
        pytest.skip(str(err))
    try:
        find_redis_server()
    except RedisUnavailable as err:
        pytest.skip(str(err))
    cfg = DayConfig(hosts=200, minutes=3, rate=6, job_seconds=(15, 40), watch_interval=20, concurrency=6,
                    root=tmp_path_factory.mktemp("fleet-day"), keep=True, settle_timeout=1200,
                    contended_hosts=2, lease_seconds=60)
    result = run_day(cfg)
    print(render(result))
    return result


def test_every_run_ends_and_succeeds(day):
    runs = day["runs"]
    assert runs["triggered"] == 18 + len(OPENING)
    assert runs["states"] == {"success": runs["triggered"]}, runs["not succeeded"]
    assert day["task_start_s"]["all"]["n"] == runs["triggered"], day["task_start_s"]["not started"]
    assert {"placed at once", "waited in the queue"} <= set(day["task_start_s"])
    starts = day["task_start_s"]  # those placed at once, split by the health watch's checks
    assert (starts["placed at once, during a check"]["n"] + starts["placed at once, between checks"]["n"]
            == starts["placed at once"]["n"])


def test_no_gpu_held_twice_nothing_leaked_no_orphan(day):
    held = day["held_twice"]
    assert held["sampler_error"] is None
    assert held["samples"] >= 20
    assert (held["processes"], held["reservations"], held["outside_reservation"]) == (0, 0, 0), held["examples"]
    assert day["runs"]["max_live_jobs"] >= 2  # the sampler saw jobs running side by side
    assert day["leaked"] == {"reservations": 0, "queue_entries": 0}
    assert day["orphans"] == 0


def test_each_fault_became_an_eviction(day):
    faults = {f["kind"]: f for f in day["faults"]}
    assert set(faults) == {"xid79", "ecc", "host_down", "host_back"}
    for kind, f in faults.items():
        assert f["seconds"] is not None, f"{kind} on {f['host']} never recorded in the ledger: {f}"
        if kind in ("xid79", "ecc") and f["held_at_eviction"]:
            assert f["replaced"], f"{kind}: the GPU of job {f['job']} was not replaced: {f}"
    # a GPU fault hits a job with a check's time left: at least one is still running when evicted
    assert faults["xid79"]["held_at_eviction"] or faults["ecc"]["held_at_eviction"], faults
    # within two checks (a GPU fault) or the unreachable threshold plus one (the host), plus a check's time
    assert faults["xid79"]["seconds"] <= 2 * 20 + 30 and faults["ecc"]["seconds"] <= 2 * 20 + 30
    assert faults["host_down"]["seconds"] <= 3 * 20 + 60


def test_the_health_watch_ran_all_day(day):
    checks = day["health_checks"]
    assert checks["watch_state"] == "deferred"  # still watching when the day ended
    stream = day["runs"]["stream_seconds"] + day["runs"]["settle_seconds"]
    assert checks["n"] >= stream / 20 / 2, checks
    assert day["admission"]["passes"] > 0, day["admission"]


def test_quotas_and_preemption_acted_on_the_contended_card(day):
    jobs = day["runs"]["jobs"]
    research = {j for j, info in jobs.items() if info["team"] == "research" and info["gpu_type"] == CARD}
    prod = {j for j, info in jobs.items() if info["team"] == "prod" and info["gpu_type"] == CARD}
    pre = day["preemptions"]
    assert [p for p in pre if p["state"] == "in progress"] == [], pre  # every record closed
    # prod's job within its quota of the card took it back from research, which borrowed it
    reclaims = [p for p in pre if p["preemptor"] in prod and p["victim"] in research
                and p["reason"].endswith("reclaim of prod's quota")]
    assert reclaims, (pre, {j: jobs[j] for j in sorted(research | prod)})
    assert all(p["state"] in ("exited", "killed") and p["lost_gpu_s"] > 0 for p in reclaims), reclaims
    assert all(jobs[p["victim"]]["state"] == "success" for p in reclaims)  # run again, to the end
    teams = day["teams"]
    assert teams["research"]["peak"]["borrowed"] >= 8, teams  # 16 of the card on a quota of 8
    assert teams["research"]["decayed_borrowed_gpu_s"] > 0, teams  # its fair share remembers it
    assert teams["intern"]["peak"]["in_use"] <= 8 + 8, teams  # quota + borrowing limit


def test_a_start_counts_as_during_a_check_when_their_seconds_overlap():
    checks = [(100.0, 106.0), (160.0, 165.5)]
    assert overlaps(99.0, 101.0, checks) and overlaps(104.0, 110.0, checks) and overlaps(150.0, 170.0, checks)
    assert not overlaps(106.5, 110.0, checks) and not overlaps(90.0, 100.0, checks)
    assert not overlaps(101.0, 103.0, [])
