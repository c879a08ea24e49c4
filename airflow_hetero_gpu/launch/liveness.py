"""Keepalives and the host timeout: is a host of a running job still there?

A host can fail without exiting: its machine freezes, or its network goes quiet without closing
anything, and output alone cannot tell that from a job that prints nothing. So one thread per
host asks its sshd for an answer every ``interval`` seconds (an OpenSSH
``keepalive@openssh.com`` global request, as ``ServerAliveInterval`` does), and each answer
is a sign of life (:func:`keep_alive`). :func:`give_up_silent` ends, as failed, every running
host that answered nothing for ``host_timeout`` seconds; the job then treats it like a host
whose process exited non-zero.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Iterable

from airflow_hetero_gpu.launch.channel import HostRun

log = logging.getLogger(__name__)


def keep_alive(run: HostRun, interval: float) -> None:
    """Until the run ends or its connection closes: ask for an answer, note when it came, wait
    ``interval`` s. Each request blocks until it is answered (a silent host blocks it)."""
    transport = run.client.get_transport()
    while transport is not None and transport.is_active() and not run.done.is_set():
        try:
            transport.global_request("keepalive@openssh.com", wait=True)
        except Exception:
            return
        if not transport.is_active():
            return
        run.last_alive = time.monotonic()
        if run.heartbeat is not None:  # a supervised job: tell its dead-man switch we are here
            try:
                run.heartbeat(run, transport)
            except Exception as exc:  # noqa: BLE001 - the next beat tries again
                log.debug("heartbeat to %s failed: %s", run.host, exc)
        run.done.wait(interval)


def start_keepalive(run: HostRun, interval: float, name: str) -> threading.Thread:
    """:func:`keep_alive` for ``run`` in a daemon thread (added to ``run.threads``)."""
    thread = threading.Thread(target=keep_alive, args=(run, interval), daemon=True,
                              name=f"{name}:{run.host}:keepalive")
    run.threads.append(thread)
    thread.start()
    return thread


def give_up_silent(runs: Iterable[HostRun], host_timeout: float, job_id: str) -> list[HostRun]:
    """End every started, running host that answered nothing for ``host_timeout`` s; the runs
    given up on (each is ended once, with the reason in its ``error``)."""
    now = time.monotonic()
    lost: list[HostRun] = []
    for run in runs:
        if run.channel is None or run.done.is_set() or now - run.last_alive < host_timeout:
            continue
        reason = (f"no answer from {run.host} for {now - run.last_alive:.0f} s "
                  "(SSH keepalive): the host or its network is down")
        if run.end(error=reason, lost=True):
            log.warning("job %s: %s", job_id, reason)
            lost.append(run)
    return lost


__all__ = ["give_up_silent", "keep_alive", "start_keepalive"]
