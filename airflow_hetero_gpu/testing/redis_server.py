"""A private Redis server for tests (the Celery broker): ``redis-server`` on a loopback port.

The server runs in the foreground as a child process with its own directory (no persistence:
no RDB snapshots, no append-only file), listens only on 127.0.0.1 and a free port, and is
stopped (SIGTERM, then SIGKILL) and its directory deleted at the end::

    with RedisServer() as redis:
        broker = redis.url(0)          # redis://127.0.0.1:PORT/0

The binary is ``$HETERO_GPU_REDIS_SERVER`` when set, else ``redis-server`` on ``PATH``, else
``/usr/bin/redis-server`` (Debian's ``redis-server`` package). Readiness is the server's own
log line ``Ready to accept connections``, not a sleep.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

READY = "Ready to accept connections"


class RedisUnavailable(RuntimeError):
    """No ``redis-server`` binary on this machine."""


def find_redis_server() -> str:
    """The path of ``redis-server``, or :class:`RedisUnavailable` saying how to install it."""
    for candidate in (os.environ.get("HETERO_GPU_REDIS_SERVER"), shutil.which("redis-server"), "/usr/bin/redis-server"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RedisUnavailable("redis-server not found on PATH, in $HETERO_GPU_REDIS_SERVER or at /usr/bin/redis-server; "
                           "install it with: apt-get install -y redis-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One throw-away Redis server; a context manager."""

    def __init__(self, root: Path | None = None, start_timeout: float = 60.0):
        self.binary = find_redis_server()
        self._given_root = root
        self.root: Path | None = None
        self.port: int | None = None
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        assert self.root is not None
        return self.root / "redis.log"

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.root and self.log_path.exists() else ""

    def start(self) -> "RedisServer":
        self.root = Path(self._given_root or tempfile.mkdtemp(prefix="hetero-gpu-redis-"))
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            for _ in range(5):  # the free port may be taken between probing and binding
                self.port = _free_port()
                self.log_path.write_text("")
                self.proc = subprocess.Popen(
                    [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.root),
                     "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", str(self.log_path),
                     "--protected-mode", "yes"],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                    cwd=self.root, start_new_session=True)
                if self._wait_ready():
                    return self
                self._terminate()
            raise RuntimeError(f"redis-server did not start: {self.log()[-2000:]}")
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if READY in self.log():
                return True
            if self.proc is not None and self.proc.poll() is not None:
                return False  # exited: most likely the port was taken meanwhile
            time.sleep(0.05)
        return False

    def _terminate(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop the server and delete its directory (unless it was given). Safe to call twice."""
        self._terminate()
        if self.root is not None and self._given_root is None:
            shutil.rmtree(self.root, ignore_errors=True)
        self.root = None if self._given_root is None else self.root

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
