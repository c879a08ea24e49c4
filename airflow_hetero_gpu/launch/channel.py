"""The channel pump: one worker's SSH channel, from its command to its exit status.

A :class:`HostRun` opens a session channel on the worker's connection (``exec``, no pty),
starts the command, sends the worker's ``stdin`` bytes (a payload file, see
:mod:`airflow_hetero_gpu.launch.command`) and then leaves the channel's stdin open for the
rest of the job (the host's watchdog reads end of file there as "the session is gone"). One
thread per stream reads lines as they come, takes the ``HETERO_GPU_PGID=`` line out of stdout,
replaces torchrun's traceback of a stop by a signal with one line
(:mod:`airflow_hetero_gpu.launch.tracebacks`), keeps the last ``tail_lines`` lines (at most ``max_line_bytes`` each) and hands every line to
``on_line(host, rank, stream, line)``; when both streams closed, the stdout thread collects the
exit status and calls ``on_end(run)`` once.

A run ends exactly once, through :meth:`HostRun.end`: either there (the command exited, or the
connection dropped) or when the liveness check gives up on a silent host
(:mod:`airflow_hetero_gpu.launch.liveness`); whichever comes second changes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import paramiko

from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.launch.command import parse_pgid_line
from airflow_hetero_gpu.launch.failures import looks_like_error
from airflow_hetero_gpu.launch.results import HostResult
from airflow_hetero_gpu.launch.tracebacks import SignalTracebackFilter

log = logging.getLogger(__name__)

#: ``on_line(host, rank, stream, line)``; ``stream`` is ``"stdout"`` or ``"stderr"``.
LineCallback = Callable[[str, int, str, str], None]
STREAMS = ("stdout", "stderr")


@dataclass(frozen=True)
class Worker:
    """One host's process of a job: where (SSH target), which node rank, what command, and the
    bytes its command reads from stdin first (``LaunchSpec.payload``; empty for none)."""

    target: SshTarget
    rank: int
    command: str
    stdin: bytes = b""
    relayed: tuple[int, int] = (0, 0)  # bytes of stdout/stderr an earlier watcher relayed (reattach)

    @property
    def host(self) -> str:
        return self.target.host_name


class HostRun:
    """The SSH channel of one worker, its reader threads and what they saw."""

    def __init__(self, worker: Worker, client: paramiko.SSHClient, *, tail_lines: int,
                 max_line_bytes: int, on_line: LineCallback, on_end: Callable[["HostRun"], None]):
        self.worker = worker
        self.client = client
        self.channel: paramiko.Channel | None = None
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self.max_line_bytes = max_line_bytes
        self.on_line = on_line
        self.on_end = on_end
        self.pgid: int | None = None
        self.started = 0.0
        self.ended: float | None = None
        self.exit_code: int | None = None
        self.error: str | None = None
        self.first_error: str | None = None  # the first stderr line that reads like an error
        self.done = threading.Event()
        self.threads: list[threading.Thread] = []
        self.last_alive = time.monotonic()  # the host's last answer to a keepalive
        self.relayed = list(worker.relayed)  # bytes of the job's stdout/stderr handed to on_line
        #: ``heartbeat(run, transport)``, called after each keepalive answer (supervised jobs)
        self.heartbeat: Callable[["HostRun", Any], None] | None = None
        self.lost = False                   # silent for too long: given up on
        self.detached = False               # the watcher let go: no further line is handed on
        self._end_lock = threading.Lock()
        self._relay_lock = threading.Lock()  # a line handed on and counted, or neither

    @property
    def host(self) -> str:
        return self.worker.host

    def result(self) -> HostResult:
        end = self.ended if self.ended is not None else time.monotonic()
        return HostResult(self.worker.host, self.worker.rank, self.exit_code,
                          max(0.0, end - self.started) if self.started else 0.0,
                          list(self.tail), self.pgid, self.error, self.first_error)

    # -- start ---------------------------------------------------------------------------------

    def start(self, name: str) -> list[threading.Thread]:
        """Open the channel, start the command, send the stdin bytes, start the two readers.
        ``name`` prefixes the threads' names. Raises when the command could not be started."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionError("SSH connection closed")
        channel = transport.open_session()
        self.started = time.monotonic()
        try:
            channel.exec_command(self.worker.command)
            if self.worker.stdin:
                channel.sendall(self.worker.stdin)
        except BaseException:
            channel.close()
            raise
        self.channel = channel
        stdout = channel.makefile("rb")
        stderr = channel.makefile_stderr("rb")
        err_thread = threading.Thread(target=self._read, args=("stderr", stderr), daemon=True,
                                      name=f"{name}:{self.host}:stderr")
        out_thread = threading.Thread(target=self._read_and_finish, args=(stdout, err_thread),
                                      daemon=True, name=f"{name}:{self.host}:stdout")
        self.threads = [out_thread, err_thread]
        err_thread.start()
        out_thread.start()
        return self.threads

    # -- reading -------------------------------------------------------------------------------

    def _read(self, stream: str, handle: Any) -> None:
        # The PGID line is the program's first, but a login shell's rc files may print before it.
        look_for_pgid = stream == "stdout"
        index = STREAMS.index(stream)
        tracebacks = SignalTracebackFilter(self.worker.host)  # torchrun's own, when it is stopped
        try:
            while True:
                raw = handle.readline(self.max_line_bytes)
                if not raw:
                    return
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if look_for_pgid:
                    pgid = parse_pgid_line(line)
                    if pgid is not None:
                        self.pgid = pgid
                        look_for_pgid = False
                        continue
                self._hand_on(stream, index, tracebacks.feed(line, len(raw)))
        except Exception as exc:  # the connection dropped mid-read
            self.error = self.error or f"output stream lost: {exc or type(exc).__name__}"
        finally:
            self._hand_on(stream, index, tracebacks.close())

    def _hand_on(self, stream: str, index: int, lines: list[tuple[str, int]]) -> None:
        """Keep and pass on lines the traceback filter let through; count their bytes as relayed."""
        with self._relay_lock:
            if not self.detached:
                self._hand_on_locked(stream, index, lines)

    def detach(self) -> tuple[int, int]:
        """Hand on no further line; the bytes relayed so far (the next watcher's offsets)."""
        with self._relay_lock:
            self.detached = True
            return self.relayed[0], self.relayed[1]

    def _hand_on_locked(self, stream: str, index: int, lines: list[tuple[str, int]]) -> None:
        for line, nbytes in lines:
            self.tail.append(line)
            if self.first_error is None and stream == "stderr" and looks_like_error(line):
                self.first_error = " ".join(line.split())[:500]
            try:
                self.on_line(self.worker.host, self.worker.rank, stream, line)
            except Exception:  # a broken callback must not stop the reading
                log.exception("on_line callback failed for %s", self.worker.host)
            self.relayed[index] += nbytes

    def _read_and_finish(self, stdout: Any, err_thread: threading.Thread) -> None:
        self._read("stdout", stdout)
        err_thread.join()
        assert self.channel is not None
        status = self.channel.recv_exit_status()
        if status >= 0:
            self.end(exit_code=status)
        else:
            self.end(error="no exit status (connection lost or process killed by a signal)")

    # -- the end -------------------------------------------------------------------------------

    def end(self, *, exit_code: int | None = None, error: str | None = None, lost: bool = False) -> bool:
        """Record how the run ended, once: True for the call that ended it, False after that.
        A recorded ``error`` wins over a later one; ``on_end`` is called after the record."""
        with self._end_lock:
            if self.done.is_set():
                return False
            self.ended = time.monotonic()
            self.exit_code = exit_code
            if lost:
                self.lost = True
                self.error = error
            elif error is not None:
                self.error = self.error or error
            self.done.set()
        self.on_end(self)
        return True


__all__ = ["HostRun", "LineCallback", "STREAMS", "Worker"]
