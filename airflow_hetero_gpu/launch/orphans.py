"""Find and end a job's processes on its hosts, by the job marker in their environment.

Every process a launch starts carries ``HETERO_GPU_JOB_ID=<job id>`` and
``HETERO_GPU_HOST=<host>`` in its environment (:mod:`airflow_hetero_gpu.launch.command` exports
them before torchrun starts), and every child inherits them, including torchrun's workers, which
torchrun puts into sessions of their own. So a job's processes on a host are exactly the
processes whose ``/proc/<pid>/environ`` holds both markers; the pid files under
``~/.hetero-gpu/run/<job id>/`` are for people, the sweep does not trust them (a pid can be
reused, a marker cannot be forged by accident).

:data:`SWEEP_SCRIPT` is one constant POSIX shell script (Linux ``/proc`` and GNU ``grep -z``)
run over SSH with the job id, host name, mode and grace period as quoted positional arguments:

- ``list``: print ``found <pid> <pgid> <command>`` per process of the job;
- ``kill``: the same, then ``SIGTERM`` to every such process and its process group, poll until
  they are gone or the grace period ends, ``SIGKILL`` to whatever is left, poll again (5 s), and
  print ``left <pid> <pgid> <command>`` for anything that survived.

It is how :meth:`RemoteJob.kill <airflow_hetero_gpu.launch.remote.RemoteJob.kill>` ends a job
and how :func:`find_orphans` / :func:`kill_orphans` clean up after a launcher that died
(SIGKILL, machine loss) without killing its job.
"""

from __future__ import annotations

import logging
import math
import re
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

import paramiko

from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.launch.command import (  # noqa: F401  (KILL_WAIT_S, SWEEP_SCRIPT: re-exported)
    KILL_WAIT_S,
    LIST_JOBS_SCRIPT,
    SWEEP_SCRIPT,
    validate_host_name,
    validate_job_id,
)

log = logging.getLogger(__name__)

ClientFactory = Callable[[SshTarget], paramiko.SSHClient]


@dataclass(frozen=True)
class RemoteProcess:
    """A process of a job on some host."""

    pid: int
    pgid: int
    command: str


@dataclass
class SweepResult:
    """What a sweep of one host found and, in kill mode, what survived it."""

    host: str
    found: list[RemoteProcess] = field(default_factory=list)
    left: list[RemoteProcess] = field(default_factory=list)
    error: str | None = None

    @property
    def clean(self) -> bool:
        """True when the sweep ran and nothing of the job is left on the host."""
        return self.error is None and not self.left


def sweep_command(job_id: str, host: str, *, kill: bool, grace: float = 10.0, signal: str | None = None) -> str:
    """The command line that lists (or kills) the job's processes on ``host``; with ``signal``
    (a name such as ``TERM`` or ``USR1``) it only sends that signal to them and their groups."""
    validate_job_id(job_id)
    validate_host_name(host)
    if grace < 0 or math.isnan(grace):
        raise ValueError(f"grace must be >= 0 seconds, got {grace!r}")
    ticks = int(math.ceil(grace * 10))
    mode = "signal" if signal else "kill" if kill else "list"
    args = [SWEEP_SCRIPT, "hetero-gpu-sweep", job_id, host, mode, str(ticks)]
    if signal:
        if not re.fullmatch(r"[A-Z][A-Z0-9+-]*", signal):
            raise ValueError(f"signal: expected a signal name such as TERM or USR1, got {signal!r}")
        args += ["", signal]
    return "sh -c " + " ".join(shlex.quote(a) for a in args)


def parse_sweep_output(host: str, text: str) -> SweepResult:
    """Turn the sweep's ``found``/``left`` lines into a :class:`SweepResult`."""
    result = SweepResult(host)
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        parts = rest.split(" ", 2)
        if kind not in ("found", "left") or len(parts) < 2 or not parts[0].isdigit() \
                or not parts[1].isdigit():
            continue
        proc = RemoteProcess(int(parts[0]), int(parts[1]), parts[2].strip() if len(parts) > 2 else "")
        (result.found if kind == "found" else result.left).append(proc)
    return result


def sweep_host(client: paramiko.SSHClient, job_id: str, host: str, *, kill: bool,
               grace: float = 10.0, signal: str | None = None) -> SweepResult:
    """Run the sweep on the host behind a connected ``client``; errors land in ``.error``."""
    command = sweep_command(job_id, host, kill=kill, grace=grace, signal=signal)
    timeout = grace + KILL_WAIT_S + 30.0
    try:
        _, stdout, stderr = client.exec_command(command, timeout=timeout)
        out = stdout.read().decode("utf-8", "replace")
        err = stderr.read().decode("utf-8", "replace").strip()
        status = stdout.channel.recv_exit_status()
    except Exception as exc:  # socket errors, SSHException, timeouts: one line for the report
        return SweepResult(host, error=f"sweep failed on {host}: {exc or type(exc).__name__}")
    result = parse_sweep_output(host, out)
    if status != 0:
        result.error = f"sweep exited with status {status} on {host}: {err.splitlines()[-1] if err else ''}"
    return result


