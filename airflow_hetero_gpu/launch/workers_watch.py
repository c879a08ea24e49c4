"""When did the training script itself end on each host, apart from torchrun's agent?

A stopped job's hosts exit when torchrun does, and torchrun's agent takes its time after its
workers are gone (it shuts its rendezvous down, prints its traceback): seconds, while the script
saved its checkpoint and exited within half a second. A preemption reports the script's exit
(:mod:`airflow_hetero_gpu.operators.preempt`), so it watches the workers themselves.

:data:`WORKERS_SCRIPT` is one constant POSIX shell script run over the job's own SSH connection
on each host *before* the signal is sent (job id, host and a number of 0.1 s ticks as quoted
arguments). It picks the job's workers: the processes with the job's markers
(``HETERO_GPU_JOB_ID``, ``HETERO_GPU_HOST`` and, where the host sets it, ``HETERO_GPU_SCOPE``,
as the sweep of :mod:`~.orphans` finds them) that
also carry ``TORCHELASTIC_RUN_ID``, which torchrun puts into each worker's environment and which
the agent's own environment lacks (their children, a data loader's processes, inherit it). It
prints ``workers N``, then every 0.1 s looks whether any of those processes still carries the
job's marker (a process that ended, a zombie not yet reaped by torchrun, or a pid reused by
another process does not), and prints ``gone`` when none does (or ``still running`` after its
ticks). The launcher notes the moment the ``gone`` line arrives: at most one tick and one network
latency late. A job without torchrun workers (a ``Command``) prints ``workers 0`` and ends.
"""

from __future__ import annotations

import logging
import math
import shlex
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from airflow_hetero_gpu.launch.command import HOST_ENV, JOB_ENV, SCOPE_ENV, validate_host_name, validate_job_id

log = logging.getLogger(__name__)

#: what torchrun sets in each worker's environment, and not in its own
WORKER_ENV = "TORCHELASTIC_RUN_ID"

WORKERS_SCRIPT = r"""
job=$1 host=$2 ticks=$3
files=$(grep -lzxF -e "__JOB_ENV__=$job" /proc/[0-9]*/environ 2>/dev/null)
[ -n "$files" ] && files=$(grep -lzxF -e "__HOST_ENV__=$host" $files 2>/dev/null)
[ -n "$files" ] && [ -n "${__SCOPE_ENV__:-}" ] && files=$(grep -lzxF -e "__SCOPE_ENV__=$__SCOPE_ENV__" $files 2>/dev/null)
[ -n "$files" ] && files=$(grep -lz -e '^__WORKER_ENV__=' $files 2>/dev/null)
n=0
for f in $files; do n=$((n + 1)); done
echo "workers $n"
[ "$n" -gt 0 ] || exit 0
i=0
while [ "$i" -lt "$ticks" ]; do
  [ -n "$(grep -lzxF -e "__JOB_ENV__=$job" $files 2>/dev/null)" ] || { echo gone; exit 0; }
  sleep 0.1
  i=$((i + 1))
done
echo "still running"
""".replace("__JOB_ENV__", JOB_ENV).replace("__HOST_ENV__", HOST_ENV).replace("__WORKER_ENV__", WORKER_ENV).replace(
    "__SCOPE_ENV__", SCOPE_ENV)


def workers_command(job_id: str, host: str, seconds: float) -> str:
    """The command line that watches the job's workers on ``host`` for up to ``seconds``."""
    validate_job_id(job_id)
    validate_host_name(host)
    ticks = max(1, int(math.ceil(seconds * 10)))
    return "sh -c " + " ".join(shlex.quote(a) for a in (WORKERS_SCRIPT, "hetero-gpu-workers", job_id, host, str(ticks)))


@dataclass
class HostWorkers:
    """One host's watch: how many workers it found, when (monotonic) they were all gone."""

    host: str
    workers: int | None = None
    gone_at: float | None = None
    error: str | None = None


class WorkersWatch:
    """Watches the workers of ``job_id`` on each ``(host, paramiko client)`` of a running job."""

    def __init__(self, job_id: str, clients: Sequence[tuple[str, Any]], seconds: float):
        self.hosts = {host: HostWorkers(host) for host, _ in clients}
        self._ready = {host: threading.Event() for host, _ in clients}
        self._done = {host: threading.Event() for host, _ in clients}
        self._channels: list[Any] = []
        self._threads = [threading.Thread(target=self._watch, args=(host, client, workers_command(job_id, host, seconds)),
                                          daemon=True, name=f"{job_id}:{host}:workers") for host, client in clients]

    def start(self, ready_timeout: float = 5.0) -> "WorkersWatch":
        """Start every host's watch and wait (up to ``ready_timeout``) until each listed its workers."""
        for thread in self._threads:
            thread.start()
        deadline = time.monotonic() + ready_timeout
        for event in self._ready.values():
            event.wait(max(0.0, deadline - time.monotonic()))
        return self

    def _watch(self, host: str, client: Any, command: str) -> None:
        found = self.hosts[host]
        try:
            transport = client.get_transport()
            if transport is None or not transport.is_active():
                raise ConnectionError("SSH connection closed")
            channel = transport.open_session(timeout=15.0)
            self._channels.append(channel)
            channel.exec_command(command)
            for raw in channel.makefile("rb"):
                line = raw.decode("utf-8", "replace").strip()
                if line.startswith("workers "):
                    found.workers = int(line.split()[1])
                    self._ready[host].set()
                elif line == "gone":
                    found.gone_at = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - a watch that fails leaves the job's own time
            found.error = f"{exc or type(exc).__name__}"
            log.debug("watching the workers on %s failed: %s", host, found.error)
        finally:
            self._ready[host].set()
            self._done[host].set()

    def gone_after(self, t0: float, wait: float = 3.0) -> float | None:
        """Seconds from ``t0`` until the last host's workers were gone; None when some host's
        watch failed or saw no workers (no torchrun), or they were not gone after ``wait`` s more."""
        deadline = time.monotonic() + wait
        for event in self._done.values():
            event.wait(max(0.0, deadline - time.monotonic()))
        hosts = list(self.hosts.values())
        if not hosts or any(h.workers is None or h.workers == 0 or h.gone_at is None for h in hosts):
            return None
        return max(0.0, max(h.gone_at for h in hosts) - t0)

    def close(self) -> None:
        for channel in list(self._channels):
            try:
                channel.close()
            except Exception:  # noqa: BLE001
                pass


__all__ = ["HostWorkers", "WORKERS_SCRIPT", "WORKER_ENV", "WorkersWatch", "workers_command"]
