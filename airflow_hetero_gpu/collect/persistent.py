"""SSH connections kept open between health checks (``hetero-gpu check --interval S``).

A watch that checks a fleet every minute need not redo the key exchange and the authentication
with every host each time. :class:`KeptConnections` wraps the collector's client factory: a
client the collector closes after a good read stays open for the host's next check, and the next
check's read of that host opens a session on it instead of a new connection.

- A new connection goes through the wrapped factory: host keys verified as always.
- A kept connection that went away between checks (the host rebooted, a network blip) fails its
  session at once ("ssh connection is not active", a retryable failure): the collector's retry
  opens a new connection in the same check. A kept connection that no longer answers waits at
  most the connect timeout for its session (``open_timeout``) and fails the host for that check.
- A connection whose read failed is closed, never kept: the next check starts afresh there.

paramiko gives every connection a thread that wakes every 0.1 s to look for input; a thousand
idle connections would wake ten thousand times a second. A kept connection's socket wakes its
thread every :data:`KEPT_POLL_S` instead (input still wakes it at once; keepalives, when set,
go out on that tick).
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Callable

import paramiko

from airflow_hetero_gpu.collect.targets import SshTarget

ClientFactory = Callable[..., paramiko.SSHClient]

#: Seconds a kept connection's reader thread sleeps when nothing comes (paramiko's own: 0.1).
KEPT_POLL_S = 2.0


def _key(target: SshTarget) -> tuple[str, str, int, str | None]:
    return target.host_name, target.address, target.port, target.user


def _active(client: paramiko.SSHClient) -> bool:
    transport = client.get_transport()
    return transport is not None and transport.is_active()


def _idle_poll(client: paramiko.SSHClient) -> None:
    transport = client.get_transport()
    sock = getattr(transport, "sock", None)
    if sock is not None and hasattr(sock, "settimeout"):
        try:
            sock.settimeout(KEPT_POLL_S)
        except OSError:
            pass


def _takes_timeout(factory: ClientFactory) -> bool:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return "connect_timeout" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class KeptClient:
    """A connected client as one read sees it: ``close()`` keeps it for the next check,
    :meth:`drop` closes it for good."""

    def __init__(self, client: paramiko.SSHClient, pool: "KeptConnections", key: tuple, reused: bool):
        self._client = client
        self._pool = pool
        self._key = key
        #: True when this connection was opened by an earlier check.
        self.reused = reused
        self._done = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._pool._keep(self._key, self._client)

    def drop(self) -> None:
        self._done = True
        self._client.close()


class KeptConnections:
    """A client factory whose connections outlive a collection (see the module)."""

    def __init__(self, factory: ClientFactory):
        self._factory = factory
        self._takes_timeout = _takes_timeout(factory)
        self._kept: dict[tuple, paramiko.SSHClient] = {}
        self._lock = threading.Lock()
        self._closed = False
        #: Connections opened, and reads served on a connection an earlier check opened.
        self.opened = 0
        self.reused = 0

    def __call__(self, target: SshTarget, connect_timeout: float | None = None) -> KeptClient:
        key = _key(target)
        with self._lock:
            client = self._kept.pop(key, None)
        if client is not None:
            if _active(client):
                with self._lock:
                    self.reused += 1
                return KeptClient(client, self, key, reused=True)
            client.close()
        if self._takes_timeout and connect_timeout is not None:
            client = self._factory(target, connect_timeout=connect_timeout)
        else:
            client = self._factory(target)
        with self._lock:
            self.opened += 1
        return KeptClient(client, self, key, reused=False)

    def _keep(self, key: tuple, client: paramiko.SSHClient) -> None:
        with self._lock:
            keep = not self._closed and key not in self._kept and _active(client)
            if keep:
                self._kept[key] = client
        if keep:
            _idle_poll(client)
        if not keep:
            client.close()

    def kept(self) -> int:
        with self._lock:
            return len(self._kept)

    def close(self) -> None:
        """Close every kept connection; later reads get connections that are not kept."""
        with self._lock:
            self._closed = True
            clients = list(self._kept.values())
            self._kept.clear()
        for client in clients:
            client.close()


def drop_client(client: Any) -> None:
    """After a failed read: a kept client is closed for good (a plain one is left to ``close``)."""
    drop = getattr(client, "drop", None) if isinstance(client, KeptClient) else None
    if drop is not None:
        drop()


__all__ = ["KEPT_POLL_S", "KeptClient", "KeptConnections", "drop_client"]
