"""Drained hosts in the ledger (SQLite and PostgreSQL): no new placement or claim there, the
running jobs finish (or end at the deadline), the reason everywhere, bad input changes nothing."""

from __future__ import annotations

import json

import pytest

from airflow_hetero_gpu.cli.app import main
from airflow_hetero_gpu.collect.freshness import FreshInventory
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.core.occupancy import pool_counts
from airflow_hetero_gpu.ledger import Ledger, LedgerError
from airflow_hetero_gpu.ledger.errors import NoLiveReservation
from airflow_hetero_gpu.ledger.inventory import HostRecord
from airflow_hetero_gpu.testing.captures import host_files
from airflow_hetero_gpu.testing.demo import small_hosts
from ledger_clock import Clock
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)


def _filled(url: str, clock: Clock | None = None) -> Ledger:
    led = Ledger.from_url(url, clock=clock)
    led.store_collection([HostRecord(s.name, True, host_files(s)) for s in small_hosts(2, gpus=2)],
                         collector="test collector")
    return led


def _cluster(led: Ledger):
    return FreshInventory(led.inventory(), float("inf")).cluster()


def _hosts(result) -> set[str]:
    return {g.host for g in result.decision.gpus}


def test_a_drained_host_gets_no_new_placement_and_the_reason_says_why(ledger_db_url):  # noqa: F811
    with _filled(ledger_db_url) as led:
        cluster = _cluster(led)
        (d,) = led.drain(["node01"], "driver upgrade to 580")
        assert (d.host, d.reason, d.deadline) == ("node01", "driver upgrade to 580", None)
        assert _hosts(led.plan(cluster, PlanRequest(2))) == {"node02"}
        led.drain(["node02"], "rack power work")
        result = led.plan(cluster, PlanRequest(2))
        assert result.decision is None
        (pool,) = result.pools
        assert "4 on drained hosts (node01 drained: driver upgrade to 580, node02 drained: rack power work)" \
            in pool.reason
        assert led.reserve("j", cluster, PlanRequest(1)).decision is None  # the claim point sees it too
        (counts,) = pool_counts(cluster, led.reserved_map(), led.evicted_map(), drained=led.drained_map())
        assert (counts.available, counts.busy, counts.drained, counts.healthy) == (0, 0, 4, 4)
        assert led.undrain(["node01", "node02"]) == ["node01", "node02"]
        assert led.reserve("j", cluster, PlanRequest(4)).decision is not None


def test_a_job_on_a_drained_host_finishes_and_past_the_deadline_is_ended(ledger_db_url):  # noqa: F811
    clock = Clock()
    with _filled(ledger_db_url, clock) as led:
        cluster = _cluster(led)
        assert _hosts(led.reserve("runs-on", cluster, PlanRequest(2), lease_seconds=3600)) == {"node01"}
        led.drain(["node01"], "maintenance")
        for _ in range(3):  # writes and collections come and go: the job keeps its GPUs
            clock.tick(600)
            led.renew("runs-on", 3600)
            led.store_collection([HostRecord("node01", True, host_files(small_hosts(1, gpus=2)[0]))],
                                 collector="test collector")
        assert led.get("runs-on") is not None
        led.release("runs-on")
        # with a deadline: the job still there when it passes is ended (its reservation released)
        assert _hosts(led.reserve("late", cluster, PlanRequest(2), lease_seconds=3600)) == {"node02"}
        led.drain(["node02"], "firmware", deadline_s=1800)
        clock.tick(1799)
        led.renew("late", 3600)
        clock.tick(2)
        with pytest.raises(NoLiveReservation):
            led.renew("late", 3600)
        drains = {d.host: d for d in led.drains()}
        assert drains["node02"].ended == ("late",) and drains["node01"].ended == ()


def test_a_tasks_job_past_the_deadline_is_preempted_and_resumes_elsewhere(ledger_db_url):  # noqa: F811
    """A job a task holds is not cut off at the deadline: its reservation is marked preempting for
    the drain (the operator then signals it, waits for its checkpoint and requeues it), and once it
    has stopped it is admitted again on a host that is not drained."""
    from airflow_hetero_gpu.ledger.records import TaskIdentity

    clock = Clock()
    with _filled(ledger_db_url, clock) as led:
        cluster = _cluster(led)
        ident = TaskIdentity("retrain", "manual__1", "train", 1, None)
        assert _hosts(led.reserve("task-job", cluster, PlanRequest(2), lease_seconds=3600, identity=ident,
                                  priority=1, preemptible=True)) == {"node01"}
        led.drain(["node01"], "firmware", deadline_s=600)
        clock.tick(601)
        held = led.renew("task-job", 3600)  # still its GPUs: it stops on its own terms
        assert held.preempting["drain"] == "node01" and "deadline passed" in held.preempting["reason"]
        (record,) = [p for p in led.preemptions() if p["victim"] == "task-job"]
        assert record["state"] == "in progress" and record["preemptor"] == "drain of node01"
        clock.tick(5)
        assert led.renew("task-job", 3600).preempting is not None  # marked once, not again
        assert len([p for p in led.preemptions() if p["victim"] == "task-job"]) == 1
        led.finish_preemption("task-job", outcome="exited", exited_after_s=4.0, checkpoint="epoch 3")
        (back,) = [e for e in led.queue() if e.job_id == "task-job"]
        assert back.state == "admitted", back
        assert {k.host for k in led.get("task-job").keys} == {"node02"}
        assert {d.host: d for d in led.drains()}["node01"].ended == ("task-job",)


