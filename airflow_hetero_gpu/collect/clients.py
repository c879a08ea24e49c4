"""Connected paramiko clients for the collector and the launcher: host keys verified, sockets quick.

Two costs that grow with a fleet are paid once here, not per connection:

- **Host keys** (:class:`HostKeyStore`): ``known_hosts`` is parsed once per factory and kept (a
  factory lives as long as the collection, or the watch, that made it); it is read again only when
  the file changes. Each new client gets just the verified keys of its own host, so paramiko's own
  check applies unchanged: a changed key is a ``BadHostKeyException``, an unknown host is refused
  (``RejectPolicy``), and the known key type is the one negotiated.
- **Small writes** (:func:`open_socket`): every SSH socket gets ``TCP_NODELAY``. Without it each
  small packet of the handshake and of every command waits for the peer's delayed acknowledgement
  (about 40 ms on Linux) before the next one leaves.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Callable

import paramiko
from paramiko.hostkeys import HostKeyEntry, HostKeys, InvalidHostKey

from airflow_hetero_gpu.collect.targets import SshTarget

#: paramiko logs a traceback for every failed handshake; our clients log on this channel, kept
#: quiet by default (the one-line reason goes to error.txt). Lower its level to debug SSH.
PARAMIKO_LOG_CHANNEL = "airflow_hetero_gpu.collect.ssh.paramiko"
logging.getLogger(PARAMIKO_LOG_CHANNEL).setLevel(logging.CRITICAL)
logging.getLogger(PARAMIKO_LOG_CHANNEL).addHandler(logging.NullHandler())

ClientFactory = Callable[..., paramiko.SSHClient]

SYSTEM_KNOWN_HOSTS = "~/.ssh/known_hosts"


def set_nodelay(sock: object) -> None:
    """``TCP_NODELAY`` on ``sock`` when it is a TCP socket (a ProxyCommand's pipe is left alone)."""
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def open_socket(address: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to ``address:port`` with ``TCP_NODELAY`` set (for ``connect(sock=)``).

    Raises what :func:`socket.create_connection` raises (``ConnectionRefusedError``,
    ``socket.timeout``, ``OSError``), which the collector turns into one-line reasons.
    """
    sock = socket.create_connection((address, port), timeout=timeout)
    try:
        set_nodelay(sock)
    except OSError:
        sock.close()
        raise
    return sock


def close_socket(sock: socket.socket) -> None:
    """Close ``sock`` after a failed ``connect(sock=)``: the SSH transport paramiko started on it
    (left running by a connect that failed on a host key or authentication) is stopped first, so
    its thread does not read the closed socket and log "Socket exception: Bad file descriptor"."""
    for thread in threading.enumerate():
        if isinstance(thread, paramiko.Transport) and thread.sock is sock:
            thread.close()
    sock.close()


def host_key_name(address: str, port: int) -> str:
    """The name known_hosts uses for a host: ``addr`` on port 22, else ``[addr]:port``."""
    return address if port == 22 else f"[{address}]:{port}"


class HostKeyStore:
    """The keys of one known_hosts file, parsed once and re-read only when the file changes.

    :meth:`keys_for` answers what ``paramiko.HostKeys.lookup`` would (plain and hashed names,
    the first key of each type), in constant time for plain names. Thread-safe.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(os.path.expanduser(str(path)))
        #: How many times the file was parsed (1 for a collection, more only after a change).
        self.loads = 0
        self._lock = threading.Lock()
        self._signature: tuple[int, int, int] | None = None
        self._plain: dict[str, dict[str, paramiko.PKey]] = {}
        self._hashed: list[HostKeyEntry] = []

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _load(self, signature: tuple[int, int, int] | None) -> None:
        plain: dict[str, dict[str, paramiko.PKey]] = {}
        hashed: list[HostKeyEntry] = []
        if signature is not None:
            with open(self.path, encoding="utf-8", errors="replace") as fh:
                for lineno, line in enumerate(fh, 1):
                    line = line.strip()
                    if not line or line.startswith("#"):
                        continue
                    try:
                        entry = HostKeyEntry.from_line(line, lineno)
                    except (paramiko.SSHException, InvalidHostKey) as exc:
                        why = exc.exc if isinstance(exc, InvalidHostKey) else exc
                        raise ValueError(f"known_hosts {self.path}:{lineno}: not a host key line "
                                         f"({' '.join(str(why).split())})") from None
                    if entry is None or entry.key is None:
                        continue
                    for name in entry.hostnames:
                        if name.startswith("|1|"):
                            hashed.append(HostKeyEntry([name], entry.key))
                        else:
                            plain.setdefault(name, {}).setdefault(entry.key.get_name(), entry.key)
        self._plain, self._hashed, self._signature = plain, hashed, signature
        self.loads += 1

    def refresh(self) -> None:
        """Parse the file now if it is new or changed since the last parse (ValueError, naming the
        file and line, for a line that is not a host key)."""
        signature = self._stat()
        with self._lock:
            if self.loads == 0 or signature != self._signature:
                self._load(signature)

    def keys_for(self, name: str) -> dict[str, paramiko.PKey]:
        """``{key type: key}`` known for ``name`` (``addr`` or ``[addr]:port``); empty if unknown."""
        self.refresh()
        with self._lock:
            plain, hashed = self._plain, self._hashed
        found = dict(plain.get(name, {}))
        for entry in hashed:
            salted = entry.hostnames[0]
            if HostKeys.hash_host(name, salted) == salted:
                found.setdefault(entry.key.get_name(), entry.key)
        return found


def load_identity(path: str | os.PathLike[str]) -> paramiko.PKey:
    """The private key of ``path``, read once for every connection (with its ``-cert.pub``
    certificate when there is one, as ``ssh -i`` does). ValueError (one line) when it cannot."""
    try:
        key = paramiko.PKey.from_path(str(path))
    except (paramiko.PasswordRequiredException, TypeError) as exc:
        # paramiko's own exception, or cryptography's TypeError for an OpenSSH-format key
        if isinstance(exc, TypeError) and "password" not in str(exc).lower():
            raise
        raise ValueError(f"identity file {str(path)!r} is encrypted: give a key without a passphrase, "
                         "or leave --identity-file out to use the ssh agent") from None
    except (paramiko.SSHException, OSError, ValueError) as exc:
        raise ValueError(f"identity file {str(path)!r} is not a private key paramiko can read: "
                         f"{' '.join(str(exc).split()) or type(exc).__name__}") from None
    certificate = Path(f"{path}-cert.pub")
    if certificate.is_file():
        key.load_certificate(str(certificate))
    return key


def paramiko_client_factory(identity_file: str | os.PathLike[str] | None = None,
                            known_hosts: str | os.PathLike[str] | None = None,
                            connect_timeout: float = 10) -> ClientFactory:
    """A factory of connected paramiko clients that verify host keys.

    Host keys come from ``known_hosts`` (default: the user's ``~/.ssh/known_hosts``), parsed once
    for all the clients the factory makes (again only when the file changes); an unknown or
    changed key is refused (``RejectPolicy``), never added. With ``identity_file`` only that key
    is offered (read once, here); without, the agent and the default keys are tried. Sockets get
    ``TCP_NODELAY``.
    The factory's ``host_keys`` attribute is its :class:`HostKeyStore`; its ``spec`` the arguments
    that build it again (in a worker process, :mod:`.shards`).
    """
    if known_hosts is not None and not Path(known_hosts).is_file():
        raise ValueError(f"known_hosts file {str(known_hosts)!r} does not exist")
    if identity_file is not None and not Path(identity_file).is_file():
        raise ValueError(f"identity file {str(identity_file)!r} does not exist")
    store = HostKeyStore(known_hosts if known_hosts is not None else SYSTEM_KNOWN_HOSTS)
    store.refresh()  # a broken known_hosts is a one-line error here, not a reason per host
    pkey = load_identity(identity_file) if identity_file is not None else None
    default_timeout = connect_timeout

    def factory(target: SshTarget, connect_timeout: float | None = None) -> paramiko.SSHClient:
        timeout = connect_timeout if connect_timeout is not None else default_timeout
        client = paramiko.SSHClient()
        client.set_log_channel(PARAMIKO_LOG_CHANNEL)
        try:
            name = host_key_name(target.address, target.port)
            client_keys = client.get_host_keys()
            for key_type, key in store.keys_for(name).items():
                client_keys.add(name, key_type, key)
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            sock = open_socket(target.address, target.port, timeout)
            client.connect(
                hostname=target.address, port=target.port, sock=sock,
                username=target.user or getpass.getuser(), pkey=pkey,
                look_for_keys=pkey is None, allow_agent=pkey is None,
                timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
                channel_timeout=timeout,
            )
        except BaseException:
            client.close()
            raise
        return client

    factory.host_keys = store  # type: ignore[attr-defined]
    # how a worker process builds the same factory (collect.shards)
    factory.spec = (None if identity_file is None else os.fspath(identity_file),  # type: ignore[attr-defined]
                    None if known_hosts is None else os.fspath(known_hosts), connect_timeout)
    return factory


__all__ = ["ClientFactory", "HostKeyStore", "PARAMIKO_LOG_CHANNEL", "close_socket", "host_key_name", "load_identity",
           "open_socket", "paramiko_client_factory", "set_nodelay"]
