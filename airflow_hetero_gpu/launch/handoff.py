"""One SSH connection per host for a task's start: the sweep's connection is the launch's.

Starting a job takes three steps on a host, each of which used to open its own connection: the
sweep of an earlier try's leftovers (:func:`~.orphans.kill_orphans`), the rendezvous port probe
on the first host (:func:`~.ports.choose_rdzv_port`) and the launch itself
(:class:`~.remote.RemoteJob`). :class:`ConnectionHandoff` wraps the client factory they share:
while it is open, a client one step closes (its connection still up) is kept for the host and
handed to the next step that asks for that host, so a start costs one key exchange and one
authentication per host. :meth:`ConnectionHandoff.settle` (once the job has started) closes what
nobody took and makes every later close a real one: the job's own connections, and any
reconnection after a fault, are never handed on.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import paramiko

from airflow_hetero_gpu.collect.targets import SshTarget

ClientFactory = Callable[..., paramiko.SSHClient]


def _key(target: SshTarget) -> tuple[str, str, int, str | None]:
    return target.host_name, target.address, target.port, target.user


def _active(client: paramiko.SSHClient) -> bool:
    transport = client.get_transport()
    return transport is not None and transport.is_active()


class LentClient:
    """A connected client as the steps see it: ``close()`` hands it back to the handoff."""

    def __init__(self, client: paramiko.SSHClient, handoff: "ConnectionHandoff", key: tuple):
        self._client = client
        self._handoff = handoff
        self._key = key
        self._returned = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def close(self) -> None:
        if not self._returned:
            self._returned = True
            self._handoff._give_back(self._key, self._client)


class ConnectionHandoff:
    """A client factory that reuses, during a start, the connection a step closed (see module)."""

    def __init__(self, factory: ClientFactory):
        self._factory = factory
        self._idle: dict[tuple, paramiko.SSHClient] = {}
        self._lock = threading.Lock()
        self._settled = False
        #: New connections opened through this handoff (the rest were handed on).
        self.opened = 0

    def __call__(self, target: SshTarget, *args: Any, **kwargs: Any) -> Any:
        key = _key(target)
        with self._lock:
            client = self._idle.pop(key, None)
        if client is not None:
            if _active(client):
                return LentClient(client, self, key)
            client.close()
        client = self._factory(target, *args, **kwargs)
        with self._lock:
            self.opened += 1
            if self._settled:
                return client
        return LentClient(client, self, key)

    def _give_back(self, key: tuple, client: paramiko.SSHClient) -> None:
        with self._lock:
            keep = not self._settled and key not in self._idle and _active(client)
            if keep:
                self._idle[key] = client
        if not keep:
            client.close()

    def release(self, keep: set[str]) -> None:
        """Close the kept connections of hosts not named in ``keep`` (swept, not launched on)."""
        with self._lock:
            gone = [k for k in self._idle if k[0] not in keep]
            clients = [self._idle.pop(k) for k in gone]
        for client in clients:
            client.close()

    def settle(self) -> None:
        """The start is over: close what nobody took; from now on a close is a close."""
        with self._lock:
            self._settled = True
            clients = list(self._idle.values())
            self._idle.clear()
        for client in clients:
            client.close()


__all__ = ["ConnectionHandoff", "LentClient"]
