"""Why a host could not be collected: :class:`HostFailure` and the one-line reasons of connect errors.

Every reason names the endpoint and, where the cause is usually on this side (sshd's
``MaxStartups``, the process's open-file limit), what to do about it.
"""

from __future__ import annotations

import errno
import getpass
import resource
import socket

import paramiko

from airflow_hetero_gpu.collect.targets import SshTarget


class HostFailure(Exception):
    """A host could not be collected; ``str()`` is the one-line reason for error.txt.

    ``config``: the cause is the setup, not the host (an unusable connection, a rejected key):
    waiting or retrying cannot help."""

    def __init__(self, reason: str, *, retryable: bool = False, config: bool = False):
        super().__init__(" ".join(reason.split()))
        self.retryable = retryable
        self.config = config


def first_line(*texts: str) -> str:
    """The first non-blank line of the first text that has one."""
    for text in texts:
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return "(no output)"


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}" if hasattr(key, "fingerprint") else key.get_name()


def too_many_open_files(where: str) -> HostFailure:
    """The reason when this process ran out of file descriptors while reaching ``where``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return HostFailure(
        f"cannot connect to {where}: too many open files in this process (limit {soft}, hard limit "
        f"{hard}): lower --max-parallel / max_parallel or raise the limit (ulimit -n)"
    )


def classify_connect_error(exc: BaseException, target: SshTarget, timeout: float,
                           elapsed: float = 0.0) -> HostFailure:
    """Turn whatever connecting raised into a one-line reason, retryable or not.

    ``elapsed`` (seconds the attempt took) tells a silent server apart from a dropped
    connection: paramiko reports both as various SSHExceptions.
    """
    where = target.endpoint
    if isinstance(exc, HostFailure):
        return exc
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostFailure(
            f"host key mismatch for {where}: server offered {_fingerprint(exc.key)}, "
            f"known_hosts has {_fingerprint(exc.expected_key)}", config=True
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return HostFailure(f"authentication failed for {target.user or getpass.getuser()}@{where}: {exc}",
                           config=True)
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        errnos = {getattr(e, "errno", None) for e in exc.errors.values()}
        if errnos <= {111, 10061}:  # ECONNREFUSED (Linux, Windows)
            return HostFailure(f"connection refused ({where})", retryable=True)
        return HostFailure(f"cannot connect to {where}: {first_line(str(exc))}", retryable=True)
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return HostFailure(f"timeout connecting to {where} after {timeout:g}s")
    if isinstance(exc, ConnectionRefusedError):
        return HostFailure(f"connection refused ({where})", retryable=True)
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return too_many_open_files(where)
    if isinstance(exc, paramiko.SSHException):
        text = str(exc)
        if "not found in known_hosts" in text:
            return HostFailure(f"unknown host key for {where}: not in known_hosts (host keys are verified)",
                               config=True)
        context = exc.__context__
        if isinstance(context, OSError) and context.errno in (errno.EMFILE, errno.ENFILE):
            return too_many_open_files(where)
        if ("Negotiation timed out" in text or isinstance(context, (socket.timeout, TimeoutError))
                or elapsed >= 0.9 * timeout):
            return HostFailure(f"timeout: no SSH handshake from {where} within {timeout:g}s")
        if "Error reading SSH protocol banner" in text:
            # What sshd does to connections beyond its MaxStartups (10:30:100 by default): close
            # them before the banner. Retried, with a hint for when it keeps happening.
            return HostFailure(f"connection closed by {where} before the SSH banner (sshd's MaxStartups "
                               f"refuses unauthenticated connections beyond its limit: lower "
                               f"max_parallel behind a shared sshd)", retryable=True)
        return HostFailure(f"ssh error with {where}: {first_line(text)}", retryable=True)
    if isinstance(exc, (EOFError, ConnectionError)):
        return HostFailure(f"connection to {where} lost: {type(exc).__name__}", retryable=True)
    if isinstance(exc, OSError):
        return HostFailure(f"cannot connect to {where}: {exc.strerror or exc}", retryable=True)
    return HostFailure(f"cannot connect to {where}: {type(exc).__name__}: {first_line(str(exc))}")


__all__ = ["HostFailure", "classify_connect_error", "first_line", "too_many_open_files"]
