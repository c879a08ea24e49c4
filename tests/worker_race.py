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


def assert_no_gpu_held_twice(holds) -> None:
    """No GPU held by two jobs at once: ``holds`` are ``(job, keys, took, freed_at)``, one per
    holding of a job; each lists a GPU once, and the holding intervals of one GPU never overlap."""
    from airflow_hetero_gpu.core.model import GpuKey

    by_gpu: dict[GpuKey, list[tuple[float, float, str]]] = {}
    for job, keys, took, freed_at in holds:
        assert len(keys) == len(set(keys))
        for k in keys:
            by_gpu.setdefault(GpuKey(*k), []).append((took, freed_at, job))
    for gpu, spans in by_gpu.items():
        spans.sort()
        for (_a0, a1, ja), (b0, _b1, jb) in zip(spans, spans[1:]):
            assert a1 <= b0, f"{gpu} held by {ja} and {jb} at once"
