"""The job of many hosts: run one process per host over SSH, stream their output, and stop
them all together.

:class:`RemoteJob` takes one :class:`Worker` per host (an SSH target, a node rank and the
command from :mod:`airflow_hetero_gpu.launch.command`) and

- connects to every host first (in parallel, at most ``max_parallel`` at once), so that a host
  that cannot be reached fails the start before anything runs (:class:`JobStartError`);
- starts each command on its own SSH channel (``exec``, no pty) and reads its stdout and stderr
  in one thread each, calling ``on_line(host, rank, stream, line)`` for every line as it comes
  (without a callback, lines go to this module's logger as ``[host/rank] line``) and
  keeping only the last ``tail_lines`` lines per host (and at most ``max_line_bytes`` per line):
  the channel pump, :mod:`airflow_hetero_gpu.launch.channel`;
- waits for every host; the first host that exits non-zero becomes the job's
  :class:`JobFailure`, and every host's processes are then ended (see :meth:`RemoteJob.kill`);
- asks each host's sshd for a keepalive answer every ``keepalive_interval`` seconds; a host that
  answers nothing for ``host_timeout`` seconds (its network went quiet, the machine froze) is
  given up on as failed, like a host whose process exited non-zero
  (:mod:`airflow_hetero_gpu.launch.liveness`). A host whose session is
  gone ends its share of the job by itself (the watchdog of
  :mod:`airflow_hetero_gpu.launch.command`), even when no sweep can reach it;
- :meth:`RemoteJob.kill` ends the job on every host: the orphan sweep of
  :mod:`airflow_hetero_gpu.launch.orphans` sends SIGTERM to each of the job's process groups,
  waits ``kill_grace`` seconds, then sends SIGKILL. It is idempotent and may be called from any
  thread (Airflow calls ``on_kill`` from another thread than ``execute``).

:func:`torchrun_job` builds the whole thing for a torchrun launch: rendezvous port
(:mod:`airflow_hetero_gpu.launch.ports`), one command per host, the job. What a job hands back
is in :mod:`airflow_hetero_gpu.launch.results`, how it fails in
:mod:`airflow_hetero_gpu.launch.failures`; both are re-exported here.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import paramiko

from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.launch.channel import HostRun, LineCallback, Worker
from airflow_hetero_gpu.launch.command import HostShare, LaunchSpec, build_commands, validate_job_id
from airflow_hetero_gpu.launch.failures import JobFailure, JobKilled, JobStartError, summarize_tail
from airflow_hetero_gpu.launch.liveness import give_up_silent, start_keepalive
from airflow_hetero_gpu.launch.orphans import KILL_WAIT_S, ClientFactory, SweepResult, sweep_host
from airflow_hetero_gpu.launch.ports import DEFAULT_PORT_RANGE, choose_rdzv_port
from airflow_hetero_gpu.launch.results import HostResult, JobResult
from airflow_hetero_gpu.launch import supervisor
from airflow_hetero_gpu.launch.supervisor import Supervision
from airflow_hetero_gpu.launch.workers_watch import WorkersWatch

log = logging.getLogger(__name__)


class RemoteJob:
    """A distributed job: one process per host over SSH, ended together."""

    def __init__(self, job_id: str, workers: Sequence[Worker], client_factory: ClientFactory, *,
                 on_line: LineCallback | None = None, tail_lines: int = 200,
                 kill_grace: float = 10.0, max_parallel: int = 8, max_line_bytes: int = 64 * 1024,
                 keepalive_interval: float = 15.0, host_timeout: float = 60.0,
                 supervision: Supervision | None = None,
                 heartbeat_budget: Callable[[], float] | None = None):
        validate_job_id(job_id)
        if not workers:
            raise ValueError("a job needs at least one worker")
        hosts = [w.host for w in workers]
        if len(set(hosts)) != len(hosts):
            raise ValueError(f"a host appears twice in job {job_id}: {hosts}")
        if tail_lines < 1 or max_line_bytes < 1 or max_parallel < 1 or kill_grace < 0:
            raise ValueError("tail_lines, max_line_bytes, max_parallel must be >= 1 and kill_grace >= 0")
        if not 0 < keepalive_interval < host_timeout:
            raise ValueError(f"need 0 < keepalive_interval < host_timeout, got {keepalive_interval!r} "
                             f"and {host_timeout!r}")
        self.job_id = job_id
        self.workers = list(workers)
        self.client_factory = client_factory
        self.on_line = on_line
        self.tail_lines = tail_lines
        self.kill_grace = kill_grace
        self.max_parallel = max_parallel
        self.max_line_bytes = max_line_bytes
        self.keepalive_interval = float(keepalive_interval)
        self.host_timeout = float(host_timeout)
        #: a supervised (detached) job: heartbeats to each host's dead-man switch, whose
        #: seconds are ``min(unattended_timeout, heartbeat_budget())`` (the lease's time left)
        self.supervision = supervision
        self.heartbeat_budget = heartbeat_budget
        #: the watcher removes the hosts' run files once it has the job's end (a trigger leaves
        #: them to the task it wakes, which reads the exit statuses there)
        self.remove_run_files = True
        self._beats = itertools.count(1)
        self._beat_id = uuid.uuid4().hex[:12]
        self._runs: list[HostRun] = []
        self._events: queue.Queue[HostRun] = queue.Queue()
        self._lock = threading.Lock()
        self._started = False
        self._stopping = False          # no new command may start once this is set
        self._killed = False            # kill() was asked for (not a failure clean-up)
        self._signalled = False         # signal() was sent: hosts exiting now is no failure
        self._kill_thread: threading.Thread | None = None
        self._cleanup: dict[str, SweepResult] = {}
        self._failure: JobFailure | None = None
        self._t0 = 0.0
        self._result: JobResult | None = None

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> "RemoteJob":
        """Connect to every host, then start every command.

        Raises :class:`JobStartError` (after ending whatever had started) when a host cannot be
        reached or refuses the command. When :meth:`kill` comes first, nothing more starts and
        :meth:`wait` reports the job as killed.
        """
        with self._lock:
            if self._started:
                raise RuntimeError(f"job {self.job_id} was already started")
            self._started = True
        self._t0 = time.monotonic()
        clients = self._connect_all()
        runs = [HostRun(w, clients[w.host], tail_lines=self.tail_lines, max_line_bytes=self.max_line_bytes,
                        on_line=self.on_line or self._log_line, on_end=self._events.put)
                for w in self.workers]
        error: JobStartError | None = None
        with self._lock:
            self._runs = runs
        for run in runs:
            with self._lock:
                if self._stopping:
                    break
                try:
                    self._exec(run)
                except Exception as exc:
                    self._stopping = True
                    error = JobStartError(run.worker.host, f"{exc or type(exc).__name__}")
                    break
        if error is not None:
            self._end_all()
            self._close_clients()
            raise error
        return self

    def _connect_all(self) -> dict[str, paramiko.SSHClient]:
        def connect(worker: Worker) -> tuple[Worker, paramiko.SSHClient | None, str | None]:
            try:
                return worker, self.client_factory(worker.target), None
            except Exception as exc:
                return worker, None, f"{exc or type(exc).__name__}"

        with ThreadPoolExecutor(max_workers=min(self.max_parallel, len(self.workers))) as pool:
            outcomes = list(pool.map(connect, self.workers))
        clients = {w.host: c for w, c, _ in outcomes if c is not None}
        errors = [(w, e) for w, c, e in outcomes if c is None]
        if errors:
            for client in clients.values():
                client.close()
            worker, reason = errors[0]
            raise JobStartError(worker.host, reason or "connection failed")
        return clients

    def _exec(self, run: HostRun) -> None:
        if self.supervision is not None:
            run.heartbeat = self._heartbeat
        run.start(self.job_id)
        start_keepalive(run, self.keepalive_interval, self.job_id)

    def _heartbeat(self, run: HostRun, transport: Any) -> None:
        """Tell ``run``'s supervisor the job is watched (and how far its output was relayed)."""
        sup = self.supervision
        assert sup is not None
        seconds = sup.unattended_timeout
        if self.heartbeat_budget is not None:
            seconds = min(seconds, self.heartbeat_budget())
        command = supervisor.heartbeat_command(self.job_id, run.host, sup.launch, f"{self._beat_id}-{next(self._beats)}",
                                               max(1, int(seconds)), (run.relayed[0], run.relayed[1]))
        supervisor.quick_exec(transport, command)

    def _log_line(self, host: str, rank: int, stream: str, line: str) -> None:
        log.info("[%s/%d] %s", host, rank, line)

    # -- waiting -------------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> JobResult:
        """Block until every host's process ended; return the :class:`JobResult`.

        The first host to exit non-zero (or to vanish) before any kill becomes ``failure``,
        and the job is then ended everywhere. ``TimeoutError`` when ``timeout`` seconds pass
        first (the job keeps running).
        """
        if self._result is not None:
            return self._result
        if not self._started:
            raise RuntimeError(f"job {self.job_id} was not started")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            runs = list(self._runs)
        pending = {id(r) for r in runs if r.channel is not None and not r.done.is_set()}
        for run in runs:
            if run.done.is_set():
                self._note_end(run)
        while pending:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"job {self.job_id} still running after {timeout} s")
            try:
                run = self._events.get(timeout=1.0 if left is None else min(left, 1.0))
            except queue.Empty:
                give_up_silent(runs, self.host_timeout, self.job_id)
                continue
            if id(run) not in pending:
                continue
            pending.discard(id(run))
            self._note_end(run)
        if self._kill_thread is not None:
            self._kill_thread.join()
        if self.supervision is not None and self.remove_run_files:
            self._remove_run_files(runs)
        self._close_clients()
        for run in runs:
            if run.channel is None:
                run.error = run.error or "not started: the job was being ended"
        self._result = JobResult(
            self.job_id, [r.result() for r in runs], time.monotonic() - self._t0,
            failure=self._failure, killed=self._killed, cleanup=dict(self._cleanup),
        )
        return self._result

    def run(self, timeout: float | None = None) -> JobResult:
        """Start, wait, and raise :class:`JobFailure` / :class:`JobKilled` unless all exit 0."""
        self.start()
        try:
            result = self.wait(timeout)
        except BaseException:
            self.kill()
            raise
        return result.raise_for_failure()

    def _note_end(self, run: HostRun) -> None:
        code = run.exit_code
        log.debug("job %s: %s exited with %s", self.job_id, run.worker.host, code)
        if code == 0:
            return
        with self._lock:
            if self._stopping or self._signalled:
                return
            self._failure = JobFailure(run.worker.host, run.worker.rank, code, list(run.tail), run.error)
            self._stopping = True
        log.warning("job %s: %s; ending it on every host", self.job_id, self._failure)
        self._start_ending()

    # -- ending --------------------------------------------------------------------------------

    def kill(self) -> None:
        """End the job's processes on every host; idempotent, callable from any thread.

        Blocks until every host has been swept (at most about ``kill_grace`` + 5 s plus the
        SSH round trips). No new command starts once kill has begun, and a process that was
        still starting is swept again once it shows up.
        """
        with self._lock:
            if self._result is not None:
                return
            first = not self._stopping
            self._stopping = True
            if first:
                finished = bool(self._runs) and all(r.done.is_set() for r in self._runs)
                self._killed = not finished
        if first:
            self._start_ending()
        with self._lock:
            thread = self._kill_thread
        if thread is not None:
            thread.join()

    def signal(self, name: str = "TERM") -> dict[str, SweepResult]:
        """Send signal ``name`` to the job's processes (and their groups) on every started host,
        over the job's own connections, without waiting for them to exit. From then on a host
        that exits is not a failure: the caller waits (:meth:`wait`) and kills what is left."""
        with self._lock:
            self._signalled = True
            runs = [r for r in self._runs if r.channel is not None and not r.done.is_set()]
        if not runs:
            return {}

        def one(run: HostRun) -> SweepResult:
            return sweep_host(run.client, self.job_id, run.worker.host, kill=False, signal=name)

        with ThreadPoolExecutor(max_workers=min(self.max_parallel, len(runs))) as pool:
            return {r.host: r for r in pool.map(one, runs)}

    def detach(self) -> dict[str, tuple[int, int]]:
        """Stop watching a supervised job without stopping it: no further line is relayed, each
        host's supervisor hears a last heartbeat with the offsets relayed so far (where the next
        watcher goes on), and the connections close (the job runs on under its dead-man switch).
        Returns those offsets by host."""
        if self.supervision is None:
            raise RuntimeError(f"job {self.job_id} is not supervised: it cannot outlive its watcher")
        with self._lock:
            self._stopping = True  # the channels closing now is no failure, and nothing is swept
            runs = list(self._runs)
        offsets = {run.host: run.detach() for run in runs}
        for run in runs:
            transport = run.client.get_transport()
            if run.channel is None or run.done.is_set() or transport is None or not transport.is_active():
                continue
            try:
                self._heartbeat(run, transport)
            except Exception as exc:  # noqa: BLE001 - the last heartbeat's offsets stand (lines repeat)
                log.warning("job %s: the last heartbeat to %s failed: %s", self.job_id, run.host, exc)
        self._close_clients()
        return offsets

    def watch_workers(self, seconds: float) -> WorkersWatch:
        """Start watching the torchrun workers of every running host (before :meth:`signal`):
        when the script itself ended, apart from torchrun (:mod:`~.workers_watch`)."""
        with self._lock:
            runs = [r for r in self._runs if r.channel is not None and not r.done.is_set()]
        return WorkersWatch(self.job_id, [(r.host, r.client) for r in runs], seconds).start()

    def _start_ending(self) -> None:
        with self._lock:
            if self._kill_thread is not None:
                return
            self._kill_thread = threading.Thread(target=self._end_all_guarded, daemon=True,
                                                 name=f"{self.job_id}:kill")
            self._kill_thread.start()

    def _end_all_guarded(self) -> None:
        try:
            self._end_all()
        except Exception:
            log.exception("job %s: ending the job failed", self.job_id)

    def _end_all(self) -> None:
        """Sweep every started host (TERM, grace, KILL), wait for the channels to close, and
        sweep again where one stays open (a process that was still starting)."""
        started = [r for r in self._runs if r.channel is not None]
        if not started:
            return
        self._sweep(started, self.kill_grace)
        deadline = time.monotonic() + KILL_WAIT_S + 5.0
        for attempt in range(2):
            for run in started:
                run.done.wait(timeout=max(0.0, deadline - time.monotonic()))
            still_open = [r for r in started if not r.done.is_set()]
            if not still_open:
                return
            if attempt == 0:
                self._sweep(still_open, 0.0)
                deadline = time.monotonic() + KILL_WAIT_S + 5.0
        for run in started:
            if not run.done.is_set() and run.channel is not None:
                log.warning("job %s: %s did not end; closing its channel", self.job_id, run.worker.host)
                run.error = run.error or "did not end after SIGKILL; channel closed"
                run.channel.close()

    def _sweep(self, runs: Iterable[HostRun], grace: float) -> None:
        runs = list(runs)

        def one(run: HostRun) -> SweepResult:
            host = run.worker.host
            transport = run.client.get_transport()
            if run.lost:  # its connection hangs: drop it, and try a fresh one (bounded by the
                run.client.close()  # connect timeouts) in case only the old one is stuck
            elif transport is not None and transport.is_active():
                return sweep_host(run.client, self.job_id, host, kill=True, grace=grace)
            try:  # the job's connection is gone (network blip, host rebooting): try a new one
                client = self.client_factory(run.worker.target)
            except Exception as exc:
                return SweepResult(host, error=f"cannot reconnect to {run.worker.target}: {exc}")
            try:
                return sweep_host(client, self.job_id, host, kill=True, grace=grace)
            finally:
                client.close()

        with ThreadPoolExecutor(max_workers=min(self.max_parallel, len(runs))) as pool:
            for result in pool.map(one, runs):
                self._cleanup[result.host] = result
                if result.error or result.left:
                    log.warning("job %s: sweep of %s: %s", self.job_id, result.host,
                                result.error or f"{len(result.left)} process(es) survived SIGKILL")

    def unstopped(self) -> list[str]:
        """The hosts where a share of the job may still run (after :meth:`kill` or :meth:`wait`):
        started there, and neither seen to end (an exit status) nor swept clean (not reachable)."""
        with self._lock:
            runs, cleanup = list(self._runs), dict(self._cleanup)
        lost_exit = supervisor.SUPERVISOR_LOST_EXIT if self.supervision is not None else None
        return [r.host for r in runs if r.channel is not None and (
            not cleanup[r.host].clean if r.host in cleanup else r.exit_code in (None, lost_exit))]

    def may_still_run(self) -> list[str]:
        """The hosts where the job may still run after its stop: :meth:`unstopped` for a supervised
        job; none for one that is not (each host's watchdog ends it with its session)."""
        return self.unstopped() if self.supervision is not None else []

    def _remove_run_files(self, runs: Sequence[HostRun]) -> None:
        """The job ended on every host: its supervisors' files go (where the connection is up)."""
        assert self.supervision is not None
        for run in runs:
            transport = run.client.get_transport()
            if run.channel is None or run.exit_code is None or transport is None or not transport.is_active():
                continue
            try:
                supervisor.quick_exec(transport, supervisor.cleanup_command(self.job_id, run.host,
                                                                            self.supervision.launch))
            except Exception as exc:  # noqa: BLE001 - files left behind are removed by the next launch
                log.warning("job %s: removing its run files on %s failed: %s", self.job_id, run.host, exc)

    def _close_clients(self) -> None:
        for run in self._runs:
            try:
                run.client.close()
            except Exception:
                pass

    # -- introspection -------------------------------------------------------------------------

    @property
    def pgids(self) -> dict[str, int | None]:
        """Each host's process group id, as its command reported it (None until it did)."""
        return {r.worker.host: r.pgid for r in self._runs}

    def __enter__(self) -> "RemoteJob":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._result is None:
            self.kill()
            self.wait()


