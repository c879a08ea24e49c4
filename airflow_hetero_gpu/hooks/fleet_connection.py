"""One Airflow ``ssh`` connection for a whole fleet, whose hosts are listed in a hosts file.

A fleet of a thousand hosts does not need a thousand connections: the health watch
(``GpuHealthSensor(hosts_file=..., ssh_conn_id=...)``) reads its hosts from a hosts file (the
``hetero-gpu check --hosts-file`` format, one ``[NAME=][USER@]HOST[:PORT]`` a line) and resolves
one connection that says how to reach all of them:

* ``login``: the user of every entry that names none (else the local user);
* ``port``: the port of every entry that names none (else 22);
* ``key_file`` extra: the private key offered (else the agent and the default keys);
* ``known_hosts`` extra: the known_hosts file every host key is verified against (default
  ``~/.ssh/known_hosts``). One ``host_key`` cannot verify many hosts, and host keys are always
  verified: a ``host_key``, ``no_host_key_check`` or ``allow_host_key_change`` extra is refused.

The connection's ``host`` is not used. The collection is the one ``hetero-gpu check
--hosts-file`` runs (:func:`~airflow_hetero_gpu.collect.fleet.ssh_collector`): worker processes
for a large fleet, connections kept between checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from airflow_hetero_gpu.collect.fleet import SshCollector, ssh_collector
from airflow_hetero_gpu.collect.targets import parse_hosts_file
from airflow_hetero_gpu.errors import ConfigError

#: The extra naming the known_hosts file of a fleet connection.
KNOWN_HOSTS_EXTRA = "known_hosts"
#: Extras that would verify one host only, or none: refused on a fleet connection.
REFUSED_EXTRAS = ("host_key", "no_host_key_check", "ignore_hostkey_verification", "allow_host_key_change")


@dataclass(frozen=True)
class FleetAccess:
    """How a fleet connection reaches its hosts."""

    user: str | None
    port: int
    key_file: str | None
    known_hosts: str | None


def _set(value: Any) -> bool:
    """Whether an extra holds a value that turns something on (``"false"``, empty: not)."""
    if isinstance(value, str):
        return value.strip().lower() not in ("", "false", "0", "no", "off")
    return bool(value)


def fleet_access(conn: Any, conn_id: str) -> FleetAccess:
    """The :class:`FleetAccess` of the resolved connection ``conn`` (named ``conn_id`` in
    messages); ConfigError (one line naming the connection and the extra) for what a fleet
    connection cannot do."""
    where = f"Airflow connection {conn_id!r}"
    try:
        extra: Mapping[str, Any] = conn.extra_dejson or {}
    except Exception as exc:  # noqa: BLE001 - a malformed extra
        raise ConfigError(f"{where}: its extra is not a JSON object: {' '.join(str(exc).split())}") from None
    for name in REFUSED_EXTRAS:
        if _set(extra.get(name)):
            raise ConfigError(
                f"{where}: the {name!r} extra cannot be used for a fleet of hosts (host keys are always verified, "
                f"each against the connection's {KNOWN_HOSTS_EXTRA!r} file, default ~/.ssh/known_hosts): remove it")
    if _set(extra.get("private_key")):
        raise ConfigError(f"{where}: a fleet connection takes its key from a file: give the 'key_file' extra "
                          "instead of 'private_key'")
    try:
        port = int(conn.port) if conn.port not in (None, "") else 22
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: port {conn.port!r} is not a number") from None
    if not 1 <= port <= 65535:
        raise ConfigError(f"{where}: port {port} must be 1-65535")
    key_file, known_hosts = extra.get("key_file") or None, extra.get(KNOWN_HOSTS_EXTRA) or None
    for name, value in (("key_file", key_file), (KNOWN_HOSTS_EXTRA, known_hosts)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{where}: the {name!r} extra must be a path, got {value!r}")
    return FleetAccess(user=(conn.login or None), port=port,
                       key_file=None if key_file is None else str(Path(key_file).expanduser()),
                       known_hosts=None if known_hosts is None else str(Path(known_hosts).expanduser()))


def fleet_collector(conn: Any, conn_id: str, hosts_file: str, *, keep_connections: bool = False,
                    captures_dir: str | None = None, config: str | Mapping[str, Any] | None = None,
                    topology_conf: str | None = None, **options: Any) -> SshCollector:
    """The collector of the hosts of ``hosts_file`` reached as the resolved connection ``conn``
    says (see the module). ConfigError, one line naming the file and line or the connection, for
    a bad hosts file or a connection a fleet cannot use."""
    access = fleet_access(conn, conn_id)
    try:
        targets = parse_hosts_file(hosts_file, user=access.user, port=access.port)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return ssh_collector(targets, identity_file=access.key_file, known_hosts=access.known_hosts,
                             keep_connections=keep_connections, out_dir=captures_dir, config=config,
                             topology_conf=topology_conf, **options)
    except ValueError as exc:  # the key or the known_hosts file
        raise ConfigError(f"Airflow connection {conn_id!r}: {exc}") from None


__all__ = ["FleetAccess", "KNOWN_HOSTS_EXTRA", "REFUSED_EXTRAS", "fleet_access", "fleet_collector"]
