"""A health check records its hosts as they answer, not when the last one has.

A check of 1,000 hosts takes seconds; recorded in one transaction at its end, a fault read from
the first host would wait for the last one before it is an eviction in the ledger. Here the
collection runs in a thread of its own and every ``window_s`` seconds the hosts that answered
meanwhile are recorded as one *part* of the check (one ledger transaction, the same collection
row): a fault is in the ledger at most ``window_s`` plus one transaction after its host answered,
whatever the fleet's size, and the ledger's write lock is held for one part at a time.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Sequence, TypeVar

from airflow_hetero_gpu.collect.ssh import CollectReport, HostResult

#: Seconds between the parts of a check (a fault waits at most this long after its host answered).
DEFAULT_PART_WINDOW_S = 1.0

Part = TypeVar("Part")
_DONE = object()


class _Outcome:
    def __init__(self) -> None:
        self.report: CollectReport | None = None
        self.error: BaseException | None = None


def collect_in_parts(collect: Callable[[Callable[[HostResult], None]], CollectReport],
                     record: Callable[[Sequence[HostResult], Sequence[Part]], Part],
                     window_s: float = DEFAULT_PART_WINDOW_S) -> tuple[CollectReport, list[Part]]:
    """Run ``collect(on_host)`` in a thread and ``record(results, parts_so_far)`` here, on the
    hosts that answered, every ``window_s`` seconds and once more at the end.

    Returns the collection's report and the parts, in order. A check where no host answered is
    recorded as one empty part. When ``record`` raises, nothing more is recorded: the collection
    is waited for (its connections close) and the error raised; an error of ``collect`` is raised
    after the hosts that answered before it are recorded.
    """
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s!r}")
    answers: queue.SimpleQueue[object] = queue.SimpleQueue()
    outcome = _Outcome()

    def run() -> None:
        try:
            outcome.report = collect(answers.put)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
            outcome.error = exc
        finally:
            answers.put(_DONE)

    thread = threading.Thread(target=run, name="hetero-gpu-check-collect", daemon=True)
    thread.start()
    parts: list[Part] = []
    pending: list[HostResult] = []
    failure: BaseException | None = None
    done = False
    opened = time.monotonic()  # when the first answer of the pending part came
    while not done:
        timeout = None if not pending or failure is not None else max(0.0, opened + window_s - time.monotonic())
        try:
            item = answers.get(timeout=timeout)
        except queue.Empty:
            item = None
        if item is _DONE:
            done = True
        elif isinstance(item, HostResult):
            if not pending:
                opened = time.monotonic()
            pending.append(item)
            if time.monotonic() < opened + window_s:
                continue
        if failure is None and (pending or (done and not parts)):
            batch, pending = pending, []
            try:
                parts.append(record(batch, parts))
            except BaseException as exc:  # noqa: BLE001 - raised once the collection has ended
                failure = exc
        elif failure is not None:
            pending = []
    thread.join()
    if failure is not None:
        raise failure
    if outcome.error is not None:
        raise outcome.error
    assert outcome.report is not None
    return outcome.report, parts


__all__ = ["DEFAULT_PART_WINDOW_S", "collect_in_parts"]
