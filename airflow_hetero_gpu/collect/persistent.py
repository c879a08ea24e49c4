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

from typing import Any

import paramiko

from airflow_hetero_gpu.collect.clients import ClientFactory
from airflow_hetero_gpu.collect.reuse import IdleClients, PooledClient, accepts_connect_timeout, target_key
from airflow_hetero_gpu.collect.targets import SshTarget

#: Seconds a kept connection's reader thread sleeps when nothing comes (paramiko's own: 0.1).
KEPT_POLL_S = 2.0


def _idle_poll(client: paramiko.SSHClient) -> None:
    transport = client.get_transport()
    sock = getattr(transport, "sock", None)
    if sock is not None and hasattr(sock, "settimeout"):
        try:
            sock.settimeout(KEPT_POLL_S)
        except OSError:
            pass


class KeptConnections(IdleClients):
    """A client factory whose connections outlive a collection (see the module)."""

    def __init__(self, factory: ClientFactory):
        super().__init__(factory)
        self._takes_timeout = accepts_connect_timeout(factory)
        self._closed = False
        #: Reads served on a connection an earlier check opened.
        self.reused = 0

    def __call__(self, target: SshTarget, connect_timeout: float | None = None) -> PooledClient:
        key = target_key(target)
        client = self._take(key)
        if client is not None:
            with self._lock:
                self.reused += 1
            return PooledClient(client, self, key)
        if self._takes_timeout and connect_timeout is not None:
            client = self._open(target, connect_timeout=connect_timeout)
        else:
            client = self._open(target)
        return PooledClient(client, self, key)

    def _accepts(self) -> bool:
        return not self._closed

    def _kept(self, client: paramiko.SSHClient) -> None:
        _idle_poll(client)

    def kept(self) -> int:
        return self.idle()

    def close(self) -> None:
        """Close every kept connection; later reads get connections that are not kept."""
        with self._lock:
            self._closed = True
        self._close_idle()


def drop_client(client: Any) -> None:
    """After a failed read: a kept client is closed for good (a plain one is left to ``close``)."""
    if isinstance(client, PooledClient):
        client.drop()


__all__ = ["KEPT_POLL_S", "KeptConnections", "drop_client"]