def test_the_queue_waits_for_a_drained_fleet_and_the_undrain_admits(ledger_db_url):  # noqa: F811
    with _filled(ledger_db_url) as led:
        led.drain(["node01", "node02"], "maintenance window")
        entry = led.enqueue("queued", PlanRequest(2))
        assert entry.state == "waiting" and "drained: maintenance window" in entry.reason, entry
        led.undrain(["node02"])
        (back,) = [e for e in led.queue() if e.job_id == "queued"]
        assert back.state == "admitted"
        assert {k.host for k in led.get("queued").keys} == {"node02"}


def test_bad_input_is_one_line_and_changes_nothing(ledger_db_url):  # noqa: F811
    with _filled(ledger_db_url) as led:
        cluster = _cluster(led)
        with pytest.raises(LedgerError, match=r"cannot drain host 'node09': the fleet's inventory has no such "
                                              r"host \(it has: node01, node02\)"):
            led.drain(["node01", "node09"], "maintenance")
        for reason in ("", "   "):
            with pytest.raises(LedgerError, match="reason: say why"):
                led.drain(["node01"], reason)
        with pytest.raises(LedgerError, match="cannot undrain host 'node09'"):
            led.undrain(["node09"])
        assert led.drains() == []
        led.reserve("holder", cluster, PlanRequest(1))
        holder_host = led.get("holder").keys[0].host
        with pytest.raises(LedgerError, match=f"cannot remove host '{holder_host}': job 'holder' holds its GPUs"):
            led.remove_host(holder_host)
        assert set(led.inventory().hosts) == {"node01", "node02"}
        other = ({"node01", "node02"} - {holder_host}).pop()
        led.drain([other], "decommissioned")
        led.remove_host(other)
        assert set(led.inventory().hosts) == {holder_host} and led.drains() == []


def test_the_command_line(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    _filled(url).close()
    assert main(["drain", "node01", "--ledger", url, "--reason", "driver upgrade", "--deadline", "2h"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("node01 drained: driver upgrade (since 0s, by "), out
    assert "running jobs end in 1h59m" in out or "running jobs end in 2h00m" in out, out
    assert main(["pools", "--ledger", url]) == 0
    out = capsys.readouterr().out
    assert "node01 drained: driver upgrade" in out
    assert main(["plan", "--ledger", url, "--gpus", "4"]) == 3
    assert "2 on drained hosts (node01 drained: driver upgrade)" in capsys.readouterr().out
    assert main(["queue", "--ledger", url]) == 0 and "node01 drained: driver upgrade" in capsys.readouterr().out
    assert main(["hosts", "drained", "--ledger", url]) == 0 and "node01 drained" in capsys.readouterr().out
    for argv, message in [
        (["drain", "node09", "--reason", "x"], "hetero-gpu drain: error: cannot drain host 'node09': the fleet's "
                                               "inventory has no such host (it has: node01, node02)"),
        (["drain", "node02", "--reason", ""], "hetero-gpu drain: error: reason: say why the hosts are drained"),
        (["drain", "node02", "--reason", "x", "--deadline", "soon"], "argument --deadline: expected a positive "
                                                                     "duration such as 90s, 30m, 2h or 1d, got 'soon'"),
        (["drain", "node02", "--reason", "x", "--deadline", "1e300"], "argument --deadline: expected a duration of "
                                                                      "at most 365 days, got '1e300'"),
        (["drain", "node02", "--reason", "x", "--deadline", "400d"], "at most 365 days, got '400d'"),
        (["hosts", "remove", "node09"], "hetero-gpu hosts: error: cannot remove host 'node09'"),
    ]:
        assert _exit_status([*argv, "--ledger", url]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    with Ledger.open_existing(url) as led:
        assert [d.host for d in led.drains()] == ["node01"]
    assert main(["undrain", "node01", "node02", "--ledger", url]) == 0
    assert capsys.readouterr().out == "node01 undrained: placeable again\nnode02 was not drained\n"
    assert main(["plan", "--ledger", url, "--gpus", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decision"] is not None


def _exit_status(argv) -> int:
    """``main``'s exit status, argparse's usage errors (SystemExit) included."""
    try:
        return main(argv)
    except SystemExit as done:
        return int(done.code)


@pytest.mark.parametrize("deadline", [1e300, float("inf"), float("nan"), 366 * 86400.0])
def test_a_deadline_past_365_days_is_refused_by_the_ledger_too(tmp_path, deadline):
    from airflow_hetero_gpu.ledger.errors import LedgerError

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with _filled(url) as led:
        with pytest.raises(LedgerError, match=r"^deadline: expected a positive number of seconds, at most 31536000"):
            led.drain(["node01"], "upgrade", deadline_s=deadline)
        assert led.drains() == []
