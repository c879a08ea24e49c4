"""A private PostgreSQL server for tests and demos: ``initdb`` + ``pg_ctl`` in a temporary directory.

The server listens on a free port of 127.0.0.1 (and on a Unix socket inside its own directory),
trusts local connections, runs with fsync off, and is stopped and deleted at the end. It never
touches a system-wide cluster.

``initdb`` refuses to run as root. When the current user is root, the server runs as an
unprivileged account instead: ``$HETERO_GPU_PG_USER`` when set, else ``postgres`` (created by
Debian's ``postgresql`` package), else ``nobody``.

Binaries are looked up in ``$HETERO_GPU_PG_BIN``, then on ``PATH``, then under
``/usr/lib/postgresql/<version>/bin`` (newest first).

The test suite's fixtures around it (``postgres_url``, ``ledger_db_url``) are in
``tests/postgres_fixtures.py``; this module imports no pytest.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

SUPERUSER = "ledger"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def find_bin_dir() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``."""
    env = os.environ.get("HETERO_GPU_PG_BIN")
    candidates: list[Path] = [Path(env)] if env else []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)

    def version(path: str) -> tuple[int, ...]:
        name = Path(path).parent.parent.name
        return tuple(int(p) for p in name.split(".") if p.isdigit())

    candidates += [
        Path(p).parent for p in sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version, reverse=True)
    ]
    for c in candidates:
        if (c / "initdb").is_file() and (c / "pg_ctl").is_file():
            return c
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH, in $HETERO_GPU_PG_BIN or under "
        "/usr/lib/postgresql/*/bin; install them with: apt-get install -y postgresql"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _service_account() -> pwd.struct_passwd | None:
    """The account to run the server as, or None to run as the current (non-root) user."""
    if os.geteuid() != 0:
        return None
    for name in filter(None, (os.environ.get("HETERO_GPU_PG_USER"), "postgres", "nobody")):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PostgresUnavailable("running as root and no unprivileged account (postgres, nobody) to run initdb as")


class PostgresServer:
    """One throw-away PostgreSQL server. Use as a context manager, or call start() and stop()."""

    def __init__(self, bin_dir: Path | None = None):
        self.bin_dir = bin_dir or find_bin_dir()
        self.account = _service_account()
        self.port: int | None = None
        self.root: Path | None = None
        self._owner_pid = os.getpid()

    # --- lifecycle ---------------------------------------------------------------------------
    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        kwargs: dict = {}
        if self.account is not None:
            kwargs.update(user=self.account.pw_uid, group=self.account.pw_gid, extra_groups=[])
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
        proc = subprocess.run(
            [str(self.bin_dir / args[0]), *args[1:]], capture_output=True, text=True, env=env,
            cwd=str(self.root), **kwargs,
        )
        if check and proc.returncode != 0:
            log = self._log_tail()
            raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stderr.strip()} {log}".strip())
        return proc

    def _log_tail(self) -> str:
        if self.root and (self.root / "server.log").exists():
            return (self.root / "server.log").read_text(errors="replace")[-2000:]
        return ""

    def start(self) -> "PostgresServer":
        # Another account must be able to reach the directory: /tmp rather than a private $TMPDIR.
        parent = "/tmp" if self.account is not None and os.path.isdir("/tmp") else None
        self.root = Path(tempfile.mkdtemp(prefix="hetero-gpu-pg-", dir=parent))
        if self.account is not None:
            os.chown(self.root, self.account.pw_uid, self.account.pw_gid)
        os.chmod(self.root, 0o700)
        try:
            self._run("initdb", "-D", str(self.root / "data"), "-U", SUPERUSER, "--auth=trust",
                      "-E", "UTF8", "--locale=C", "--no-sync")
            last_error = None
            for _ in range(5):  # the free port may be taken between probing and binding
                self.port = _free_port()
                options = " ".join([
                    "-h 127.0.0.1", f"-p {self.port}", f"-k {self.root}",
                    "-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off",
                    "-c max_connections=200", "-c shared_buffers=32MB",
                ])
                self._options = options
                proc = self._pg_ctl_start()
                if proc.returncode == 0:
                    return self
                last_error = f"pg_ctl start failed: {proc.stderr.strip()} {self._log_tail()}"
            raise RuntimeError(last_error)
        except BaseException:
            self.stop()
            raise

    def _pg_ctl_start(self) -> subprocess.CompletedProcess:
        return self._run("pg_ctl", "-D", str(self.root / "data"), "-l", str(self.root / "server.log"),
                         "-o", self._options, "-w", "-t", "60", "start", check=False)

    def restart(self, down_seconds: float = 0.0, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl -m fast``: every client connection is cut), stay down for
        ``down_seconds``, and start it again on the same port with the same data."""
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", mode, "-w", "stop")
        time.sleep(down_seconds)
        proc = self._pg_ctl_start()
        if proc.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {proc.stderr.strip()} {self._log_tail()}")

    def stop(self) -> None:
        """Stop the server (immediate shutdown) and delete its directory. Safe to call twice."""
        if os.getpid() != self._owner_pid or self.root is None:
            return  # a forked child must never stop its parent's server
        try:
            if (self.root / "data" / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop", check=False)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- databases -----------------------------------------------------------------------------
    def url(self, database: str = "postgres") -> str:
        """A SQLAlchemy URL (psycopg 3) for one database of this server."""
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """Create a fresh, empty database and return its URL."""
        import psycopg
        from psycopg import sql

        name = name or f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def drop_database(self, name: str) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
