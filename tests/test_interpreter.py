"""The cyclic collector paused while an inventory is parsed and built
(airflow_hetero_gpu.interpreter; the saving is measured by benchmarks/inventory_build.py)."""

from __future__ import annotations

import gc
import threading
from typing import Iterator

import pytest

from airflow_hetero_gpu.interpreter import HeldSetting, gc_paused
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.ledger.inventory import HostRecord
from airflow_hetero_gpu.testing.captures import host_files
from airflow_hetero_gpu.testing.demo import small_hosts


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_parsing_and_building_the_stored_inventory_runs_with_the_collector_paused(tmp_path, monkeypatch) -> None:
    import airflow_hetero_gpu.core.inventory as core_inventory
    import airflow_hetero_gpu.ledger.inventory as ledger_inventory
    from airflow_hetero_gpu.collect.freshness import FreshInventory

    seen: dict[str, list[bool]] = {"read": [], "parse": [], "build": []}

    def spy(name, fn):
        def call(*args, **kwargs):
            seen[name].append(gc.isenabled())
            return fn(*args, **kwargs)
        return call

    specs = small_hosts(3, gpus=2)
    with Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.db'}") as led:
        led.store_collection([HostRecord(s.name, True, host_files(s)) for s in specs], collector="test")
        monkeypatch.setattr(ledger_inventory, "_row", spy("read", ledger_inventory._row))
        monkeypatch.setattr(ledger_inventory, "parse_host", spy("parse", ledger_inventory.parse_host))
        monkeypatch.setattr(core_inventory, "build_cluster", spy("build", core_inventory.build_cluster))
        cluster = FreshInventory(led.inventory([s.name for s in specs]), 3600).cluster(None)
    assert len(cluster.gpus) == 6
    assert seen == {"read": [False] * 3, "parse": [False] * 3, "build": [False]}, seen
    assert gc.isenabled(), "the collector runs again after the build"


def test_a_build_that_fails_resumes_the_collector() -> None:
    with pytest.raises(RuntimeError):
        with gc_paused():
            assert not gc.isenabled()
            raise RuntimeError("the build fails")
    assert gc.isenabled()


def test_a_collector_the_process_paused_stays_paused() -> None:
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_concurrent_holders_share_one_change_undone_by_the_last() -> None:
    changes: list[str] = []
    setting = HeldSetting(lambda: changes.append("changed") or (lambda: changes.append("put back")))
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def second() -> None:
        first_in.wait(30)
        with setting.held():
            second_in.set()
            first_out.wait(30)
            changes.append("second still holds")

    thread = threading.Thread(target=second)
    thread.start()
    with setting.held():
        first_in.set()
        second_in.wait(30)
        with setting.held():  # nested in the same thread
            pass
    first_out.set()
    thread.join(30)
    assert changes == ["changed", "second still holds", "put back"]
