"""Races of many processes against one ledger: start them together, gather what they report."""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.connection import wait
from typing import Callable


def race(worker: Callable, url: str, procs: int, wait_s: float) -> list[tuple]:
    """Fork ``procs`` processes running ``worker(url, i, barrier, pipe)`` (the barrier lets them
    start together) and return every message they send, ``(what, index, job, data)``, in the order
    received. A worker keeps reporting while it sends ``"ran"``; any other message is its last.
    Fails if the workers stop reporting for ``wait_s`` seconds in all."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(procs)
    pipes = [ctx.Pipe(duplex=False) for _ in range(procs)]
    workers = [ctx.Process(target=worker, args=(url, i, barrier, pipes[i][1]), daemon=True) for i in range(procs)]
    for p in workers:
        p.start()
    messages: list[tuple] = []
    try:
        readers = {pipes[i][0]: i for i in range(procs)}
        deadline = time.monotonic() + wait_s
        while readers:
            assert time.monotonic() < deadline, f"workers stopped reporting: {sorted(readers.values())}"
            for r in wait(list(readers), timeout=5):
                try:
                    message = r.recv()
                except EOFError:
                    del readers[r]
                    continue
                messages.append(message)
                if message[0] != "ran":
                    del readers[r]
    finally:
        for p in workers:
            p.join(30)
            if p.is_alive():
                p.kill()
    return messages
