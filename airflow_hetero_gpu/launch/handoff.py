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

from typing import Any

from airflow_hetero_gpu.collect.reuse import IdleClients, PooledClient, target_key
from airflow_hetero_gpu.collect.targets import SshTarget


class ConnectionHandoff(IdleClients):
    """A client factory that reuses, during a start, the connection a step closed (see module)."""

    def __init__(self, factory: Any):
        super().__init__(factory)
        self._settled = False

    def __call__(self, target: SshTarget, *args: Any, **kwargs: Any) -> Any:
        key = target_key(target)
        client = self._take(key)
        if client is not None:
            return PooledClient(client, self, key)
        client = self._open(target, *args, **kwargs)
        if self._settled:
            return client
        return PooledClient(client, self, key)

    def _accepts(self) -> bool:
        return not self._settled

    def release(self, keep: set[str]) -> None:
        """Close the kept connections of hosts not named in ``keep`` (swept, not launched on)."""
        self._close_idle(lambda key: key[0] not in keep)

    def settle(self) -> None:
        """The start is over: close what nobody took; from now on a close is a close."""
        with self._lock:
            self._settled = True
        self._close_idle()


__all__ = ["ConnectionHandoff"]
