"""The fleet's inventory in the ledger: stored collections, readers, Xid lines as events, history."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_hetero_gpu.cli.app import main
from airflow_hetero_gpu.collect.freshness import FreshInventory
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.ledger import Ledger, LedgerError, migrations, schema
from airflow_hetero_gpu.ledger.inventory import HostRecord
from airflow_hetero_gpu.testing.captures import host_files, write_capture_dir
from airflow_hetero_gpu.testing.demo import small_hosts
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)
from ledger_clock import Clock

TOPOLOGY = "SwitchName=leaf1 Nodes=node01,node02\nSwitchName=leaf2 Nodes=node03\nSwitchName=spine Switches=leaf1,leaf2\n"
CLUSTER_YAML = "weights:\n  topology: 0.6\n"


def records(specs, failed=()):
    return [HostRecord(s.name, False, {}, failed[s.name]) if s.name in failed else
            HostRecord(s.name, True, host_files(s)) for s in specs]


def store(led, specs, failed=None, **kw):
    return led.store_collection(records(specs, failed or {}), collector="test collector",
                                fleet_files={"topology.conf": TOPOLOGY, "cluster.yaml": CLUSTER_YAML}, **kw)


def test_a_stored_collection_reads_back_as_the_same_captures(ledger_db_url, tmp_path):  # noqa: F811
    specs = small_hosts(3, gpus=2)
    clock = Clock()
    with Ledger.from_url(ledger_db_url, clock=clock) as led:
        stored = store(led, specs)
        assert stored.collection_id >= 1 and stored.xid_evictions == []
        inv = led.inventory()
        assert sorted(inv.hosts) == ["node01", "node02", "node03"]
        row = inv.hosts["node02"]
        assert row.ok and row.collector == "test collector" and row.good_at == clock.now == row.collected_at
        assert row.files == host_files(specs[1])
        assert inv.fleet_files == {"topology.conf": TOPOLOGY, "cluster.yaml": CLUSTER_YAML}
        # the same planner input as the capture directory of the same outputs
        write_capture_dir(tmp_path, specs, topology_conf=TOPOLOGY, cluster_yaml=CLUSTER_YAML)
        from airflow_hetero_gpu.core.inventory import load_cluster

        from_dir = load_cluster(tmp_path)
        from_ledger = FreshInventory(inv, float("inf")).cluster()
        assert [g.to_json() for g in from_ledger.gpus] == [g.to_json() for g in from_dir.gpus]
        assert [p.id for p in from_ledger.pools] == [p.id for p in from_dir.pools]
        assert from_ledger.config.weights.topology == 0.6
        req = PlanRequest(4)
        assert led.plan(from_ledger, req).to_json() == led.plan(from_dir, req).to_json()


def test_a_failed_host_keeps_its_last_good_outputs(ledger_db_url):  # noqa: F811
    specs = small_hosts(2, gpus=2)
    clock = Clock()
    with Ledger.from_url(ledger_db_url, clock=clock) as led:
        store(led, specs)
        good_at = clock.now
        clock.tick(60)
        store(led, specs, failed={"node02": "connection refused (127.0.0.12:22)"})
        row = led.inventory(["node02"]).hosts["node02"]
        assert (row.ok, row.error, row.good_at, row.collected_at) == (
            False, "connection refused (127.0.0.12:22)", good_at, clock.now)
        assert row.files == host_files(specs[1])
        cluster = FreshInventory(led.inventory(), float("inf")).cluster()
        assert [g.reasons for g in cluster.gpus if g.host == "node02"] == [("unreachable",), ("unreachable",)]
        assert cluster.host_errors == {"node02": "connection refused (127.0.0.12:22)"}
        # a host that never answered has no GPUs, only its error
        store(led, small_hosts(3, gpus=2)[2:], failed={"node03": "timeout connecting to 127.0.0.13:22 after 10s"})
        cluster = FreshInventory(led.inventory(), float("inf")).cluster()
        assert "node03" in cluster.host_errors and not [g for g in cluster.gpus if g.host == "node03"]


def test_an_old_inventory_is_not_placed_on(ledger_db_url):  # noqa: F811
    specs = small_hosts(2, gpus=2)
    clock = Clock()
    with Ledger.from_url(ledger_db_url, clock=clock) as led:
        store(led, specs[:1])
        clock.tick(250)
        store(led, specs[1:])
        clock.tick(62)
        fresh = FreshInventory(led.inventory(), 120)
        cluster = fresh.cluster()
        assert [g.reasons for g in cluster.gpus if g.host == "node01"] == [("stale",), ("stale",)]
        assert cluster.host_notes["node01"] == ["inventory 312 s old (max 120 s)"]
        assert fresh.stale_hosts() == ["node01"]
        result = led.plan(cluster, PlanRequest(4))
        assert result.decision is None and "stale" in result.pools[0].reason
        assert led.plan(cluster, PlanRequest(2)).decision.hosts == ["node02"]
        assert fresh.summary()["oldest_s"] == 312 and fresh.summary()["newest_s"] == 62


def _xid(host_spec, gpu: int, xid: int, t: float) -> None:
    host_spec.xid.append({"time": t, "gpu": gpu, "xid": xid})


def test_an_xid_line_evicts_once_and_uncordon_brings_the_gpu_back(ledger_db_url):  # noqa: F811
    """An Xid line is an event: it evicts its GPU once; after uncordon the GPU is placeable again
    while the same old line is still in the log; a new line evicts it again."""
    specs = small_hosts(1, gpus=2)
    _xid(specs[0], 1, 79, 100.5)
    _xid(specs[0], 0, 13, 101.5)  # an application error: no eviction
    with Ledger.from_url(ledger_db_url) as led:
        first = store(led, specs)
        assert first.xid_evictions == [(GpuKey("node01", 1), ("xid-79",))]
        assert led.evicted_map() == {GpuKey("node01", 1): ("xid-79",)}
        assert [(e.kind, e.key, e.reasons) for e in led.gpu_events(datetime(2000, 1, 1, tzinfo=timezone.utc))] == [
            ("evicted", GpuKey("node01", 1), ("xid-79",))]
        assert led.uncordon("node01", 1) == [GpuKey("node01", 1)]
        again = store(led, specs)  # the same log: nothing new
        assert again.xid_evictions == [] and led.evicted_map() == {}
        cluster = FreshInventory(led.inventory(), float("inf")).cluster()
        assert all(g.healthy for g in cluster.gpus)  # the inventory does not count Xid lines
        assert led.plan(cluster, PlanRequest(2)).decision is not None
        _xid(specs[0], 1, 48, 200.25)
        third = store(led, specs)
        assert third.xid_evictions == [(GpuKey("node01", 1), ("xid-48",))]
        assert led.plan(FreshInventory(led.inventory(), float("inf")).cluster(), PlanRequest(2)).decision is None


def test_history_samples_every_interval_or_on_change_and_is_pruned(ledger_db_url):  # noqa: F811
    specs = small_hosts(2, gpus=2)
    clock = Clock()
    t0 = clock.now
    with Ledger.from_url(ledger_db_url, clock=clock) as led:
        store(led, specs, history_interval=300, history_retention=3600)
        for _ in range(4):  # unchanged, within the interval: no sample
            clock.tick(60)
            store(led, specs, history_interval=300, history_retention=3600)
        assert [(s.host, s.collected_at) for s in led.host_samples(t0)] == [("node01", t0), ("node02", t0)]
        clock.tick(60)  # 300 s after the first sample
        store(led, specs, history_interval=300, history_retention=3600)
        assert len(led.host_samples(t0)) == 4
        clock.tick(10)
        specs[0].gpus[1].ecc_uncorrected_volatile = 1  # a change is sampled at once
        store(led, specs, history_interval=300, history_retention=3600)
        last = [s for s in led.host_samples(t0) if s.host == "node01"][-1]
        assert last.collected_at == clock.now and [g["healthy"] for g in last.gpus] == [True, False]
        assert set(last.gpus[0]) >= {"index", "utilization", "temperature_c", "memory_used_mib", "reserved", "evicted"}
        clock.tick(3601)  # everything sampled before now - retention goes
        store(led, specs, history_interval=300, history_retention=3600)
        assert [s.collected_at for s in led.host_samples(t0)] == [clock.now, clock.now]
        assert [c["hosts"] for c in led.collections(t0)] == [2]


def test_job_hosts_are_remembered_until_forgotten(ledger_db_url):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:
        led.add_job_hosts("j1", ["b", "a"])
        led.add_job_hosts("j1", ["a", "c"])
        assert led.job_hosts("j1") == ["a", "b", "c"] and led.job_hosts("other") == []
        led.forget_job_hosts("j1")
        assert led.job_hosts("j1") == []


# --- the command line ------------------------------------------------------------------------------
def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_readers_never_create_a_database(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "nonexistent" / "dir" / "x.db"
    for argv in (["plan", "--gpus", "2"], ["pools"], ["inventory"], ["reservations"], ["evictions"],
                 ["captures", "export", "--out", str(tmp_path / "exp")]):
        for url in (f"sqlite:///{missing}", "notaurl"):
            code, out, err = _run(capsys, *argv, "--ledger", url)
            assert code == 2, (argv, url, out)
            assert len(err.strip().splitlines()) == 1 and "no ledger at" in err and "hetero-gpu ledger init" in err
    assert not (tmp_path / "nonexistent").exists() and not (tmp_path / "notaurl").exists()
    assert not (tmp_path / "exp").exists()
    # release and uncordon change an existing ledger only
    for argv in (["release", "--job-id", "j"], ["uncordon", "h:0"]):
        code, _, err = _run(capsys, *argv, "--ledger", str(tmp_path / "typo.db"))
        assert code == 2 and "no ledger at" in err
    assert not (tmp_path / "typo.db").exists()


def test_an_empty_ledger_says_how_to_fill_it(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    code, out, _ = _run(capsys, "ledger", "init", url)
    assert code == 0 and f"schema version {migrations.LATEST}" in out
    for argv in (["plan", "--gpus", "1"], ["inventory"], ["captures", "export", "--out", str(tmp_path / "x")]):
        code, _, err = _run(capsys, *argv, "--ledger", url)
        assert code == 2 and "holds no inventory" in err and "hetero-gpu collect --ledger" in err, err
    code, _, err = _run(capsys, "plan", "--gpus", "1")
    assert code == 2 and "or --captures DIR" in err and "[hetero_gpu] ledger_url, and none is set" in err


def test_an_old_ledger_is_refused_by_readers_and_upgraded_by_init(tmp_path, capsys):
    from datetime import datetime, timezone

    from sqlalchemy import create_engine

    path = tmp_path / "old.db"
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:  # a ledger as version 3 of the code left it
        migrations.upgrade(conn, datetime.now(timezone.utc), target=3)
    engine.dispose()
    code, _, err = _run(capsys, "reservations", "--ledger", str(path))
    assert code == 2 and "schema version 3, older than" in err and "hetero-gpu ledger init" in err
    code, out, _ = _run(capsys, "ledger", "init", str(path))
    assert code == 0 and f"schema version {migrations.LATEST}" in out
    assert _run(capsys, "reservations", "--ledger", str(path))[0] == 0


def test_plan_from_the_ledger_equals_plan_from_its_export(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    specs = small_hosts(3, gpus=2)
    with Ledger.from_url(url) as led:
        store(led, specs)
    out_dir = tmp_path / "exported"
    assert _run(capsys, "captures", "export", "--ledger", url, "--out", str(out_dir))[0] == 0
    assert sorted(p.name for p in (out_dir / "hosts").iterdir()) == ["node01", "node02", "node03"]
    assert (out_dir / "topology.conf").read_text() == TOPOLOGY
    for k in ("1", "3", "4", "6"):
        c1, from_ledger, _ = _run(capsys, "plan", "--ledger", url, "--gpus", k, "--json")
        c2, from_dir, _ = _run(capsys, "plan", "--captures", str(out_dir), "--gpus", k, "--json")
        assert c1 == c2 == 0 and json.loads(from_ledger) == json.loads(from_dir)
    code, text, _ = _run(capsys, "plan", "--ledger", url, "--gpus", "2")
    assert code == 0 and text.startswith("inventory from the ledger: 3 host(s), ")
    code, text, _ = _run(capsys, "plan", "--ledger", url, "--gpus", "7")
    assert code == 2  # more GPUs than the fleet has at all: a mistake, not a shortage


def test_the_queue_cluster_is_rebuilt_for_the_changed_hosts_only_and_equals_a_fresh_build(ledger_db_url):  # noqa: F811
    from airflow_hetero_gpu.ledger.admission import ClusterCache

    specs = small_hosts(4, gpus=2)
    clock = Clock()
    kept = ClusterCache()  # one process's cache, kept across collections
    with Ledger.from_url(ledger_db_url, clock=clock) as led:
        def both():
            with led._read("test") as (conn, now):
                return kept.get(conn, now), ClusterCache().get(conn, now)

        def same(a, b):
            assert [g.to_json() for g in a.gpus] == [g.to_json() for g in b.gpus]
            assert [p.id for p in a.pools] == [p.id for p in b.pools] and a.hosts == b.hosts
            assert a.host_errors == b.host_errors and a.host_notes == b.host_notes

        store(led, specs)
        first, fresh = both()
        same(first, fresh)
        assert kept._memo.hosts["node02"][1][0].utilization == 0  # noqa: SLF001
        # a health check's part: node02 busy, node03 unreachable; node01 and node04 untouched
        clock.tick(30)
        specs[1].gpus[0].utilization_gpu = 93
        led.store_collection(records([specs[1], specs[2]], failed={"node03": "connection refused"}),
                             collector="test collector")
        untouched = kept._memo.hosts["node01"]  # noqa: SLF001
        part, fresh = both()
        same(part, fresh)
        assert part is not first
        assert kept._memo.hosts["node01"] is untouched  # noqa: SLF001 - not parsed again
        assert next(g for g in part.gpus if g.key == GpuKey("node02", 0)).utilization == 0.93
        assert part.host_errors == {"node03": "connection refused"}
        # a host gone from the inventory, then another cluster.yaml: both show at once
        clock.tick(30)
        led.remove_host("node04")
        gone, fresh = both()
        same(gone, fresh)
        assert "node04" not in gone.hosts
        clock.tick(30)
        led.store_collection(records(specs[:1]), collector="test collector",
                             fleet_files={"cluster.yaml": "weights:\n  topology: 0.9\n"})
        conf, fresh = both()
        same(conf, fresh)
        assert conf.config.weights.topology == 0.9


def _judge(captures, new_xids, files):
    from airflow_hetero_gpu.core import watch
    from airflow_hetero_gpu.core.config import ClusterConfig

    config = ClusterConfig()
    return watch.evaluate(captures, config, new_xids), watch.WatchPolicy.from_thresholds(config.thresholds)


@contextmanager
def _part_before_lock(led, check, clock, part):
    """Each write of ``led`` in the block: a health check's part of ``part()`` (stored by another
    ledger with ``admit=False``, as a check's parts: no pass, so this process's cache does not see
    it) lands after the write warmed, before it takes the lock. Yields the cache's counters as
    they were just before each lock (the last one)."""
    locked, seen = led.db.locked, {}

    def part_then_lock(action):
        clock.tick(30)
        check.record_health_check(records(part()), collector="test check", judge=_judge, admit=False)
        stats = led.db.clusters.stats
        seen["before"] = (stats.builds, stats.hosts_parsed, stats.warmed_uses)
        return locked(action)

    led.db.locked = part_then_lock
    try:
        yield seen
    finally:
        led.db.locked = locked


def test_a_write_uses_the_cluster_it_warmed_when_a_check_part_lands_before_its_lock(ledger_db_url):  # noqa: F811
    """A release warms the queue's cluster, then a health check's part lands before the release
    takes the lock: an ECC fault on node02 GPU 0 (evicted by the part's own write), node03 busier,
    a new host node05. Under the lock nothing is parsed; the eviction is still respected; the new
    host waits for the check's own pass."""
    specs = small_hosts(4, gpus=2)
    clock = Clock()
    with Ledger.from_url(ledger_db_url, clock=clock) as led, Ledger.from_url(ledger_db_url, clock=clock) as check:
        store(led, specs)
        assert led.enqueue("holder", PlanRequest(8), lease_seconds=3600).admitted
        led.take_admission("holder")
        for i in range(8):  # one GPU each: with the fleet's 8 free, all would be admitted
            assert not led.enqueue(f"w{i}", PlanRequest(1), lease_seconds=3600).admitted
        cache = led.db.clusters

        def part():
            specs[1].gpus[0].ecc_uncorrected_volatile = 2
            specs[2].gpus[0].utilization_gpu = 77
            return [specs[1], specs[2], *small_hosts(5, gpus=2)[4:]]

        with _part_before_lock(led, check, clock, part) as seen:
            assert led.release("holder")
        builds, parsed, uses = seen["before"]
        assert (cache.stats.builds, cache.stats.hosts_parsed) == (builds, parsed)  # nothing parsed under the lock
        assert cache.stats.warmed_uses == uses + 1
        assert GpuKey("node02", 0) in led.evicted_map()
        held = {(g.host, g.index) for r in led.live_reservations() for g in r.gpus}
        assert len(held) == 7 and ("node02", 0) not in held  # 8 usable in the warmed cluster but the eviction
        assert not {h for h, _ in held} & {"node05"}  # the new host: not in the cluster the release warmed
        # the check's own pass after its last part: warmed with the part's hosts, it places the last one
        before = cache.stats.hosts_parsed
        led.run_admission()
        assert cache.stats.hosts_parsed == before + 3  # node02, node03, node05, before its lock
        held = {(g.host, g.index) for r in led.live_reservations() for g in r.gpus}
        assert len(held) == 8 and ("node02", 0) not in held and {h for h, _ in held} & {"node05"}


def test_with_nobody_waiting_a_write_parses_nothing_under_the_lock(ledger_db_url):  # noqa: F811
    """Nobody waits: without teams the pass needs no cluster at all; with teams (their usage
    counts GPUs by card) neither, once the ledger has recorded the card type of the reservations'
    pools (the pass that admitted the job did): nothing is built before or under the lock, a part
    landed or not, and the release's usage is recorded by card."""
    from airflow_hetero_gpu.core.admission import teams_from_mapping

    specs = small_hosts(4, gpus=2)
    clock = Clock()
    with Ledger.from_url(ledger_db_url, clock=clock) as led, Ledger.from_url(ledger_db_url, clock=clock) as check:
        store(led, specs)
        cache = led.db.clusters
        for team in (None, "research"):
            assert led.enqueue(f"job-{team}", PlanRequest(2), lease_seconds=3600, team=team).admitted
            led.take_admission(f"job-{team}")
            with _part_before_lock(led, check, clock, lambda: specs[:2]) as seen:
                builds = cache.stats.builds
                assert led.release(f"job-{team}")
            assert seen["before"] == (builds, cache.stats.hosts_parsed, cache.stats.warmed_uses)  # no warm
            assert cache.stats.builds == builds  # nor a build under the lock
            if team is None:
                led.apply_teams(teams_from_mapping({"teams": {"research": {"quota": {"*": 4}}}}, "test"))
        samples = [(x["team"], x["in_use"]) for x in led.team_samples() if x["team"] == "research"]
        assert samples[-2:] == [("research", 2), ("research", 0)]  # the release's usage was recorded


def test_a_write_with_teams_builds_the_cluster_once_for_a_pool_whose_card_is_not_recorded(ledger_db_url):  # noqa: F811
    """A reservation whose pool's card type the ledger has not recorded (written before the record
    existed): a process's next write with teams needs the cluster (it warms it) and records the
    card; a fresh process's write after it needs none, and the usage is still counted."""
    from sqlalchemy import delete

    from airflow_hetero_gpu.core.admission import teams_from_mapping
    from airflow_hetero_gpu.ledger.admission import ClusterCache
    from airflow_hetero_gpu.ledger.schema import team_settings
    from airflow_hetero_gpu.ledger.teams import POOL_CARDS_KEY, known_pool_cards

    specs = small_hosts(2, gpus=4)
    clock = Clock()
    with Ledger.from_url(ledger_db_url, clock=clock) as led:
        store(led, specs)
        led.apply_teams(teams_from_mapping({"teams": {"research": {"quota": {"*": 8}}}}, "test"))
        for job in ("a", "b"):
            assert led.enqueue(job, PlanRequest(2), lease_seconds=3600, team="research").admitted
            led.take_admission(job)

        def fresh_process_warms():
            with led._read("test") as (conn, now):
                return ClusterCache().warm(conn, now) is not None, known_pool_cards(conn)

        needed, known = fresh_process_warms()
        assert not needed and known  # the passes that admitted a and b recorded their pool's card
        with led.db.write("forget the recorded cards") as uow:  # as a ledger written before the record
            uow.conn.execute(delete(team_settings).where(team_settings.c.key == POOL_CARDS_KEY))
        assert fresh_process_warms() == (True, {})  # a reservation's card unknown: the cluster is needed
        clock.tick(10)
        assert led.release("a")
        needed, known = fresh_process_warms()
        assert not needed and known  # recorded again: b's pool is covered
        clock.tick(10)
        assert led.release("b")
        samples = [(x["team"], x["in_use"]) for x in led.team_samples() if x["team"] == "research"]
        assert samples[-3:] == [("research", 4), ("research", 2), ("research", 0)]


def test_a_warmed_cluster_is_not_used_once_a_host_it_has_is_removed_or_the_fleet_files_change(ledger_db_url):  # noqa: F811
    from airflow_hetero_gpu.ledger.admission import ClusterCache

    specs = small_hosts(3, gpus=2)
    clock = Clock()
    with Ledger.from_url(ledger_db_url, clock=clock) as led:
        store(led, specs)
        assert not led.enqueue("w", PlanRequest(8), lease_seconds=3600).admitted  # someone waits
        kept = ClusterCache()  # another process's cache

        def warm():
            with led._read("test") as (conn, now):
                return kept.warm(conn, now)

        def get(warmed):
            with led._read("test") as (conn, now):
                return kept.get(conn, now, warmed)

        warmed = warm()
        assert warmed is not None and warmed.hosts == {"node01", "node02", "node03"}
        clock.tick(30)
        store(led, specs[:1])  # a part: the warmed cluster serves
        assert get(warmed) is warmed.cluster and kept.stats.warmed_uses == 1
        warmed = warm()
        led.remove_host("node03")  # a host it has is gone: rebuilt, nothing parsed for a removal
        parsed = kept.stats.hosts_parsed
        cluster = get(warmed)
        assert "node03" not in cluster.hosts and kept.stats.hosts_parsed == parsed
        warmed = warm()
        clock.tick(30)
        led.store_collection(records(specs[:1]), collector="test collector",
                             fleet_files={"cluster.yaml": "weights:\n  topology: 0.9\n"})
        assert get(warmed).config.weights.topology == 0.9  # another cluster.yaml: rebuilt
        assert kept.stats.warmed_uses == 1


def test_a_write_with_its_warmed_cluster_does_not_wait_for_another_threads_build(ledger_db_url):  # noqa: F811
    """In the triggerer a check's warm builds the cluster after its last part while a trigger's
    renewal, which warmed before that part, holds the ledger lock: the renewal uses its own
    cluster at once rather than waiting, with the fleet's lock held, for the build."""
    import threading

    from airflow_hetero_gpu.ledger.admission import ClusterCache

    specs = small_hosts(3, gpus=2)
    clock = Clock()
    with Ledger.from_url(ledger_db_url, clock=clock) as led:
        store(led, specs)
        assert not led.enqueue("w", PlanRequest(8), lease_seconds=3600).admitted  # someone waits
        kept = ClusterCache()  # one process's cache, shared by its threads
        build = kept._build
        building, finish = threading.Event(), threading.Event()

        def held_build(*args, **kwargs):
            if threading.current_thread().name == "check":
                building.set()
                assert finish.wait(120), "the test let the build finish"
            return build(*args, **kwargs)

        kept._build = held_build  # type: ignore[method-assign]

        def read(call, *args):
            with led._read("test") as (conn, now):
                return call(conn, now, *args)

        warmed = read(kept.warm)  # the renewal's warm
        clock.tick(30)
        store(led, specs[:1])  # the check's last part
        check = threading.Thread(target=read, args=(kept.warm,), name="check")
        check.start()
        got: list = []
        renewal = threading.Thread(target=lambda: got.append(read(kept.get, warmed)), name="renewal")
        try:
            assert building.wait(120), "the check's build began"
            renewal.start()  # the renewal's pass, while the check builds
            renewal.join(60)
            assert got, "the renewal's pass waited for the check's build"
            assert got[0] is warmed.cluster and kept.stats.warmed_uses == 1
            builds = kept.stats.builds
        finally:
            finish.set()
            check.join(120)
            renewal.join(120)
        assert kept.stats.builds == builds + 1  # the check's build went on and is kept
        assert read(kept.get, None) is not warmed.cluster
