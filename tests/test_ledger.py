"""The ledger's behaviour, run twice: on a SQLite file and on a private PostgreSQL server."""

from __future__ import annotations

import itertools
import time
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import create_engine, func, insert, select

from airflow_hetero_gpu.core.cluster import build_cluster
from airflow_hetero_gpu.core.model import Gpu, GpuKey, PlanRequest
from airflow_hetero_gpu.core.topology import HostWiring
from airflow_hetero_gpu.ledger import Ledger, LedgerError, NoLiveReservation, ReservationConflict, TaskIdentity
from airflow_hetero_gpu.ledger.schema import evictions, reservation_gpus, reservations
from airflow_hetero_gpu.ledger.url import parse_url
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)

A100 = "NVIDIA A100-SXM4-80GB"
RTX = "NVIDIA GeForce RTX 4090"


def k(host: str, index: int) -> GpuKey:
    return GpuKey(host, index)


def split_host(n: int = 8) -> HostWiring:
    """GPUs 0-3 and 4-7 NVLinked among themselves, SYS across the halves."""
    half = n // 2
    links = {(a, b): ("NV12" if (a < half) == (b < half) else "SYS") for a, b in itertools.combinations(range(n), 2)}
    return HostWiring.from_links(range(n), links)


def make_cluster():
    """Four 8-GPU A100 hosts (h0..h3) and one 2-GPU RTX 4090 box (r0)."""
    gpus = [Gpu(f"h{h}", i, f"GPU-h{h}-{i}", A100, 81920, 0, 0.0) for h in range(4) for i in range(8)]
    gpus += [Gpu("r0", i, f"GPU-r0-{i}", RTX, 24564, 0, 0.0) for i in range(2)]
    wiring = {f"h{h}": split_host() for h in range(4)}
    wiring["r0"] = HostWiring.from_links(range(2), {(0, 1): "PHB"})
    return build_cluster(gpus, wiring)


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime(2025, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def cluster():
    return make_cluster()


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def ledger(ledger_db_url, clock):  # noqa: F811
    with Ledger.from_url(ledger_db_url, clock=clock) as led:
        yield led


def counts(url: str) -> tuple[int, int, int]:
    """(reservation rows, GPU rows, eviction rows), read straight from the database."""
    engine = create_engine(parse_url(url))
    try:
        with engine.connect() as conn:
            return tuple(conn.execute(select(func.count()).select_from(t)).scalar_one()
                         for t in (reservations, reservation_gpus, evictions))
    finally:
        engine.dispose()


A100_REQ = dict(gpu_type="A100*")


# --- reserve / renew / release / expire -----------------------------------------------------------
def test_reserve_claims_the_planned_gpus(ledger, cluster, clock):
    result = ledger.reserve("job-1", cluster, PlanRequest(4, **A100_REQ), lease_seconds=60,
                            identity={"dag_id": "train", "run_id": "r1", "task_id": "fit", "try_number": 1,
                                      "map_index": 3})
    assert result.decision is not None
    assert result.decision.keys == [k("h0", 0), k("h0", 1), k("h0", 2), k("h0", 3)]
    res = ledger.get("job-1")
    assert res.keys == result.decision.keys
    assert [g.uuid for g in res.gpus] == ["GPU-h0-0", "GPU-h0-1", "GPU-h0-2", "GPU-h0-3"]
    assert res.pool == A100 and res.gpu_count == 4
    assert res.score == result.decision.score.to_json()
    assert res.identity == TaskIdentity("train", "r1", "fit", try_number=1, map_index=3)
    assert res.to_json()["identity"]["map_index"] == 3
    assert res.expires_at == clock.now + timedelta(seconds=60)
    assert ledger.reserved_map() == {key: "job-1" for key in result.decision.keys}
    # the next job plans around it
    second = ledger.reserve("job-2", cluster, PlanRequest(4, **A100_REQ))
    assert set(second.decision.keys).isdisjoint(result.decision.keys)
    assert [r.job_id for r in ledger.live_reservations()] == ["job-1", "job-2"]


def test_renew_extends_the_lease(ledger, cluster, clock):
    ledger.reserve("job", cluster, PlanRequest(2), lease_seconds=10)
    clock.advance(8)
    res = ledger.renew("job", 10)
    assert res.expires_at == clock.now + timedelta(seconds=10)
    assert res.renewed_at == clock.now
    clock.advance(8)  # 16 s after the reservation: alive thanks to the renewal
    assert ledger.get("job") is not None
    assert ledger.expire() == []


def test_release_is_idempotent(ledger, ledger_db_url, cluster):  # noqa: F811
    ledger.reserve("job", cluster, PlanRequest(3))
    assert ledger.release("job") is True
    assert ledger.release("job") is False
    assert ledger.release("never-existed") is False
    assert ledger.reserved_map() == {}
    assert counts(ledger_db_url)[:2] == (0, 0)


def test_expired_lease_frees_the_gpus(ledger, ledger_db_url, cluster, clock):  # noqa: F811
    ledger.reserve("dead", cluster, PlanRequest(32, **A100_REQ), lease_seconds=5)
    assert ledger.reserve("next", cluster, PlanRequest(1, **A100_REQ)).decision is None
    clock.advance(5)
    assert ledger.get("dead") is None  # expired: no longer live, even before the sweep
    assert ledger.reserved_map() == {}
    with pytest.raises(NoLiveReservation, match="'dead'"):
        ledger.renew("dead", 5)
    # the holder is gone; the next reserve sweeps it and gets the GPUs
    assert ledger.reserve("next", cluster, PlanRequest(32, **A100_REQ)).decision is not None
    assert counts(ledger_db_url)[:2] == (1, 32)


def test_expire_returns_the_freed_jobs(ledger, cluster, clock):
    ledger.reserve("a", cluster, PlanRequest(1), lease_seconds=5)
    ledger.reserve("b", cluster, PlanRequest(1), lease_seconds=50)
    clock.advance(10)
    assert ledger.expire() == ["a"]
    assert ledger.expire() == []
    assert [r.job_id for r in ledger.live_reservations()] == ["b"]


def test_lease_runs_on_the_database_clock(ledger_db_url, cluster):  # noqa: F811
    """The reservation is live until its lease has run out on the database's clock, and not a
    moment longer: waited for, not slept on (a loaded machine may take longer than a lease
    between two calls)."""
    with Ledger.from_url(ledger_db_url) as led:  # real clock: PostgreSQL's, or this machine's
        started = time.monotonic()
        assert led.reserve("short", cluster, PlanRequest(1), lease_seconds=1.0).decision is not None
        while led.get("short") is not None:
            assert time.monotonic() - started < 60, "the lease never ran out"
            time.sleep(0.05)
        assert time.monotonic() - started >= 0.95  # it did not run out early
        with pytest.raises(NoLiveReservation):
            led.renew("short", 1)
        assert led.release("short") is False


def test_renew_after_release_tells_the_holder(ledger, cluster):
    ledger.reserve("job", cluster, PlanRequest(1))
    ledger.release("job")
    with pytest.raises(NoLiveReservation, match="cannot renew job 'job'"):
        ledger.renew("job")


def test_reserving_a_live_job_again_returns_it(ledger, ledger_db_url, cluster, clock):  # noqa: F811
    first = ledger.reserve("job", cluster, PlanRequest(4), lease_seconds=10, identity={"try_number": 1})
    clock.advance(5)
    again = ledger.reserve("job", cluster, PlanRequest(4), lease_seconds=10, identity={"try_number": 2})
    assert again.decision.keys == first.decision.keys
    assert again.decision.score.to_json() == first.decision.score.to_json()
    assert [g.uuid for g in again.decision.gpus] == [g.uuid for g in first.decision.gpus]
    res = ledger.get("job")
    assert res.identity.try_number == 2
    assert res.expires_at == clock.now + timedelta(seconds=10)  # renewed
    assert counts(ledger_db_url)[:2] == (1, 4)
    with pytest.raises(ReservationConflict, match="different request"):
        ledger.reserve("job", cluster, PlanRequest(2))


# --- all or nothing --------------------------------------------------------------------------------
def test_a_request_that_does_not_fit_writes_nothing(ledger, ledger_db_url, cluster):  # noqa: F811
    for i in range(7):
        assert ledger.reserve(f"fill-{i}", cluster, PlanRequest(4, **A100_REQ)).decision is not None
    before = counts(ledger_db_url)
    assert before[:2] == (7, 28)
    for job, req in [("too-big", PlanRequest(5, **A100_REQ)), ("no-such-card", PlanRequest(1, gpu_type="H100")),
                     ("too-many-rtx", PlanRequest(3, gpu_type="RTX 4090"))]:
        result = ledger.reserve(job, cluster, req)
        assert result.decision is None
        assert result.pools and all(p.reason for p in result.pools)
        assert ledger.get(job) is None
    assert counts(ledger_db_url) == before
    # exactly what is left still fits
    assert ledger.reserve("rest", cluster, PlanRequest(4, **A100_REQ)).decision is not None


def test_the_database_refuses_a_gpu_held_twice(ledger, ledger_db_url, cluster):  # noqa: F811
    """Even a buggy writer cannot put one GPU in two reservations: (host, gpu_index) is the key."""
    ledger.reserve("a", cluster, PlanRequest(1, **A100_REQ))
    held = ledger.get("a").gpus[0]
    from airflow_hetero_gpu.ledger.db import make_engine, write_transaction

    engine = make_engine(parse_url(ledger_db_url))  # a writer of this release, past the planner
    now = datetime.now(timezone.utc)
    try:
        with pytest.raises(Exception) as err, write_transaction(engine) as conn:
            conn.execute(insert(reservations).values(job_id="b", pool=A100, gpu_count=1, score={}, created_at=now,
                                                     renewed_at=now, expires_at=now + timedelta(hours=1)))
            conn.execute(insert(reservation_gpus).values(host=held.host, gpu_index=held.index, job_id="b", slot=0))
        assert "IntegrityError" in type(err.value).__name__ and "reservation_gpus" in str(err.value)
    finally:
        engine.dispose()
    assert counts(ledger_db_url)[:2] == (1, 1)


# --- evictions (S11) ---------------------------------------------------------------------------
def test_evicted_gpus_leave_every_pool(ledger, cluster):
    ev = ledger.evict(("h0", 1), "GPU-h0-1", ["ecc"])
    assert (ev.key, ev.reasons, ev.healthy_checks) == (k("h0", 1), ("ecc",), 0)
    assert ledger.evicted_map() == {k("h0", 1): ("ecc",)}
    result = ledger.reserve("job", cluster, PlanRequest(4, **A100_REQ))
    assert k("h0", 1) not in result.decision.keys
    assert ledger.reserve("all", cluster, PlanRequest(28, **A100_REQ)).decision is None  # 31 - 4 = 27 left
    assert ledger.reserve("all", cluster, PlanRequest(27, **A100_REQ)).decision is not None
    assert ledger.plan(cluster, PlanRequest(1, **A100_REQ)).decision is None


def test_readmission_needs_consecutive_healthy_checks(ledger, cluster):
    key = k("h2", 5)
    ledger.evict(key, "GPU-h2-5", "temperature")
    assert ledger.record_check(key, True, 3).healthy_checks == 1
    assert ledger.record_check(key, True, 3).healthy_checks == 2
    bad = ledger.record_check(key, False, 3, reasons=["xid-79"])  # a bad check starts the count again
    assert bad.healthy_checks == 0 and bad.reasons == ("temperature", "xid-79")
    assert ledger.record_check(key, True, 3).healthy_checks == 1
    assert ledger.record_check(key, True, 3).healthy_checks == 2
    assert key in ledger.evicted_map()
    assert ledger.record_check(key, True, 3) is None  # third in a row: back in
    assert ledger.evicted_map() == {}
    assert ledger.record_check(key, True, 3) is None  # healthy and not evicted: nothing happens
    assert ledger.evictions() == []
    ev = ledger.record_check(key, False, reasons=["ecc"])  # an unhealthy check evicts
    assert ev.reasons == ("ecc",) and ledger.evicted_map() == {key: ("ecc",)}
    assert ledger.record_check(k("h3", 0), False).reasons == ("abnormal",)
    with pytest.raises(LedgerError, match="readmit_after"):
        ledger.record_check(key, True, 0)


def test_readmit_after_one_check(ledger):
    ledger.evict(("h0", 0), None, ["lost"])
    assert ledger.record_check(("h0", 0), True, readmit_after=1) is None


def test_uncordon_one_gpu_or_a_whole_host(ledger):
    for key in [("h1", 0), ("h1", 3), ("h2", 5)]:
        ledger.evict(key, None, ["unreachable"])
    assert ledger.uncordon("h1", 3) == [k("h1", 3)]
    assert ledger.uncordon("h1", 3) == []
    ledger.evict(("h1", 7), None, ["ecc"])
    assert ledger.uncordon("h1") == [k("h1", 0), k("h1", 7)]
    assert ledger.uncordon("h9") == []
    assert list(ledger.evicted_map()) == [k("h2", 5)]
    ev = ledger.evictions()[0]
    assert (ev.host, ev.index, ev.reasons) == ("h2", 5, ("unreachable",))


def test_evicting_twice_merges_reasons_and_keeps_the_time(ledger, clock):
    first = ledger.evict(("h0", 2), "GPU-h0-2", ["ecc"])
    clock.advance(30)
    again = ledger.evict(("h0", 2), None, ["ecc", "retired-pages-pending"])
    assert again.reasons == ("ecc", "retired-pages-pending")
    assert again.evicted_at == first.evicted_at and again.checked_at == clock.now
    assert again.uuid == "GPU-h0-2"


# --- replacement (S12) -------------------------------------------------------------------------------
def test_replace_swaps_in_the_nearest_free_gpu(ledger, cluster):
    ledger.reserve("job", cluster, PlanRequest(4, **A100_REQ))  # h0:0-3 (one NVLink island)
    new = ledger.replace("job", ("h0", 1), cluster, reasons=["xid-79"])
    # h0:4-7 sit across SYS from the rest; still nearer than any other host (10)
    assert new == k("h0", 4)
    res = ledger.get("job")
    assert res.keys == [k("h0", 0), k("h0", 4), k("h0", 2), k("h0", 3)]  # same slot
    assert res.gpus[1].uuid == "GPU-h0-4"
    assert ledger.evicted_map() == {k("h0", 1): ("xid-79",)}
    reserved = ledger.reserved_map()
    assert k("h0", 1) not in reserved and reserved[k("h0", 4)] == "job"
    # the evicted GPU is not handed out again
    other = ledger.reserve("other", cluster, PlanRequest(27, **A100_REQ))
    assert k("h0", 1) not in other.decision.keys


def test_replace_prefers_other_hosts_when_the_own_is_full(ledger, cluster):
    ledger.reserve("job", cluster, PlanRequest(4, **A100_REQ))  # h0:0-3
    ledger.reserve("neighbour", cluster, PlanRequest(4, **A100_REQ))  # h0:4-7 (best fit keeps h1-h3 whole)
    assert ledger.get("neighbour").hosts == ["h0"]
    new = ledger.replace("job", ("h0", 2), cluster)
    assert new == k("h1", 0)
    assert ledger.evicted_map() == {k("h0", 2): ("abnormal",)}


def test_replace_without_a_candidate_changes_nothing(ledger, ledger_db_url, cluster):  # noqa: F811
    ledger.reserve("rtx", cluster, PlanRequest(2, gpu_type="RTX 4090"))  # the whole RTX pool
    before = ledger.get("rtx")
    assert ledger.replace("rtx", ("r0", 0), cluster, reasons=["ecc"]) is None  # A100s are another pool
    assert ledger.get("rtx") == before
    assert ledger.evicted_map() == {}
    assert counts(ledger_db_url) == (1, 2, 0)


def test_replace_checks_its_arguments(ledger, cluster):
    ledger.reserve("job", cluster, PlanRequest(2, **A100_REQ))
    with pytest.raises(LedgerError, match=r"h3:7 is not held by job 'job'"):
        ledger.replace("job", ("h3", 7), cluster)
    with pytest.raises(NoLiveReservation, match="'gone'"):
        ledger.replace("gone", ("h0", 0), cluster)
    with pytest.raises(LedgerError, match="not in the cluster inventory"):
        ledger.replace("job", ("nowhere", 0), cluster)


def test_replace_hook_runs_inside_the_transaction(ledger_db_url, cluster):  # noqa: F811
    seen = []

    def hook(action, job_id):
        seen.append((action, job_id))
        if action == "replace":
            raise RuntimeError("died before commit")

    with Ledger.from_url(ledger_db_url, before_commit=hook) as led:
        led.reserve("job", cluster, PlanRequest(2, **A100_REQ))
        before = led.get("job")
        with pytest.raises(RuntimeError):
            led.replace("job", ("h0", 0), cluster)
        assert led.get("job") == before and led.evicted_map() == {}  # rolled back whole
    assert seen == [("reserve", "job"), ("replace", "job")]


# --- argument checks -----------------------------------------------------------------------------
@pytest.mark.parametrize("call, message", [
    (lambda led, c: led.reserve("", c, PlanRequest(1)), "job id"),
    (lambda led, c: led.reserve("x" * 251, c, PlanRequest(1)), "invalid job id .*: use 1-128"),
    (lambda led, c: led.reserve("j", c, PlanRequest(1), lease_seconds=0), "lease_seconds"),
    (lambda led, c: led.reserve("j", c, PlanRequest(1), lease_seconds=float("nan")), "lease_seconds"),
    (lambda led, c: led.reserve("j", c, PlanRequest(1), identity={"dag": "x"}), "unknown key 'dag'"),
    (lambda led, c: led.reserve("j", c, PlanRequest(1), identity={"try_number": "1"}), "try_number must be"),
    (lambda led, c: led.reserve("j", c, PlanRequest(1), identity={"dag_id": 7}), "dag_id must be"),
    (lambda led, c: led.evict(("h0", -1)), "index >= 0"),
    (lambda led, c: led.evict("h0"), "expected \\(host, index\\)"),
    (lambda led, c: led.uncordon(""), "host name"),
])
def test_bad_arguments_are_one_line_errors(ledger, cluster, call, message):
    with pytest.raises(LedgerError, match=message) as err:
        call(ledger, cluster)
    assert "\n" not in str(err.value)