# --------------------------------------------------------------------------------------------
# Building a torchrun job
# --------------------------------------------------------------------------------------------

Placement = tuple[SshTarget, Sequence[int | str]]


def placements_from_decision(decision: Any, targets: Mapping[str, SshTarget]) -> list[Placement]:
    """Each host of a planner ``Decision`` with its chosen GPUs (indices, or the ``MIG-<uuid>``
    of a MIG instance), in the decision's host order, which is its rank order along the network
    tree (the first host serves the rendezvous); ``targets`` maps host names to SSH targets."""
    by_host: dict[str, list[int | str]] = {}
    for gpu in decision.gpus:
        device = gpu.cuda_device if getattr(gpu, "instance", None) is not None else int(gpu.index)
        by_host.setdefault(gpu.host, []).append(device)
    missing = [h for h in by_host if h not in targets]
    if missing:
        raise ValueError(f"no SSH target for host(s) {', '.join(missing)}")
    return [(targets[host], tuple(sorted(devices, key=str) if any(isinstance(d, str) for d in devices)
                                  else sorted(devices))) for host, devices in by_host.items()]


def torchrun_job(spec: LaunchSpec, placements: Sequence[Placement], client_factory: ClientFactory, *,
                 rdzv_port: int | Literal["probe", "derive"] = "probe",
                 port_range: tuple[int, int] = DEFAULT_PORT_RANGE,
                 rdzv_address: str | None = None, supervision: Supervision | None = None,
                 **job_options: Any) -> RemoteJob:
    """A :class:`RemoteJob` running ``spec`` on the placements (SSH target, GPU indices), in
    node-rank order. The rendezvous runs on the first host at ``rdzv_address`` (default: its
    SSH address). ``job_options`` go to :class:`RemoteJob` (``on_line``, ``kill_grace``, ...)."""
    if not placements:
        raise ValueError("a job needs at least one host")
    shares = [
        HostShare(target.host_name, rdzv_address if (i == 0 and rdzv_address) else target.address,
                  tuple(gpus))
        for i, (target, gpus) in enumerate(placements)
    ]
    port = choose_rdzv_port(spec.job_id, placements[0][0], client_factory, rdzv_port, port_range)
    commands = build_commands(spec, shares, port, supervision)
    workers = [Worker(target, rank, command, stdin=spec.payload or b"")
               for rank, ((target, _), command) in enumerate(zip(placements, commands))]
    return RemoteJob(spec.job_id, workers, client_factory, supervision=supervision, **job_options)


def attach_job(job_id: str, targets: Sequence[SshTarget], client_factory: ClientFactory, supervision: Supervision,
               relayed: Mapping[str, tuple[int, int]] | None = None, **job_options: Any) -> RemoteJob:
    """A :class:`RemoteJob` that reattaches to a supervised job already running on ``targets``
    (node-rank order): nothing is started; each host relays the job's output from the offsets
    the last watcher relayed (``relayed``, host -> (stdout, stderr) bytes) and reports its end."""
    relayed = relayed or {}
    workers = [Worker(t, rank, supervisor.follow_command(job_id, t.host_name), relayed=relayed.get(t.host_name, (0, 0)))
               for rank, t in enumerate(targets)]
    return RemoteJob(job_id, workers, client_factory, supervision=supervision, **job_options)


__all__ = [
    "HostResult", "JobFailure", "JobKilled", "JobResult", "JobStartError", "LineCallback",
    "Placement", "RemoteJob", "Worker", "attach_job", "choose_rdzv_port", "placements_from_decision",
    "summarize_tail", "torchrun_job",
]
