"""Run one command on a connected paramiko client, reading stdout and stderr together."""

from __future__ import annotations

import select
import time
from dataclasses import dataclass

import paramiko

from airflow_hetero_gpu.collect.reasons import HostFailure, first_line


@dataclass
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


def _waiter(channel: paramiko.Channel):
    """A ``wait(seconds)`` that returns when the channel has something to read.

    ``poll`` where the platform has it: ``select`` cannot watch descriptors above 1023, which a
    collection with a few hundred hosts in flight reaches (each channel waits on a pipe).
    """
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(channel.fileno(), select.POLLIN)
        return lambda seconds: poller.poll(max(0, int(seconds * 1000)))
    return lambda seconds: select.select([channel], [], [], seconds)


def run_command(client: paramiko.SSHClient, command: str, timeout: float,
                label: str | None = None, stdin: bytes | None = None) -> CommandResult:
    """Run one command on a connected client, reading stdout and stderr together.

    ``stdin``, when given, is sent to the command and its input closed. Raises
    HostFailure("timeout: ...") when it does not finish within ``timeout`` seconds.
    """
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise HostFailure("ssh connection is not active", retryable=True)
    deadline = time.monotonic() + timeout
    try:
        channel = transport.open_session(timeout=timeout)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise HostFailure(f"cannot open an SSH session: {first_line(str(exc)) or type(exc).__name__}",
                          retryable=True) from exc
    out, err = bytearray(), bytearray()
    try:
        channel.settimeout(timeout)
        channel.exec_command(command)
        if stdin is not None:
            try:
                channel.sendall(stdin)
                channel.shutdown_write()
            except OSError:
                pass  # the command ended without reading its input; its exit status says why
        wait = _waiter(channel)
        while True:
            while channel.recv_ready():
                out += channel.recv(65536)
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
            if channel.exit_status_ready() and (channel.eof_received or channel.closed) \
                    and not channel.recv_ready() and not channel.recv_stderr_ready():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HostFailure(f"timeout: {label or command!r} did not finish within {timeout:g}s")
            if channel.eof_received:
                # All output is in; only the exit status is to come. (The channel's pipe stays
                # readable after end-of-file, so waiting on it would spin.)
                channel.status_event.wait(min(remaining, 0.25))
            else:
                wait(min(remaining, 0.25))
        return CommandResult(channel.recv_exit_status(), out.decode("utf-8", "replace"),
                             err.decode("utf-8", "replace"))
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise HostFailure(f"ssh session failed: {first_line(str(exc)) or type(exc).__name__}",
                          retryable=True) from exc
    finally:
        channel.close()


__all__ = ["CommandResult", "run_command"]
