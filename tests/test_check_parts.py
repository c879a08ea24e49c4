"""A health check records its hosts as they answer (healthcheck/parts.py): a fault read from one
host is an eviction in the ledger while another host of the same check has not answered yet."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import pytest

from airflow_hetero_gpu.collect.clients import paramiko_client_factory
from airflow_hetero_gpu.collect.fleet import SshCollector
from airflow_hetero_gpu.collect.ssh import CollectReport, HostResult
from airflow_hetero_gpu.collect.targets import parse_hosts_file
from airflow_hetero_gpu.healthcheck import HealthWatch, WatchSpec
from airflow_hetero_gpu.healthcheck.parts import collect_in_parts
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import embedded_cluster  # noqa: F401

WAIT = 60.0  # a safety net only: every wait below ends on an event


def _result(name: str) -> HostResult:
    return HostResult(host=name, target=name, ok=False, reason="emulated")


def _scripted_collect(names, hold: dict[str, threading.Event], fail_after: str | None = None):
    """A collection that answers ``names`` in order, each after its event in ``hold`` is set."""
    def collect(on_host):
        results = []
        for name in names:
            if name in hold:
                assert hold[name].wait(WAIT), f"{name} was never released"
            result = _result(name)
            on_host(result)
            results.append(result)
            if name == fail_after:
                raise RuntimeError(f"collection broke after {name}")
        return CollectReport(out_dir=None, hosts=results)  # type: ignore[arg-type]
    return collect


def test_hosts_that_answered_are_recorded_before_a_slow_host_answers():
    recorded_a = threading.Event()
    calls = []

    def record(batch, parts):
        calls.append(([h.host for h in batch], len(parts)))
        if [h.host for h in batch] == ["a"]:
            recorded_a.set()
        return f"part {len(parts)}"

    # "b" answers only once "a" is in a part of its own: the check did not wait for the end
    report, parts = collect_in_parts(_scripted_collect(["a", "b", "c"], {"b": recorded_a}), record, window_s=0.05)
    assert calls[0] == (["a"], 0)
    assert [h for batch, _ in calls for h in batch] == ["a", "b", "c"]
    assert parts == [f"part {i}" for i in range(len(calls))] and len(parts) >= 2
    assert [h.host for h in report.hosts] == ["a", "b", "c"]


def test_a_check_where_no_host_answered_is_one_empty_part():
    calls = []
    report, parts = collect_in_parts(lambda on_host: CollectReport(out_dir=None, hosts=[]),  # type: ignore[arg-type]
                                     lambda batch, parts: calls.append(list(batch)) or "empty")
    assert calls == [[]] and parts == ["empty"] and report.hosts == []


def test_a_recording_error_stops_recording_waits_for_the_collection_and_is_raised():
    ended = threading.Event()
    calls = []

    def collect(on_host):
        try:
            return _scripted_collect(["a", "b", "c"], {"b": first_recorded})(on_host)
        finally:
            ended.set()

    first_recorded = threading.Event()

    def record(batch, parts):
        calls.append([h.host for h in batch])
        first_recorded.set()
        raise ValueError("ledger is read-only")

    with pytest.raises(ValueError, match="read-only"):
        collect_in_parts(collect, record, window_s=0.05)
    assert ended.is_set()  # the collection ran to its end before the error came out
    assert calls == [["a"]]  # nothing recorded after the failure


def test_a_collection_error_is_raised_after_what_answered_is_recorded():
    calls = []
    with pytest.raises(RuntimeError, match="broke after b"):
        collect_in_parts(_scripted_collect(["a", "b", "c"], {}, fail_after="b"),
                         lambda batch, parts: calls.append([h.host for h in batch]) or "p", window_s=0.05)
    assert [h for batch in calls for h in batch] == ["a", "b"]


def test_window_must_be_positive():
    with pytest.raises(ValueError, match="window_s"):
        collect_in_parts(lambda on_host: None, lambda b, p: None, window_s=0)  # type: ignore[arg-type,return-value]


def _watch(embedded_cluster, tmp_path, hosts: int):
    """(the emulated cluster of ``hosts`` 1-GPU hosts, a ledger URL, a watch of it in parts of 0.2 s)."""
    cluster = embedded_cluster(small_hosts(hosts, gpus=1))
    targets = parse_hosts_file(cluster.write_hosts_file(tmp_path / "hosts"))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    factory = paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)
    collector = SshCollector(targets, factory, connect_timeout=30, command_timeout=300, max_parallel=8)
    return cluster, url, HealthWatch(WatchSpec(stop_when_idle=False), collector, url, part_window=0.2)


def test_a_fault_is_an_eviction_in_the_ledger_while_a_stuck_host_holds_the_check(embedded_cluster, tmp_path):
    cluster, url, watch = _watch(embedded_cluster, tmp_path, 6)
    first = watch.check()
    assert (first.collected, first.failed, first.evicted) == (6, 0, [])

    release = tmp_path / "release-node03"
    cluster.set_state("node03", nvidia_smi_wait_for=str(release))  # its driver hangs until released
    cluster.update_gpu("node05", 0, ecc_uncorrected_volatile=3)
    check_began = datetime.now(timezone.utc)
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(report=watch.check()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT
        evicted = {}
        while time.monotonic() < deadline:
            with Ledger.from_url(url) as ledger:
                evicted = ledger.evicted_map()
            if ("node05", 0) in evicted:
                break
            time.sleep(0.05)
        assert evicted.get(("node05", 0)) == ("ecc",), evicted
        # node03 has not answered (its nvidia-smi waits for the file): the check is still running
        assert thread.is_alive()
        with Ledger.from_url(url) as ledger:
            stuck = ledger.inventory(["node03"]).hosts["node03"]
        assert stuck.collected_at < check_began
    finally:
        release.write_text("")
    thread.join(WAIT)
    assert not thread.is_alive()
    report = outcome["report"]
    assert (report.collected, report.failed) == (6, 0)
    assert [(e["host"], e["index"], e["reasons"]) for e in report.evicted] == [("node05", 0, ["ecc"])]
    assert sorted(st.key.host for st in report.steps) == [f"node{i:02d}" for i in range(1, 7)]
    assert sum(p["gpus"] for p in report.pools) == 6  # the report covers the whole fleet
    with Ledger.from_url(url) as ledger:
        collections = ledger.collections(check_began)
        assert ledger.inventory(["node03"]).hosts["node03"].collected_at > check_began
    # the parts of the check are one collection of the six hosts
    assert [(c["hosts"], c["ok"], c["failed"]) for c in collections] == [(6, 6, 0)], collections


def test_checks_begin_every_interval_whatever_a_check_takes(tmp_path):
    from airflow_hetero_gpu.collect.fleet import SshCollector as Collector

    watch = HealthWatch(WatchSpec(stop_when_idle=False), Collector([], lambda t: None), None)
    assert watch.until_next(10) == 0  # no check yet
    watch.last_began = time.monotonic() - 3  # a check that began 3 s ago and has ended
    assert 6.0 < watch.until_next(10) <= 7.0
    assert watch.until_next(2) == 0  # it took longer than the interval: the next begins now
    with pytest.raises(ValueError, match="part_window"):
        HealthWatch(WatchSpec(), Collector([], lambda t: None), None, part_window=0)


def test_a_check_in_parts_runs_one_admission_pass_once_its_last_part_is_in(embedded_cluster, tmp_path):
    from airflow_hetero_gpu.core.model import PlanRequest

    cluster, url, watch = _watch(embedded_cluster, tmp_path, 3)
    watch.check()
    with Ledger.from_url(url) as ledger:
        assert ledger.reserve("holder", watch.cluster, PlanRequest(2)).decision is not None
        assert ledger.enqueue("waiter", PlanRequest(2)).state == "waiting"  # one GPU is free
    release = tmp_path / "release-node03"
    cluster.set_state("node03", nvidia_smi_wait_for=str(release))  # the check waits for it
    check_began = datetime.now(timezone.utc)
    thread = threading.Thread(target=watch.check, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:  # the first part: the two hosts that answered
            with Ledger.from_url(url) as ledger:
                hosts = ledger.inventory(["node01", "node02"]).hosts
            if all(h.collected_at > check_began for h in hosts.values()):
                break
            time.sleep(0.05)
        assert all(h.collected_at > check_began for h in hosts.values())
        assert thread.is_alive()
        with Ledger.from_url(url) as ledger:  # no pass yet: the check is not over
            assert ledger.queue_entry("waiter").checked_at < check_began
    finally:
        release.write_text("")
    thread.join(WAIT)
    assert not thread.is_alive()
    with Ledger.from_url(url) as ledger:  # one pass, once the last part (node03) was in
        entry = ledger.queue_entry("waiter")
        last = ledger.inventory(["node03"]).hosts["node03"].collected_at
        assert entry.state == "waiting" and entry.checked_at >= last > check_began
