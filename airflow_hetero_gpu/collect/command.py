"""Run commands on a connected paramiko client, reading stdout and stderr together.

:func:`run_command` runs one command. :func:`run_together` runs several in one SSH session: one
POSIX ``sh`` command line in which each command is followed by a marker line on stdout (with the
command's exit status) and on stderr, so that one channel, one exec request and one shell on the
host serve what used to take three. The outputs are split at the markers back into one
:class:`CommandResult` per command, byte for byte what the command printed; a host whose login
shell is not POSIX (``fish``, ``csh``: ``$?`` is an error there) prints no markers, and the caller
runs the commands one by one instead.
"""

from __future__ import annotations

import re
import secrets
import select
import time
from dataclasses import dataclass
from typing import Callable, Sequence

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


def _open_session(client: paramiko.SSHClient, timeout: float) -> paramiko.Channel:
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise HostFailure("ssh connection is not active", retryable=True)
    try:
        return transport.open_session(timeout=timeout)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        text = first_line(str(exc)) if str(exc) else type(exc).__name__
        if "Timeout opening channel" in text:
            # the connection is up as far as this side knows, but the host does not answer:
            # a frozen host or a broken network path; waiting longer would not help this check
            raise HostFailure(f"timeout: the SSH connection did not answer within {timeout:g}s") from exc
        raise HostFailure(f"cannot open an SSH session: {text}", retryable=True) from exc


class _Timeout(Exception):
    """What did not finish in time (turned into the HostFailure by the caller, who knows the limit)."""


def _exchange(channel: paramiko.Channel, command: str, stdin: bytes | None,
              deadline: Callable[[bytearray], tuple[float, str]]) -> tuple[int, bytearray, bytearray]:
    """Exec ``command`` on ``channel`` and read until it exits: (status, stdout, stderr).

    ``deadline(stdout so far)`` says until when to wait and, when that passes, what did not
    finish (for the timeout's reason)."""
    out, err = bytearray(), bytearray()
    try:
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
            until, what = deadline(out)
            remaining = until - time.monotonic()
            if remaining <= 0:
                raise _Timeout(what)
            if channel.eof_received:
                # All output is in; only the exit status is to come. (The channel's pipe stays
                # readable after end-of-file, so waiting on it would spin.)
                channel.status_event.wait(min(remaining, 0.25))
            else:
                wait(min(remaining, 0.25))
        return channel.recv_exit_status(), out, err
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise HostFailure(f"ssh session failed: {first_line(str(exc)) or type(exc).__name__}",
                          retryable=True) from exc
    finally:
        channel.close()


def _timed_out(what: str, timeout: float) -> HostFailure:
    return HostFailure(f"timeout: {what} did not finish within {timeout:g}s")


def run_command(client: paramiko.SSHClient, command: str, timeout: float,
                label: str | None = None, stdin: bytes | None = None) -> CommandResult:
    """Run one command on a connected client, reading stdout and stderr together.

    ``stdin``, when given, is sent to the command and its input closed. Raises
    HostFailure("timeout: ...") when it does not finish within ``timeout`` seconds.
    """
    channel = _open_session(client, timeout)
    channel.settimeout(timeout)
    end = time.monotonic() + timeout
    what = repr(label or command)
    try:
        status, out, err = _exchange(channel, command, stdin, lambda _out: (end, what))
    except _Timeout as late:
        raise _timed_out(str(late), timeout) from None
    return CommandResult(status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


# --------------------------------------------------------------------------------------------
# Several commands in one session
# --------------------------------------------------------------------------------------------

#: Marker lines look like ``\nHGPU-<16 hex> <status>\n`` (stdout) and ``\nHGPU-<16 hex>\n``
#: (stderr); the leading newline ends a last line that has none and is not part of the output.
MARKER_PREFIX = "HGPU-"


def together_line(commands: Sequence[str], marker: str) -> str:
    """The one POSIX ``sh`` line that runs ``commands`` in order with ``marker`` lines between
    their outputs (each command is a constant of the collector: nothing is interpolated)."""
    parts = []
    for command in commands:
        parts.append(f"{command}; printf '\\n%s %s\\n' {marker} $?; printf '\\n%s\\n' {marker} >&2")
    return "; ".join(parts)


def _split(data: bytes, pattern: re.Pattern[bytes], count: int) -> tuple[list[bytes], list[bytes]] | None:
    """``count`` sections of ``data`` ended by ``pattern``'s markers, and what each marker
    captured; None unless there are exactly ``count`` markers and nothing after the last."""
    sections, captured, start = [], [], 0
    for match in pattern.finditer(data):
        sections.append(data[start:match.start()])
        captured.append(match.group(1) if match.groups() else b"")
        start = match.end()
    if len(sections) != count or data[start:]:
        return None
    return sections, captured


def run_together(client: paramiko.SSHClient, commands: Sequence[tuple[str, str]], timeout: float, *,
                 open_timeout: float | None = None, stdin: bytes | None = None) -> list[CommandResult] | None:
    """Run ``commands`` (``(command line, label)`` pairs) in one session: a result per command, as
    :func:`run_command` would give it, or None when the host's shell did not run the line as a
    POSIX shell does (no markers, or not all of them): run them one by one then.

    Each command gets ``timeout`` seconds from the end of the one before (a timeout names the
    command still running, as :func:`run_command` does). ``open_timeout`` bounds the wait for
    the session itself (default ``timeout``): on a connection kept open since an earlier
    collection, that is how long a host that stopped answering gets. ``stdin`` goes to the first
    command that reads it.
    """
    marker = MARKER_PREFIX + secrets.token_hex(8)
    token = marker.encode()
    out_marker = re.compile(b"\n" + re.escape(token) + rb" (\d+)\n")
    err_marker = re.compile(b"\n" + re.escape(token) + b"\n")
    channel = _open_session(client, timeout if open_timeout is None else open_timeout)
    channel.settimeout(timeout)
    progress = {"done": 0, "until": time.monotonic() + timeout, "seen": 0}

    def deadline(out: bytearray) -> tuple[float, str]:
        if len(out) != progress["seen"]:  # a command finished: the next one gets its own timeout
            progress["seen"] = len(out)
            done = len(out_marker.findall(out))
            if done > progress["done"]:
                progress["done"], progress["until"] = done, time.monotonic() + timeout
        command, label = commands[min(progress["done"], len(commands) - 1)]
        return progress["until"], repr(label or command)

    try:
        _status, out, err = _exchange(channel, together_line([c for c, _ in commands], marker), stdin, deadline)
    except _Timeout as late:
        raise _timed_out(str(late), timeout) from None
    got_out = _split(bytes(out), out_marker, len(commands))
    got_err = _split(bytes(err), err_marker, len(commands))
    if got_out is None or got_err is None:
        return None
    (outs, statuses), (errs, _) = got_out, got_err
    return [CommandResult(int(status), o.decode("utf-8", "replace"), e.decode("utf-8", "replace"))
            for o, status, e in zip(outs, statuses, errs)]


__all__ = ["CommandResult", "MARKER_PREFIX", "run_command", "run_together", "together_line"]
