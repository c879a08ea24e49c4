"""A large collection shared among worker processes, each running the same collector.

paramiko is pure Python above its ciphers: one interpreter spends 7-15 ms of CPU per host on the
key exchange, the authentication and the sessions, and its threads share one core (the
interpreter lock). A fleet of :data:`HOSTS_PER_WORKER` × 2 hosts or more is therefore split
among up to ``os.cpu_count()`` worker processes (:func:`worker_count`); each runs
:func:`~airflow_hetero_gpu.collect.ssh.collect_captures` on its share, with its own client
factory built from the same ``known_hosts`` and identity file (host keys verified as always),
writes its hosts' captures into the same directory, and sends each host's result back as soon
as the host is done. The parent puts the results in the targets' order and marks the duplicates
over the whole fleet, so a report reads exactly as one made in one process.

Only a factory that can be built again in another process is shared out: the plain one of
:func:`~airflow_hetero_gpu.collect.clients.paramiko_client_factory` (``hetero-gpu collect`` and
``check`` over ``--hosts``/``--hosts-file``), alone or behind
:class:`~airflow_hetero_gpu.collect.persistent.KeptConnections`. With kept connections the
workers live as long as the collector (:meth:`ShardWorkers.close`) and keep their hosts'
connections between collections; a host always goes to the same worker.

The worker side is :mod:`.shard_worker`. No worker outlives its parent: it stops when its input
closes, when the parent is gone (checked every second) or on SIGTERM, which :meth:`ShardWorkers.close` sends after a short wait; Ctrl-C is
the parent's to handle (the workers ignore SIGINT and are stopped by the parent).
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

#: Hosts one worker process is worth starting for (fewer: threads of the calling process).
HOSTS_PER_WORKER = 64
#: Seconds :meth:`ShardWorkers.close` waits for a worker to finish before it is terminated.
STOP_WAIT_S = 5.0

log = logging.getLogger(__name__)

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def worker_count(hosts: int, cpus: int | None = None) -> int:
    """Worker processes for a collection of ``hosts``: one per CPU, each with at least
    :data:`HOSTS_PER_WORKER` hosts; 1 means the calling process collects alone."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return max(1, min(cpus, hosts // HOSTS_PER_WORKER))


def factory_spec(factory: Any) -> tuple[tuple, bool] | None:
    """``(spec, keep)`` when ``factory`` can be built again in a worker: ``spec`` are the
    arguments of :func:`~airflow_hetero_gpu.collect.clients.paramiko_client_factory`, ``keep``
    whether it sits behind :class:`~airflow_hetero_gpu.collect.persistent.KeptConnections`."""
    from airflow_hetero_gpu.collect.persistent import KeptConnections  # noqa: PLC0415

    keep = isinstance(factory, KeptConnections)
    inner = factory._factory if keep else factory  # noqa: SLF001 - the pool's own factory
    spec = getattr(inner, "spec", None)
    return (tuple(spec), keep) if spec is not None else None


class _Worker:
    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen([sys.executable, "-m", "airflow_hetero_gpu.collect.shard_worker", str(os.getpid())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, message: Any) -> None:
        assert self.proc.stdin is not None
        pickle.dump(message, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.flush()

    def stop(self, wait: float = STOP_WAIT_S) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # the worker's cue to close its connections and exit
        except OSError:
            pass
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class ShardWorkers:
    """``count`` worker processes collecting with the factory ``spec`` describes (see the module).

    ``keep``: the workers keep their connections between :meth:`run` calls and stay up until
    :meth:`close`; otherwise each :meth:`run` starts them and stops them again."""

    def __init__(self, count: int, spec: tuple, keep: bool):
        if count < 1:
            raise ValueError(f"worker count must be >= 1, got {count}")
        self.count = count
        self.spec = spec
        self.keep = keep
        self._workers: list[_Worker | None] = [None] * count
        self._lock = threading.Lock()
        self._home: dict[str, int] = {}  # host name -> its worker, for as long as these workers live

    def shares(self, targets: Sequence[Any]) -> list[list[Any]]:
        """``targets`` split among the workers, round robin; a host keeps its worker (and so its
        kept connection) from one collection to the next."""
        out: list[list[Any]] = [[] for _ in range(self.count)]
        for target in targets:
            index = self._home.setdefault(target.host_name, len(self._home) % self.count)
            out[index].append(target)
        return out

    def _worker(self, index: int) -> _Worker:
        worker = self._workers[index]
        if worker is None or not worker.alive():
            worker = self._workers[index] = _Worker()
        return worker

    def run(self, shares: Sequence[Sequence[Any]], out_dir: Path | None, options: dict[str, Any],
            on_host: Callable[[Any], None] | None, lost: Callable[[Any, str], Any]) -> dict[str, Any]:
        """Collect ``shares[i]`` (SshTargets) in worker ``i``: ``{host name: HostResult}``.

        ``options``: :func:`~airflow_hetero_gpu.collect.ssh.collect_captures` keywords;
        ``lost(target, reason)``: the result of a host whose worker died before reporting it.
        Raises what a worker's collection raised (the open-file limit, an unwritable directory).
        """
        if len(shares) != self.count:
            raise ValueError(f"{len(shares)} shares for {self.count} workers")
        results: dict[str, Any] = {}
        errors: list[BaseException] = []
        busy = [i for i, share in enumerate(shares) if share]
        try:
            for i in busy:
                where = None if out_dir is None else str(out_dir)
                self._worker(i).send(("collect", self.spec, self.keep, list(shares[i]), where, options))
            readers = [threading.Thread(target=self._read, args=(i, shares[i], results, errors, on_host, lost),
                                        name=f"hetero-gpu-collect-worker-{i}", daemon=True) for i in busy]
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join()
        except BaseException:
            self.close(wait=0)  # Ctrl-C or a broken pipe: no worker is left behind
            raise
        if not self.keep:
            self.close()
        if errors:
            raise errors[0]
        return results

    def _read(self, index: int, share: Sequence[Any], results: dict[str, Any], errors: list[BaseException],
              on_host: Callable[[Any], None] | None, lost: Callable[[Any, str], Any]) -> None:
        worker = self._workers[index]
        assert worker is not None and worker.proc.stdout is not None
        while True:
            try:
                kind, payload = pickle.load(worker.proc.stdout)
            except (EOFError, OSError, pickle.UnpicklingError, ValueError):
                # (ValueError: the pipe closed under the read by close() after a Ctrl-C)
                status = worker.proc.wait()
                reason = (f"collector worker process {worker.proc.pid} exited (status {status}) before this "
                          "host was collected")
                with self._lock:
                    for target in share:
                        if target.host_name not in results:
                            results[target.host_name] = lost(target, reason)
                self._workers[index] = None
                return
            if kind == "host":
                with self._lock:
                    results[payload.host] = payload
                if not payload.ok and payload.duplicate_of is None:
                    log.warning("collect %s failed: %s", payload.host, payload.reason)
                if on_host is not None:
                    on_host(payload)
            elif kind == "error":
                with self._lock:
                    errors.append(payload)
                return
            else:  # "done"
                return

    def close(self, wait: float = STOP_WAIT_S) -> None:
        """Stop every worker (their kept connections closed); a later :meth:`run` starts new ones."""
        workers, self._workers = self._workers, [None] * self.count
        for worker in workers:
            if worker is not None:
                worker.stop(wait)


__all__ = ["HOSTS_PER_WORKER", "ShardWorkers", "factory_spec", "worker_count"]
