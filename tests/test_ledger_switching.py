"""A write of the ledger lowers the process's switch interval while it holds the lock, and puts
back what it found (airflow_hetero_gpu.ledger.switching; the effect on the lock's hold beside a
busy thread is measured by benchmarks/pass_beside_busy_thread.py)."""

from __future__ import annotations

import sys
import threading
from typing import Iterator

import pytest
from sqlalchemy import event

from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.ledger.switching import WRITE_SWITCH_INTERVAL_S, prompt_switching
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)

DEFAULT = 0.005


@pytest.fixture(autouse=True)
def default_interval() -> Iterator[None]:
    found = sys.getswitchinterval()
    sys.setswitchinterval(DEFAULT)
    yield
    sys.setswitchinterval(found)


def test_a_write_holds_the_lock_with_the_short_interval_and_puts_the_default_back(ledger_db_url: str) -> None:
    seen: list[tuple[str, float]] = []

    def statement(conn, cursor, text, params, context, many) -> None:
        seen.append((text.split(None, 1)[0].upper(), sys.getswitchinterval()))

    with Ledger.from_url(ledger_db_url) as led:
        event.listen(led.db.engine, "before_cursor_execute", statement)
        led.enqueue("job-1", PlanRequest(1), lease_seconds=60)  # a read (its warm), then the write
        assert sys.getswitchinterval() == pytest.approx(DEFAULT)
        led.leave_queue("job-1")
        led.queue()  # a read only
    writes = [v for verb, v in seen if verb in ("INSERT", "UPDATE", "DELETE")]
    assert writes and all(v == pytest.approx(WRITE_SWITCH_INTERVAL_S) for v in writes), seen
    assert any(v == pytest.approx(DEFAULT) for verb, v in seen if verb == "SELECT"), "reads keep the default"
    assert sys.getswitchinterval() == pytest.approx(DEFAULT)


def test_a_write_that_fails_puts_the_interval_back(ledger_db_url: str) -> None:
    with Ledger.from_url(ledger_db_url) as led:
        with pytest.raises(RuntimeError, match="dies before its commit"):
            with led.db.write("a write that dies"):
                assert sys.getswitchinterval() == pytest.approx(WRITE_SWITCH_INTERVAL_S)
                raise RuntimeError("the write dies before its commit")
    assert sys.getswitchinterval() == pytest.approx(DEFAULT)


def test_concurrent_writes_share_one_lowering_undone_by_the_last() -> None:
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, float] = {}

    def second() -> None:
        first_in.wait(30)
        with prompt_switching():
            second_in.set()
            first_out.wait(30)
            seen["after the first ended"] = sys.getswitchinterval()

    thread = threading.Thread(target=second)
    thread.start()
    with prompt_switching():
        first_in.set()
        second_in.wait(30)
    first_out.set()
    thread.join(30)
    assert seen["after the first ended"] == pytest.approx(WRITE_SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() == pytest.approx(DEFAULT)


def test_a_shorter_interval_of_the_process_is_kept() -> None:
    sys.setswitchinterval(0.0001)
    with prompt_switching():
        assert sys.getswitchinterval() == pytest.approx(0.0001)
    assert sys.getswitchinterval() == pytest.approx(0.0001)


def test_an_interval_set_by_someone_else_meanwhile_stays() -> None:
    with prompt_switching():
        sys.setswitchinterval(0.002)
    assert sys.getswitchinterval() == pytest.approx(0.002)