def _sweep_targets(job_id: str, targets: Sequence[SshTarget], client_factory: ClientFactory, *,
                   kill: bool, grace: float, max_parallel: int) -> dict[str, SweepResult]:
    validate_job_id(job_id)

    def one(target: SshTarget) -> SweepResult:
        try:
            client = client_factory(target)
        except Exception as exc:
            return SweepResult(target.host_name, error=f"cannot connect to {target}: {exc}")
        try:
            return sweep_host(client, job_id, target.host_name, kill=kill, grace=grace)
        finally:
            client.close()

    if not targets:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(targets)))) as pool:
        results = list(pool.map(one, targets))
    return {r.host: r for r in results}


def find_orphans(job_id: str, targets: Sequence[SshTarget], client_factory: ClientFactory, *,
                 max_parallel: int = 8) -> dict[str, SweepResult]:
    """The processes of ``job_id`` still running on each target host (nothing is signalled).

    A host is matched by its ``host_name``: the name the job was launched under.
    """
    return _sweep_targets(job_id, targets, client_factory, kill=False, grace=0.0,
                          max_parallel=max_parallel)


def unstopped(results: dict[str, SweepResult]) -> list[str]:
    """The hosts of a kill sweep's ``results`` where something of the job may still run: the
    sweep could not reach them, or a process survived it."""
    return [host for host, result in results.items() if not result.clean]


def kill_orphans(job_id: str, targets: Sequence[SshTarget], client_factory: ClientFactory, *,
                 grace: float = 10.0, max_parallel: int = 8) -> dict[str, SweepResult]:
    """End every process of ``job_id`` on each target host: SIGTERM, ``grace`` s, SIGKILL.

    Each host's result lists what was found and what (if anything) survived; a host that could
    not be reached carries ``error``. Safe to call when nothing is running.
    """
    results = _sweep_targets(job_id, targets, client_factory, kill=True, grace=grace,
                             max_parallel=max_parallel)
    for result in results.values():
        if result.found:
            log.info("job %s on %s: ended %d process(es)%s", job_id, result.host, len(result.found),
                     f", {len(result.left)} survived" if result.left else "")
    return results


def jobs_on_host(client: paramiko.SSHClient, host: str, timeout: float = 30.0) -> set[str]:
    """The ids of the jobs with processes on the host behind ``client`` launched under ``host``."""
    validate_host_name(host)
    command = "sh -c " + " ".join(shlex.quote(a) for a in (LIST_JOBS_SCRIPT, "hetero-gpu-jobs", host))
    _, stdout, _ = client.exec_command(command, timeout=timeout)
    out = stdout.read().decode("utf-8", "replace")
    stdout.channel.recv_exit_status()
    jobs = set()
    for line in out.splitlines():
        if line.startswith("job "):
            try:
                jobs.add(validate_job_id(line[4:].strip()))
            except ValueError:  # not a job id this package would have launched
                continue
    return jobs


@dataclass
class HostOrphans:
    """One host's part of :func:`sweep_unreserved`: each orphaned job's sweep, or why none ran."""

    host: str
    swept: dict[str, SweepResult] = field(default_factory=dict)
    error: str | None = None


def sweep_unreserved(targets: Sequence[SshTarget], client_factory: ClientFactory,
                     live_jobs: Callable[[], set[str]], *, grace: float = 10.0,
                     max_parallel: int = 8) -> dict[str, HostOrphans]:
    """End, on every target host, the processes of each job that holds no live reservation.

    A job launched by the operator always holds its reservation while its processes run (it
    reserves before it launches and releases after they ended), so processes of any other job id
    are leftovers: their task died and their watchdog could not end them. ``live_jobs()`` returns
    the ledger's live job ids; it is asked after each host's listing, so a job that reserved and
    launched meanwhile is never taken for an orphan.
    """

    def one(target: SshTarget) -> HostOrphans:
        out = HostOrphans(target.host_name)
        try:
            client = client_factory(target)
        except Exception as exc:
            out.error = f"cannot connect to {target}: {exc}"
            return out
        try:
            found = jobs_on_host(client, target.host_name)
            for job_id in sorted(found - set(live_jobs()) if found else ()):
                out.swept[job_id] = sweep_host(client, job_id, target.host_name, kill=True, grace=grace)
        except Exception as exc:  # socket errors, SSHException, timeouts: one line for the report
            out.error = f"orphan sweep failed on {target.host_name}: {exc or type(exc).__name__}"
        finally:
            client.close()
        return out

    if not targets:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(targets)))) as pool:
        return {r.host: r for r in pool.map(one, targets)}


__all__ = [
    "HostOrphans", "KILL_WAIT_S", "RemoteProcess", "SWEEP_SCRIPT", "SweepResult", "find_orphans", "jobs_on_host",
    "kill_orphans", "parse_sweep_output", "sweep_command", "sweep_host", "sweep_unreserved", "unstopped",
]
