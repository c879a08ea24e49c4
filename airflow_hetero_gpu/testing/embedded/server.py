"""The embedded SSH server: many emulated GPU hosts served by one asyncio process (asyncssh).

Each host is a listener on its own loopback address with its own ed25519 host key; the client
key of the fleet is the only one accepted, for the fleet's user. Per session:

- a command line that :func:`.shell.parse` understands (the collector's ``nvidia-smi`` queries,
  ``topo -m``, the kernel-log read) is answered here by the fake tools' functions, reading the
  host's state file, as the real-sshd emulator's tool scripts print it;
- anything else (the launcher's scripts, torchrun, the orphan sweep, ``python3 -``) runs as a
  real process, ``bash -c COMMAND`` in a session of its own, with the host's environment (its
  ``bin/`` first on ``PATH``, ``HETERO_GPU_EMU_STATE``, ``HETERO_GPU_EMU_MARKER``), stdin,
  stdout and stderr piped through the channel. When the client sends end-of-file, or the
  channel or connection goes away, the process's stdin is closed (end-of-file, as with sshd);
  when the connection goes away its stdout and stderr are closed too. The exit status (or
  signal) goes back to the client once the process has exited and its output is drained.

Global requests such as OpenSSH's ``keepalive@openssh.com`` are answered (with a failure
reply, as sshd does), which is what a client's keepalive counts as an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import asyncssh

from airflow_hetero_gpu.testing import procs
from airflow_hetero_gpu.testing.embedded import shell
from airflow_hetero_gpu.testing.state import FISH_SHELL, read_state

log = logging.getLogger(__name__)

#: Threads for in-process commands that have to wait (a state's ``nvidia_smi_delay_s`` or
#: ``nvidia_smi_wait_for``).
_SLOW_TOOLS = ThreadPoolExecutor(max_workers=256, thread_name_prefix="emu-slow-tool")


@dataclass(frozen=True)
class HostEntry:
    """One host of a fleet file."""

    name: str
    address: str
    port: int
    host_key: str
    state: str
    bin_dir: str
    marker: str


@dataclass(frozen=True)
class Fleet:
    """What every host of one server shares: the login, the accepted key, the software PATH."""

    user: str
    home: str
    client_keys: tuple[str, ...]
    path_tail: tuple[str, ...]
    hosts: tuple[HostEntry, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Fleet":
        return cls(data["user"], data["home"], tuple(data["client_keys"]), tuple(data["path_tail"]),
                   tuple(HostEntry(**h) for h in data["hosts"]))


@contextlib.contextmanager
def _corked(chan: Any) -> Iterator[None]:
    """Hold back the packets written inside (output, EOF, exit status, close) and send them as
    one TCP segment: the client is woken once instead of once a packet, which is most of what a
    small command costs either side."""
    sock = chan.get_extra_info("socket")
    cork = getattr(socket, "TCP_CORK", None)
    if not hasattr(sock, "setsockopt") or cork is None:  # asyncio hands out a TransportSocket
        yield
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, cork, 1)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, cork, 0)
        except OSError:
            pass


class _Server(asyncssh.SSHServer):
    """Authentication (the fleet's key for the fleet's user) and connection bookkeeping."""

    def __init__(self, host: "EmbeddedHost"):
        self.host = host
        self.conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        self.host.connections.add(conn)
        self.host.opened += 1

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.host.connections.discard(self.conn)

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return username == self.host.fleet.user and key.public_data in self.host.client_keys

    def session_requested(self) -> "_Session":
        self.host.sessions += 1
        return _Session(self.host)


class _Process(asyncio.SubprocessProtocol):
    """The pipes of one real process, forwarded to its session's channel."""

    def __init__(self, session: "_Session"):
        self.session = session
        self.open_pipes = {1, 2}
        self.exited = False

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.session.send(fd, data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.open_pipes.discard(fd)
        self.session.maybe_finish()

    def process_exited(self) -> None:
        self.exited = True
        self.session.maybe_finish()


class _Session(asyncssh.SSHServerSession):
    """One exec request: in-process when the shell subset covers it, else a real process."""

    def __init__(self, host: "EmbeddedHost"):
        self.host = host
        self.chan: Any = None
        self.command: str | None = None
        self.transport: asyncio.SubprocessTransport | None = None
        self.protocol: _Process | None = None
        self.pending_input = bytearray()
        self.input_closed = False
        self.gone = False
        self.finished = False

    # -- requests ------------------------------------------------------------------------------

    def connection_made(self, chan: Any) -> None:
        self.chan = chan

    def pty_requested(self, *args: Any) -> bool:
        return False

    def shell_requested(self) -> bool:
        return False

    def subsystem_requested(self, subsystem: str) -> bool:
        return False

    def exec_requested(self, command: str) -> bool:
        self.command = command
        return True

    def session_started(self) -> None:
        if self.command is not None:
            self.host.spawn(self._run(self.command))

    # -- input ---------------------------------------------------------------------------------

    def data_received(self, data: bytes, datatype: Any) -> None:
        pipe = self._stdin_pipe()
        if pipe is not None:
            pipe.write(data)
        elif not self.input_closed:
            self.pending_input += data

    def eof_received(self) -> bool:
        self._close_input()
        return True  # half-open: the command's output still flows back

    def connection_lost(self, exc: Exception | None) -> None:
        """The channel closed (client gone, connection dropped): stdin ends, output pipes close."""
        self.gone = True
        self._close_input()
        if self.transport is not None:
            for fd in (1, 2):
                pipe = self.transport.get_pipe_transport(fd)
                if pipe is not None:
                    pipe.close()

    def pause_writing(self) -> None:
        self._pipes_reading(False)

    def resume_writing(self) -> None:
        self._pipes_reading(True)

    def _stdin_pipe(self) -> Any:
        if self.transport is None or self.input_closed:
            return None
        return self.transport.get_pipe_transport(0)

    def _close_input(self) -> None:
        pipe = self._stdin_pipe()
        self.input_closed = True
        if pipe is not None:
            pipe.close()

    def _pipes_reading(self, on: bool) -> None:
        if self.transport is None:
            return
        for fd in (1, 2):
            pipe = self.transport.get_pipe_transport(fd)
            if pipe is not None and not pipe.is_closing():
                pipe.resume_reading() if on else pipe.pause_reading()

    # -- output --------------------------------------------------------------------------------

    def send(self, fd: int, data: bytes) -> None:
        if self.gone or self.chan is None or self.chan.is_closing():
            return
        if fd == 1:
            self.chan.write(data)
        else:
            self.chan.write_stderr(data)

    def maybe_finish(self) -> None:
        proto = self.protocol
        if self.finished or proto is None or not proto.exited or proto.open_pipes:
            return
        self.finished = True
        assert self.transport is not None
        returncode = self.transport.get_returncode()
        self.host.processes.discard(self.transport)
        self.transport.close()
        if not self.gone:
            self.host.spawn(self._exit(returncode if returncode is not None else 255))

    async def _exit(self, returncode: int) -> None:
        """Report the status once the output has left (sshd sends data, EOF, then the status)."""
        while not self.gone and self.chan.get_write_buffer_size() > 0:
            await asyncio.sleep(0.01)
        if self.gone or self.chan.is_closing():
            return
        self.chan.write_eof()
        if returncode < 0:
            try:
                name = signal.Signals(-returncode).name[3:]
            except ValueError:
                name = "KILL"
            self.chan.exit_with_signal(name)
        else:
            self.chan.exit(returncode)

    # -- running -------------------------------------------------------------------------------

    async def _run(self, command: str) -> None:
        if "$?" in command and FISH_SHELL in (self._faults() or ()):
            # fish refuses the whole line before it runs any of it (3.x: exit 127, this message)
            self.send(2, f"fish: $? is not the exit status. In fish, please use $status.\n{command}\n".encode())
            self.chan.exit(127)
            return
        script = shell.parse(command)
        if script is not None:
            await self._run_in_process(script)
        else:
            await self._run_process(command)

    def _faults(self) -> list[str] | None:
        try:
            return list(self.host.state().get("faults") or [])
        except (OSError, ValueError):
            return None  # _run_in_process says so

    async def _run_in_process(self, script: shell.Script) -> None:
        try:
            state = self.host.state()
        except (OSError, ValueError) as exc:
            self.send(2, f"emulated host {self.host.entry.name}: cannot read its state: {exc}\n".encode())
            self.chan.exit(255)
            return
        if "nvidia-smi" in script.tools and (float(state.get("nvidia_smi_delay_s") or 0) > 0
                                              or state.get("nvidia_smi_wait_for")):
            loop = asyncio.get_running_loop()
            status, out, err = await loop.run_in_executor(_SLOW_TOOLS, shell.run_script, script, state)
        else:
            status, out, err = shell.run_script(script, state)
        if self.gone or self.chan.is_closing():
            return
        with _corked(self.chan):
            if out:
                self.send(1, out)
            if err:
                self.send(2, err)
            self.chan.write_eof()
            self.chan.exit(status)

    async def _run_process(self, command: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _Process(self), "bash", "-c", command,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=self.host.environment(self.chan),
                cwd=self.host.fleet.home, start_new_session=True,
            )
        except OSError as exc:
            self.send(2, f"bash: {exc.strerror or exc}\n".encode())
            self.chan.exit(127)
            return
        self.transport, self.protocol = transport, protocol
        self.host.processes.add(transport)
        if self.gone:  # the channel closed while the process was starting
            self.connection_lost(None)
            return
        stdin = transport.get_pipe_transport(0)
        if self.pending_input:
            stdin.write(bytes(self.pending_input))
            self.pending_input.clear()
        if self.input_closed:
            stdin.close()


class EmbeddedHost:
    """One emulated host: its listener (or its fault), its connections and its processes."""

    def __init__(self, fleet: Fleet, entry: HostEntry, client_keys: set[bytes]):
        self.fleet = fleet
        self.entry = entry
        self.client_keys = client_keys
        self.port = entry.port
        self.key = asyncssh.read_private_key(entry.host_key)
        self.original_key = self.key
        self.acceptor: asyncssh.SSHAcceptor | None = None
        self.silent: socket.socket | None = None
        self.connections: set[asyncssh.SSHServerConnection] = set()
        #: SSH connections accepted since the server started (what a benchmark counts).
        self.opened = 0
        #: SSH sessions (channels) opened on them.
        self.sessions = 0
        self.processes: set[asyncio.SubprocessTransport] = set()
        self.tasks: set[asyncio.Task[Any]] = set()
        self._path = ":".join((entry.bin_dir, *fleet.path_tail))
        self._state: tuple[tuple[int, int, int], dict[str, Any]] | None = None

    def state(self) -> dict[str, Any]:
        """The host's state as its file holds it now (parsed again only when the file changed:
        writers replace it by a rename, so a new version is a new inode). Read-only for callers."""
        st = os.stat(self.entry.state)
        signature = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._state is None or signature != self._state[0]:
            self._state = (signature, read_state(self.entry.state))
        return self._state[1]

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("emulated host %s: %r", self.entry.name, task.exception())

    def environment(self, chan: Any) -> dict[str, str]:
        """What sshd's session environment would hold, plus the emulation's markers."""
        peer = chan.get_extra_info("peername") or ("", 0)
        sock = chan.get_extra_info("sockname") or (self.entry.address, self.port)
        user = self.fleet.user
        return {
            "PATH": self._path, "HOME": self.fleet.home, "USER": user, "LOGNAME": user,
            "SHELL": "/bin/bash", "SSH_CLIENT": f"{peer[0]} {peer[1]} {sock[1]}",
            "SSH_CONNECTION": f"{peer[0]} {peer[1]} {sock[0]} {sock[1]}",
            "HETERO_GPU_EMU_STATE": self.entry.state, "HETERO_GPU_EMU_MARKER": self.entry.marker,
            # hosts that share this machine's process table: a sweep counts only its own host's jobs
            "HETERO_GPU_SCOPE": self.entry.marker,
            # not this machine's ~/.bashrc (docs/emulated-cluster.md, "Start-up files")
            "SHLVL": "1",
        }

    # -- listening -----------------------------------------------------------------------------

    async def listen(self) -> None:
        """Serve SSH on the host's address (port 0 at first start: the kernel picks one)."""
        self.acceptor = await asyncssh.listen(
            self.entry.address, self.port, reuse_address=True, backlog=128,
            server_factory=lambda: _Server(self),
            server_host_keys=[self.key], encoding=None, login_timeout=30, keepalive_interval=0,
            allow_pty=False, agent_forwarding=False, x11_forwarding=False, line_editor=False,
            allow_scp=False, sftp_factory=None, gss_host=None,
        )
        self.port = self.acceptor.get_port()

    async def stop_listening(self) -> None:
        if self.acceptor is not None:
            self.acceptor.close()
            await self.acceptor.wait_closed()
            self.acceptor = None
        if self.silent is not None:
            self.silent.close()
            self.silent = None

    async def go_silent(self) -> None:
        """Accept TCP connections (the kernel's backlog) but never say a word: a hung sshd."""
        await self.stop_listening()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.entry.address, self.port))
        sock.listen(128)
        self.silent = sock

    def drop_connections(self) -> int:
        """Close every open connection at once, as a crashed sshd or a broken network would."""
        dropped = list(self.connections)
        for conn in dropped:
            conn.abort()
        return len(dropped)

    def process_pids(self) -> dict[int, int]:
        """The processes this host's sessions started (pid -> depth, for ``procs.kill_all``)."""
        pids = (transport.get_pid() for transport in list(self.processes))
        return {pid: 1 for pid in pids if pid is not None}

    def kill_processes(self) -> None:
        """SIGKILL every process this host started (their groups, then stragglers by marker)."""
        kill_processes([self])

    def rekey(self, changed: bool) -> None:
        self.key = asyncssh.generate_private_key("ssh-ed25519") if changed else self.original_key

    async def close(self, *, kill: bool = True) -> None:
        await self.stop_listening()
        self.drop_connections()
        if kill:
            self.kill_processes()
        for task in list(self.tasks):
            task.cancel()


def kill_processes(hosts: Sequence[EmbeddedHost]) -> None:
    """SIGKILL what the hosts' sessions started, with their process groups, and whatever else
    carries one of their markers (a process that left its session): one scan of /proc for all."""
    victims: dict[int, int] = {}
    for host in hosts:
        victims.update(host.process_pids())
    for pid in procs.with_env_in("HETERO_GPU_EMU_MARKER", {h.entry.marker for h in hosts}):
        victims.setdefault(pid, 2)
    if victims:
        procs.kill_all(victims)


def load_client_keys(lines: Sequence[str]) -> set[bytes]:
    """The public data of the accepted client keys (OpenSSH public-key lines)."""
    return {asyncssh.import_public_key(line).public_data for line in lines}


__all__ = ["EmbeddedHost", "Fleet", "HostEntry", "kill_processes", "load_client_keys"]
