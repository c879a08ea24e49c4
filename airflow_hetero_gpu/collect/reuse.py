"""Connected SSH clients handed out again: the idle connections of a pool, one per host.

Two pools share this: the connections a health watch keeps between checks
(:class:`~airflow_hetero_gpu.collect.persistent.KeptConnections`) and the connection a task's
start hands from one step to the next (:class:`~airflow_hetero_gpu.launch.handoff.ConnectionHandoff`).
Each wraps a client factory; a :class:`PooledClient` it hands out goes back to the pool on
``close()`` and is kept for the next caller of its host while the pool accepts it and the
connection is still up; otherwise it is closed.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Callable

import paramiko

from airflow_hetero_gpu.collect.clients import ClientFactory
from airflow_hetero_gpu.collect.targets import SshTarget


def target_key(target: SshTarget) -> tuple[str, str, int, str | None]:
    """What makes two targets one connection: host name, address, port, user."""
    return target.host_name, target.address, target.port, target.user


def client_active(client: paramiko.SSHClient) -> bool:
    transport = client.get_transport()
    return transport is not None and transport.is_active()


def accepts_connect_timeout(factory: Callable[..., Any]) -> bool:
    """Whether ``factory`` takes a ``connect_timeout`` keyword."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return "connect_timeout" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class PooledClient:
    """A connected client as its user sees it: ``close()`` gives it back to its pool,
    :meth:`drop` closes it for good."""

    def __init__(self, client: paramiko.SSHClient, pool: "IdleClients", key: tuple):
        self._client = client
        self._pool = pool
        self._key = key
        self._done = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._pool._give_back(self._key, self._client)

    def drop(self) -> None:
        self._done = True
        self._client.close()


class IdleClients:
    """The idle connections of a pool by :func:`target_key`, and the lock around them."""

    def __init__(self, factory: ClientFactory):
        self._factory = factory
        self._idle: dict[tuple, paramiko.SSHClient] = {}
        self._lock = threading.Lock()
        #: New connections opened through this pool (the rest were handed out again).
        self.opened = 0

    def _accepts(self) -> bool:
        """Whether a client given back may be kept now (called with the lock held)."""
        return True

    def _kept(self, client: paramiko.SSHClient) -> None:
        """A client given back was kept (outside the lock)."""

    def _take(self, key: tuple) -> paramiko.SSHClient | None:
        """The host's idle client if its connection is still up (a dead one is closed)."""
        with self._lock:
            client = self._idle.pop(key, None)
        if client is not None and client_active(client):
            return client
        if client is not None:
            client.close()
        return None

    def _open(self, target: SshTarget, *args: Any, **kwargs: Any) -> paramiko.SSHClient:
        client = self._factory(target, *args, **kwargs)
        with self._lock:
            self.opened += 1
        return client

    def _give_back(self, key: tuple, client: paramiko.SSHClient) -> None:
        with self._lock:
            keep = self._accepts() and key not in self._idle and client_active(client)
            if keep:
                self._idle[key] = client
        if keep:
            self._kept(client)
        else:
            client.close()

    def _close_idle(self, which: Callable[[tuple], bool] | None = None) -> None:
        """Close the idle clients whose key ``which`` names (all when None)."""
        with self._lock:
            keys = [k for k in self._idle if which is None or which(k)]
            clients = [self._idle.pop(k) for k in keys]
        for client in clients:
            client.close()

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)


__all__ = ["IdleClients", "PooledClient", "accepts_connect_timeout", "client_active", "target_key"]
