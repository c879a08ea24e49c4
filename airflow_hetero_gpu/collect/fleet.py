"""What collects a fleet: the small protocol the health check and the ledger's writers use.

Two implementations: :class:`~airflow_hetero_gpu.hooks.hetero_gpu.HeteroGpuHook` (the hosts are
Airflow ``ssh`` connections) and :class:`SshCollector` (plain SSH targets, for ``hetero-gpu
collect`` and ``hetero-gpu check`` run from cron or systemd without Airflow, and for the health
sensor over a hosts file and one connection); :func:`ssh_collector` builds the latter.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Protocol, Sequence

import yaml

from airflow_hetero_gpu.capture.slurm import parse_topology_conf
from airflow_hetero_gpu.collect.clients import paramiko_client_factory
from airflow_hetero_gpu.collect.persistent import KeptConnections
from airflow_hetero_gpu.collect.shards import ShardWorkers, factory_spec, worker_count
from airflow_hetero_gpu.collect.ssh import ClientFactory, CollectReport, HostResult, collect_captures
from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.core.config import ClusterConfig, config_from_mapping, config_from_text
from airflow_hetero_gpu.errors import ConfigError
from airflow_hetero_gpu.fsutil import atomic_write, read_text


class Collector(Protocol):
    """Collects the captures of its hosts, and says which fleet files go with them."""

    @property
    def hosts(self) -> Mapping[str, Any]: ...

    def collect(self, hosts: Collection[str] | None = None,
                on_host: Callable[[HostResult], None] | None = None) -> CollectReport:
        """Collect ``hosts`` (every host when None); ``on_host`` gets each host's result as soon
        as that host is done (from a collecting thread)."""

    def cluster_config(self) -> ClusterConfig | None: ...

    def fleet_files(self) -> dict[str, str]: ...

    def ssh_targets(self, hosts: Collection[str] | None = None) -> dict[str, SshTarget]: ...

    def client_factory(self, hosts: Collection[str] | None = None) -> ClientFactory: ...


def read_fleet_files(config: str | Path | Mapping[str, Any] | None,
                     topology_conf: str | Path | None) -> tuple[ClusterConfig | None, dict[str, str]]:
    """``cluster.yaml`` (a path or a mapping) and ``topology.conf`` (a path), validated:
    (the configuration or None, ``{"cluster.yaml": text, "topology.conf": text}``)."""
    files: dict[str, str] = {}
    parsed: ClusterConfig | None = None
    if isinstance(config, Mapping):
        parsed = config_from_mapping(config, source="config")
        files["cluster.yaml"] = yaml.safe_dump(dict(config), sort_keys=False)
    elif config is not None:
        path = Path(config)
        try:
            text = read_text(path)
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
        parsed = config_from_text(text, str(path))
        files["cluster.yaml"] = text
    if topology_conf is not None:
        path = Path(topology_conf)
        try:
            text = read_text(path)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read topology.conf: {exc.strerror or exc}") from None
        parse_topology_conf(text, str(path))
        files["topology.conf"] = text
    return parsed, files


class SshCollector:
    """Plain-SSH hosts (``hetero-gpu collect --hosts``, ``hetero-gpu check``) as a :class:`Collector`.

    ``out_dir``: also keep a capture directory there (otherwise no file is written: each host's
    outputs stay in its result, which is what the ledger stores). ``options`` go to
    :func:`~airflow_hetero_gpu.collect.ssh.collect_captures`.

    A large fleet is collected by worker processes (:mod:`~airflow_hetero_gpu.collect.shards`)
    when ``factory`` can be built again in them: ``processes`` of them (default
    :func:`~airflow_hetero_gpu.collect.shards.worker_count` of the fleet; 1: this process
    alone). Behind :class:`~airflow_hetero_gpu.collect.persistent.KeptConnections` they live,
    with their connections, until :meth:`close`.
    """

    def __init__(self, targets: Sequence[SshTarget], factory: ClientFactory, *, out_dir: str | Path | None = None,
                 config: str | Path | None = None, topology_conf: str | Path | None = None,
                 processes: int | None = None, **options: Any):
        self._targets = {t.host_name: t for t in targets}
        if len(self._targets) != len(targets):
            raise ValueError("duplicate host names among the hosts")
        if processes is not None and processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self._factory = factory
        self._workers: ShardWorkers | None = None
        spec = factory_spec(factory)
        count = processes if processes is not None else worker_count(len(self._targets))
        if spec is not None and count > 1:
            self._workers = ShardWorkers(count, *spec)
            weakref.finalize(self, self._workers.close)
        self._config, self._files = read_fleet_files(config, topology_conf)
        self.options = options
        # None: the outputs stay in each host's result (all the ledger stores), no file is written
        self.out_dir = None if out_dir is None else Path(out_dir)

    @property
    def hosts(self) -> dict[str, SshTarget]:
        return dict(self._targets)

    def collect(self, hosts: Collection[str] | None = None,
                on_host: Callable[[HostResult], None] | None = None) -> CollectReport:
        chosen = [t for name, t in self._targets.items() if hosts is None or name in hosts]
        report = collect_captures(chosen, self.out_dir, self._factory, on_host=on_host, workers=self._workers,
                                  **self.options)
        if self.out_dir is not None:
            for name, text in self._files.items():  # the directory plans like the ledger's inventory
                atomic_write(self.out_dir / name, text)
        return report

    def cluster_config(self) -> ClusterConfig | None:
        return self._config

    def fleet_files(self) -> dict[str, str]:
        return dict(self._files)

    def ssh_targets(self, hosts: Collection[str] | None = None) -> dict[str, SshTarget]:
        return {name: t for name, t in self._targets.items() if hosts is None or name in hosts}

    def client_factory(self, hosts: Collection[str] | None = None) -> ClientFactory:
        return self._factory

    @property
    def processes(self) -> int:
        """Processes that collect: the worker processes, or 1 (this one)."""
        return self._workers.count if self._workers is not None else 1

    def close(self) -> None:
        """Stop the worker processes (and the connections they kept) and close the connections
        kept in this process; a later collection starts the workers again."""
        if self._workers is not None:
            self._workers.close()
        close = getattr(self._factory, "close", None)  # KeptConnections
        if close is not None:
            close()


def ssh_collector(targets: Sequence[SshTarget], *, identity_file: str | None = None, known_hosts: str | None = None,
                  keep_connections: bool = False, out_dir: str | Path | None = None,
                  config: str | Path | Mapping[str, Any] | None = None, topology_conf: str | Path | None = None,
                  **options: Any) -> SshCollector:
    """The :class:`SshCollector` of ``targets`` reached with ``identity_file`` (else the agent and
    the default keys), host keys verified against ``known_hosts`` (default
    ``~/.ssh/known_hosts``); ``keep_connections``: behind
    :class:`~airflow_hetero_gpu.collect.persistent.KeptConnections` (in the worker processes of
    a large fleet), until :meth:`SshCollector.close`. ``options``: the collection's settings
    (``max_parallel``, ``connect_timeout``, ...). ValueError (one line) for a missing or
    unreadable key or known_hosts file."""
    factory: ClientFactory = paramiko_client_factory(identity_file, known_hosts, options.get("connect_timeout", 10))
    if keep_connections:
        factory = KeptConnections(factory)
    return SshCollector(targets, factory, out_dir=out_dir, config=config, topology_conf=topology_conf, **options)
