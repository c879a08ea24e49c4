"""One machine, one inventory (real sshd per emulated host, SQLite and PostgreSQL ledgers): two
names for one sshd are collected once, two addresses of one machine (the same GPU UUIDs) are
counted once, and a race of 8 tasks never reserves a GPU twice."""

from __future__ import annotations

import json
import threading

from airflow_hetero_gpu.cli.app import main
from airflow_hetero_gpu.collect.freshness import FreshInventory
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)


def _fleet(emulated_cluster):  # noqa: F811
    """node01, node02, node03 of 2 GPUs each; node03 is node02 again (its GPUs report node02's
    UUIDs: the same machine reached at a second address)."""
    cluster = emulated_cluster(small_hosts(3, gpus=2))
    cluster.set_state("node03", gpus=cluster.state("node02")["gpus"])
    return cluster


def _collect(cluster, url: str, capsys) -> str:
    node01 = cluster.host("node01")
    alias = f"node01-alias={cluster.user}@{node01.address}:{node01.port}"  # a second name for node01's sshd
    capsys.readouterr()
    assert main(["collect", "--hosts", cluster.hosts_arg() + "," + alias, "--identity-file",
                 str(cluster.identity_file), "--known-hosts", str(cluster.known_hosts_path), "--ledger", url]) == 0
    return capsys.readouterr().out


def test_each_gpu_is_counted_once_and_the_duplicate_is_named(emulated_cluster, ledger_db_url, capsys):  # noqa: F811
    cluster = _fleet(emulated_cluster)
    out = _collect(cluster, ledger_db_url, capsys)
    node01 = cluster.host("node01")
    assert (f"node01-alias  duplicate of node01 (same address and port {node01.address}:{node01.port}): "
            "not collected") in out, out
    uuid = cluster.state("node02")["gpus"][0]["uuid"]
    assert f"warning: duplicate of node02: same GPU UUIDs ({uuid}); its GPUs are counted once, as node02's" in out
    assert "collected 3/4 hosts" in out
    with Ledger.open_existing(ledger_db_url) as led:
        assert sorted(led.inventory().hosts) == ["node01", "node02", "node03"]  # the alias was not stored
    assert main(["pools", "--ledger", ledger_db_url, "--json"]) == 0
    (pool,) = json.loads(capsys.readouterr().out)
    assert (pool["gpus"], pool["available"], pool["hosts"]) == (4, 4, ["node01", "node02"])
    assert main(["pools", "--ledger", ledger_db_url]) == 0
    said = capsys.readouterr().out
    assert (f"host node02: node03 is a duplicate of node02: same GPU UUIDs as node02 ({uuid} and 1 more); "
            "its GPUs are counted once, as node02's") in said, said
    assert said.count("duplicate") == 1
    assert main(["plan", "--ledger", ledger_db_url, "--gpus", "5"]) == 2  # more than the 4 there are
    assert "has 4" in capsys.readouterr().err


def test_a_race_of_8_tasks_never_reserves_a_gpu_twice(emulated_cluster, ledger_db_url, capsys):  # noqa: F811
    cluster = _fleet(emulated_cluster)
    _collect(cluster, ledger_db_url, capsys)
    # every task plans on its own hosts, as an operator does: half see node02, half node03 (the
    # same machine), so only the ledger can tell that their GPUs are the same
    start = threading.Barrier(8)
    results: dict[str, list] = {}
    errors: list[BaseException] = []

    def task(i: int) -> None:
        try:
            with Ledger.from_url(ledger_db_url) as led:
                view = ["node01", "node02"] if i % 2 else ["node01", "node03"]
                cluster_view = FreshInventory(led.inventory(view), float("inf")).cluster()
                start.wait(timeout=120)
                result = led.reserve(f"task-{i}", cluster_view, PlanRequest(1))
                results[f"task-{i}"] = [] if result.decision is None else result.decision.gpus
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=task, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    placed = {job: gpus for job, gpus in results.items() if gpus}
    assert len(results) == 8 and len(placed) == 4, results  # 4 physical GPUs
    uuids = [g.uuid for gpus in placed.values() for g in gpus]
    assert len(set(uuids)) == 4
    with Ledger.open_existing(ledger_db_url) as led:
        held = [g.uuid for r in led.live_reservations() for g in r.gpus]
    assert sorted(held) == sorted(uuids)
