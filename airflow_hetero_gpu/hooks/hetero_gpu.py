"""``HeteroGpuHook``: the GPU inventory of a fleet of servers reached through Airflow ``ssh`` connections.

The hook reuses the user's existing ``ssh`` connections (providers-ssh's ``SSHHook``: host, port,
login, ``key_file``/``private_key``, ``host_key``); it adds no connection type of its own. It
collects a capture directory (SPEC section 2) in parallel and reads it back as the planner's
:class:`~airflow_hetero_gpu.core.cluster.Cluster`::

    hook = HeteroGpuHook(["gpu_a1", "gpu_a2", "gpu_rtx"], captures_dir="/var/lib/hetero-gpu/captures")
    cluster = hook.get_cluster()          # collect + read; failed hosts' GPUs are "unreachable"
    frame = hook.get_dataframe(cluster)   # one row per GPU

Host keys are verified as providers-ssh does (the ``host_key`` extra, else ``~/.ssh/known_hosts``);
SSHHook's own connect retries are switched off (``conn_retry_attempts=1``) so the collector's
policy applies: transient network errors are retried, a changed host key never is.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import weakref
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence

from airflow.sdk import BaseHook

from airflow_hetero_gpu.capture.directory import read_capture_dir
from airflow_hetero_gpu.collect.clients import close_socket, open_socket
from airflow_hetero_gpu.collect.fleet import read_fleet_files
from airflow_hetero_gpu.collect.ssh import DEFAULT_MAX_PARALLEL, CollectReport, HostFailure, HostResult, collect_captures
from airflow_hetero_gpu.fsutil import atomic_write
from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.core.changes import InventoryChange, diff_clusters
from airflow_hetero_gpu.core.config import ClusterConfig, load_config
from airflow_hetero_gpu.core.inventory import XIDS_FROM_LEDGER, cluster_from_captures
from airflow_hetero_gpu.errors import ConfigError, HeteroGpuError
from airflow_hetero_gpu.settings import setting

if TYPE_CHECKING:
    import pandas
    import paramiko
    from airflow.providers.ssh.hooks.ssh import SSHHook

    from airflow_hetero_gpu.core.cluster import Cluster

#: Standard logging, so records reach Airflow's task log (which captures stdlib logging) and any
#: handler a caller attaches; the hook's own ``self.log`` is a structlog logger.
log = logging.getLogger(__name__)

#: Columns of :meth:`HeteroGpuHook.get_dataframe`, in order.
DATAFRAME_COLUMNS = (
    "host", "index", "uuid", "name", "memory_total_mib", "memory_used_mib", "utilization",
    "temperature_c", "power_w", "load", "healthy", "reasons", "pool",
)


def normalize_conn_ids(ssh_conn_ids: Sequence[str] | Mapping[str, str] | str) -> dict[str, str]:
    """``{host label: ssh conn id}`` from a list (the conn id is the label), a mapping, or a
    comma-separated string of ``CONN_ID`` / ``LABEL=CONN_ID`` items. ValueError names the problem."""
    if isinstance(ssh_conn_ids, str):
        items = [item.strip() for item in ssh_conn_ids.split(",")]
        if not all(items):
            raise ValueError(f"empty item in ssh_conn_ids {ssh_conn_ids!r}")
        pairs = [tuple(item.split("=", 1)) if "=" in item else (item, item) for item in items]
    elif isinstance(ssh_conn_ids, Mapping):
        pairs = list(ssh_conn_ids.items())
    else:
        pairs = [(conn_id, conn_id) for conn_id in ssh_conn_ids]
    if not pairs:
        raise ValueError("ssh_conn_ids is empty: name at least one Airflow ssh connection")
    out: dict[str, str] = {}
    for label, conn_id in pairs:
        if not isinstance(label, str) or not isinstance(conn_id, str) or not label.strip() or not conn_id.strip():
            raise ValueError(f"ssh_conn_ids: expected non-empty strings, got {label!r} -> {conn_id!r}")
        label, conn_id = label.strip(), conn_id.strip()
        if label in out:
            raise ValueError(f"ssh_conn_ids: host label {label!r} appears twice")
        SshTarget(label, "placeholder")  # validates the label as a capture-directory host name
        out[label] = conn_id
    return out


class HeteroGpuHook(BaseHook):
    """Collect the GPU inventory of hosts named by Airflow ``ssh`` connections.

    :param ssh_conn_ids: the hosts: a list of ssh connection ids (each id is also the host's
        name in the inventory), or a mapping host label -> connection id.
    :param captures_dir: where to keep the capture directory. Give a persistent directory so a
        host that fails keeps its last good ``query.csv`` (its GPUs then show as unreachable);
        without one, a temporary directory lives as long as the hook.
    :param config: ``cluster.yaml`` path or the same as a mapping (SPEC section 3); written into
        the capture directory so ``hetero-gpu plan --captures`` sees the same cluster.
    :param topology_conf: Slurm ``topology.conf`` of the network between hosts (SPEC section 5).
    :param max_parallel: hosts worked on at once (default
        :data:`~airflow_hetero_gpu.collect.ssh.DEFAULT_MAX_PARALLEL`).
    :param connect_timeout: seconds for TCP connect, SSH banner and authentication, per host.
    :param command_timeout: seconds for each remote command.
    :param retries: further attempts per host after a transient network error.
    :param read_kernel_log: read Xid lines from ``journalctl -k`` / ``dmesg``.
    :param use_nvml: query GPUs through the NVML agent where the host has python3 + pynvml.
    :param nvml_python: the hosts' interpreter that has pynvml (a name or path; default python3).
    :param connections: the hosts' connections, already resolved (``{label: Connection}``); a
        trigger resolves them in its event loop and hands them over, so no lookup happens here.
    :param keep_connections: keep each host's SSH connection open from one :meth:`collect` to
        the next (a health watch that checks every minute; see ``collect/persistent.py``); a
        new connection verifies the host key as always. :meth:`close` closes them.
    """

    hook_name = "Heterogeneous GPU cluster"

    def __init__(
        self,
        ssh_conn_ids: Sequence[str] | Mapping[str, str] | str | None = None,
        *,
        captures_dir: str | Path | None = None,
        config: str | Path | Mapping[str, Any] | None = None,
        topology_conf: str | Path | None = None,
        max_parallel: int = DEFAULT_MAX_PARALLEL,
        connect_timeout: float = 10,
        command_timeout: float = 30,
        retries: int = 2,
        read_kernel_log: bool = True,
        use_nvml: bool = False,
        nvml_python: str = "python3",
        connections: Mapping[str, Any] | None = None,
        logger_name: str | None = None,
        keep_connections: bool = False,
    ) -> None:
        super().__init__(logger_name=logger_name)
        self.ssh_conn_ids = ssh_conn_ids
        # Connections already resolved by the caller (a trigger does it in its event loop with
        # the async lookup): {host label: Connection, or the exception its lookup raised}.
        self.connections = dict(connections or {})
        self.captures_dir = captures_dir
        self.config = config
        self.topology_conf = topology_conf
        self.max_parallel = max_parallel
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.retries = retries
        self.read_kernel_log = read_kernel_log
        self.use_nvml = use_nvml
        self.nvml_python = nvml_python
        #: What changed between the last two :meth:`get_cluster` calls (None after the first).
        self.last_change: InventoryChange | None = None
        #: The report of the last collection.
        self.last_report: CollectReport | None = None
        self._previous: Cluster | None = None
        self._ssh_hooks: dict[tuple[str, str], SSHHook] = {}
        self.keep_connections = keep_connections
        self._kept: Any = None  # KeptConnections over the current collection's factory
        self._connect: Any = None

    # -- lazily built pieces -------------------------------------------------------------------

    @property
    def hosts(self) -> dict[str, str]:
        """``{host label: ssh conn id}`` of :attr:`ssh_conn_ids` (default: ``[hetero_gpu]
        ssh_conn_ids``), which may be changed between collections (a host added to the fleet
        shows up in the next one)."""
        ids = self.ssh_conn_ids
        if not ids:
            ids = setting("ssh_conn_ids")
            if not ids:
                raise ConfigError("no GPU hosts: give ssh_conn_ids, or set [hetero_gpu] ssh_conn_ids "
                                  "(AIRFLOW__HETERO_GPU__SSH_CONN_IDS) to CONN,CONN or LABEL=CONN,...")
        return normalize_conn_ids(ids)

    @cached_property
    def captures_path(self) -> Path:
        """The capture directory (created on first use): ``captures_dir``, else
        ``[hetero_gpu] captures_dir``, else a temporary directory."""
        captures_dir = self.captures_dir or setting("captures_dir")
        if captures_dir:
            path = Path(captures_dir)
            path.mkdir(parents=True, exist_ok=True)
            return path
        path = Path(tempfile.mkdtemp(prefix="hetero-gpu-captures-"))
        weakref.finalize(self, shutil.rmtree, str(path), True)
        return path

    def _captures_kept(self) -> bool:
        """Whether :attr:`captures_path` is a directory someone named (kept: its files are
        written durably), not this hook's temporary one."""
        return bool(self.captures_dir or setting("captures_dir"))

    def ssh_hook(self, label: str, conn_id: str | None = None) -> SSHHook:
        """The providers-ssh hook of one host, built on first use (this reads the connection)."""
        conn_id = conn_id or self.hosts[label]
        hook = self._ssh_hooks.get((label, conn_id))
        if hook is None:
            from airflow.providers.ssh.hooks.ssh import SSHHook  # noqa: PLC0415 - heavy, lazy

            cls = SSHHook
            if label in self.connections:
                resolved = self.connections[label]
                if isinstance(resolved, BaseException):
                    raise resolved

                class ResolvedSSHHook(SSHHook):  # no lookup: the connection is at hand
                    def get_connection(self, conn_id: str) -> Any:  # type: ignore[override]
                        return resolved

                cls = ResolvedSSHHook
            hook = cls(
                ssh_conn_id=conn_id,
                conn_timeout=self.connect_timeout,  # type: ignore[arg-type]
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,  # type: ignore[arg-type]
                cmd_timeout=self.command_timeout,
                conn_retry_attempts=1,
            )
            self._ssh_hooks[(label, conn_id)] = hook
        return hook

    def _labels(self, hosts: Collection[str] | None) -> dict[str, str]:
        fleet = self.hosts
        if hosts is None:
            return fleet
        unknown = sorted(set(hosts) - set(fleet))
        if unknown:
            raise HeteroGpuError(f"host {unknown[0]!r} is not one of the fleet's ssh_conn_ids")
        return {label: fleet[label] for label in fleet if label in hosts}

    def _targets(self, hosts: Collection[str] | None = None) -> tuple[list[SshTarget], dict[str, SSHHook], dict[str, str]]:
        """Targets of the hosts (all when None), their SSH hooks, and why a host's connection cannot
        be used. Only the named hosts' connections are read.

        Connections are read here, in the calling thread, before the fan-out: Airflow's
        connection lookup is not meant to be called from many threads at once.
        """
        targets, hooks, unusable = [], {}, {}
        for label, conn_id in self._labels(hosts).items():
            try:
                hooks[label] = hook = self.ssh_hook(label, conn_id)
                targets.append(SshTarget(label, str(hook.remote_host), int(hook.port or 22), hook.username))
            except Exception as exc:  # noqa: BLE001 - a bad connection fails its host only
                reason = " ".join(str(exc).split()) or type(exc).__name__
                unusable[label] = f"Airflow connection {conn_id!r} cannot be used: {reason}"
                targets.append(SshTarget(label, conn_id))
        return targets, hooks, unusable

    def _factory(self, hooks: Mapping[str, SSHHook], unusable: Mapping[str, str]):
        hooks = dict(hooks)
        locks: dict[str, threading.Lock] = {label: threading.Lock() for label in hooks}
        guard = threading.Lock()

        def connect(target: SshTarget, connect_timeout: float | None = None) -> paramiko.SSHClient:
            if target.host_name in unusable:
                raise HostFailure(unusable[target.host_name], config=True)
            with guard:
                if target.host_name not in hooks:  # a host added later (a replacement elsewhere)
                    hooks[target.host_name] = self.ssh_hook(target.host_name)
                    locks[target.host_name] = threading.Lock()
                hook, lock = hooks[target.host_name], locks[target.host_name]
            # A fresh client per call (callers close every one); SSHHook keeps the last client
            # on itself and hands it out again, so calls for one host must not interleave.
            with lock:
                hook.client = None
                if hook.host_proxy_cmd:  # the connection goes through its ProxyCommand
                    return hook.get_conn()
                # SSHHook connects through the socket it is given (what a ProxyCommand would
                # be): a TCP one with TCP_NODELAY, so the handshake's small packets do not wait
                # for delayed acknowledgements.
                timeout = connect_timeout if connect_timeout is not None else hook.conn_timeout
                hook.host_proxy = open_socket(str(hook.remote_host), int(hook.port or 22), timeout)
                try:
                    return hook.get_conn()
                except BaseException:
                    close_socket(hook.host_proxy)  # its transport first: no paramiko noise
                    raise
                finally:
                    hook.host_proxy = None

        return connect

    def ssh_targets(self, hosts: Collection[str] | None = None) -> dict[str, SshTarget]:
        """``{host label: SshTarget}`` from the hosts' Airflow connections (for launching); only
        the named hosts' connections are read (all when None)."""
        targets, _, unusable = self._targets(hosts)
        if unusable:
            raise HeteroGpuError("; ".join(unusable.values()))
        return {t.host_name: t for t in targets}

    def client_factory(self, hosts: Collection[str] | None = None):
        """A ``factory(target) -> paramiko.SSHClient`` over the hosts' connections, host keys
        verified as the connections say; each call opens a new client. Hosts beyond ``hosts``
        have their connection read when first asked for."""
        _, hooks, unusable = self._targets(hosts)
        return self._factory(hooks, unusable)

    # -- the fleet's files ---------------------------------------------------------------------
    def _fleet_sources(self):
        # arguments win; else the deployment's [hetero_gpu] settings
        config = self.config if self.config is not None else setting("cluster_config")
        topology_conf = self.topology_conf if self.topology_conf is not None else setting("topology_conf")
        return config, topology_conf

    def cluster_config(self) -> ClusterConfig | None:
        """The fleet's ``cluster.yaml`` (argument, else ``[hetero_gpu] cluster_config``), or None."""
        return read_fleet_files(*self._fleet_sources())[0]

    def fleet_files(self) -> dict[str, str]:
        """``cluster.yaml`` and ``topology.conf`` texts (validated) as the ledger stores them."""
        return read_fleet_files(*self._fleet_sources())[1]

    def _write_cluster_files(self, out: Path) -> None:
        """Put ``cluster.yaml`` and ``topology.conf`` beside the captures (validated first)."""
        for name, text in self.fleet_files().items():
            atomic_write(out / name, text)

    # -- public API ----------------------------------------------------------------------------

    def collect(self, hosts: Collection[str] | None = None,
                on_host: Callable[[HostResult], None] | None = None) -> CollectReport:
        """Collect the hosts (every host when None) into :attr:`captures_path`; failed hosts get
        ``error.txt``. Only the collected hosts' connections are read. ``on_host`` gets each
        host's result as soon as the host is done (from a collecting thread)."""
        out = self.captures_path
        self._write_cluster_files(out)
        targets, hooks, unusable = self._targets(hosts)
        report = collect_captures(
            targets, out, self._collect_factory(self._factory(hooks, unusable)), max_parallel=self.max_parallel,
            connect_timeout=self.connect_timeout, command_timeout=self.command_timeout,
            retries=self.retries, read_kernel_log=self.read_kernel_log, use_nvml=self.use_nvml,
            nvml_python=self.nvml_python, durable=self._captures_kept(), on_host=on_host,
        )
        self.last_report = report
        return report

    def _collect_factory(self, connect):
        """``connect`` as it is, or behind the connections kept since the last collection."""
        if not self.keep_connections:
            return connect
        from airflow_hetero_gpu.collect.persistent import KeptConnections  # noqa: PLC0415

        self._connect = connect  # new connections go through this collection's factory
        if self._kept is None:
            self._kept = KeptConnections(
                lambda target, connect_timeout=None: self._connect(target, connect_timeout=connect_timeout))
        return self._kept

    @property
    def kept_connections(self) -> Any:
        """The connections kept between collections (None until the first, or when not kept)."""
        return self._kept

    def close(self) -> None:
        """Close the connections kept between collections (a no-op when none are)."""
        if self._kept is not None:
            self._kept.close()
            self._kept = None

    def load_cluster(self) -> Cluster:
        """Read the capture directory as it is now (this hook's hosts only). Its readers plan
        with the ledger, whose evictions carry the Xid lines (``XIDS_FROM_LEDGER``)."""
        captures = read_capture_dir(self.captures_path)
        captures.hosts = {name: cap for name, cap in captures.hosts.items() if name in self.hosts}
        return cluster_from_captures(captures, load_config(captures.config_path), xid_rule=XIDS_FROM_LEDGER)

    def get_cluster(self) -> Cluster:
        """Collect, read, log failed hosts and what changed since this hook's previous call."""
        report = self.collect()
        for host in report.failed:
            log.warning("GPU host %s: collection failed: %s", host.host, host.reason)
        for host in report.ok:
            for warning in host.warnings:
                log.info("GPU host %s: %s", host.host, warning)
        cluster = self.load_cluster()
        log.info("GPU inventory: %d GPUs on %d hosts (%d collected, %d failed), %d pools",
                      len(cluster.gpus), len(cluster.hosts), len(report.ok), len(report.failed),
                      len(cluster.pools))
        if self._previous is not None:
            change = diff_clusters(self._previous, cluster)
            for line in change.lines():
                log.info("GPU inventory change: %s", line)
            self.last_change = change
        self._previous = cluster
        return cluster

    def get_dataframe(self, cluster: Cluster | None = None) -> pandas.DataFrame:
        """One row per GPU (:data:`DATAFRAME_COLUMNS`); collects first unless given a cluster."""
        import pandas as pd  # noqa: PLC0415

        if cluster is None:
            cluster = self.get_cluster()
        rows = []
        for position, gpu in enumerate(cluster.gpus):
            row = gpu.to_json()
            row["reasons"] = list(gpu.reasons)
            row["load"] = gpu.base_load
            row["pool"] = cluster.pools[int(cluster.pool_of[position])].id
            rows.append(row)
        return pd.DataFrame(rows, columns=list(DATAFRAME_COLUMNS))

    def test_connection(self) -> tuple[bool, str]:
        """Reach every host once (query and topology, no kernel log, no retry) into a temporary
        directory; True when all answered. The message has one entry per host."""
        try:
            targets, hooks, unusable = self._targets()
            with tempfile.TemporaryDirectory(prefix="hetero-gpu-test-") as tmp:
                report = collect_captures(
                    targets, tmp, self._factory(hooks, unusable), max_parallel=self.max_parallel,
                    connect_timeout=self.connect_timeout, command_timeout=self.command_timeout,
                    retries=0, read_kernel_log=False, use_nvml=self.use_nvml,
                    nvml_python=self.nvml_python,
                )
        except Exception as exc:  # noqa: BLE001 - the UI shows the message
            return False, f"{type(exc).__name__}: {exc}"
        parts = [f"{h.host}: ok" if h.ok else f"{h.host}: {h.reason}" for h in report.hosts]
        ok = bool(report.hosts) and not report.failed
        return ok, f"{len(report.ok)}/{len(report.hosts)} hosts answered. " + "; ".join(parts)

