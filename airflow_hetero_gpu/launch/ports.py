"""The rendezvous port: probed on the first host, or derived from the job id.

Two policies, or a fixed port, chosen by the caller (:func:`choose_rdzv_port`, which
:func:`airflow_hetero_gpu.launch.remote.torchrun_job` calls):

- ``"probe"`` (the default): run :data:`FREE_PORT_COMMAND` on the first host over SSH. It binds
  port 0 on all interfaces, prints the port the kernel picked, and closes the socket; torchrun's
  c10d store binds it a moment later. Needs ``python3`` on the first host (a training host has
  it). The port is free when probed; another program could take it in the second before torchrun
  does, which then fails the rendezvous with "address already in use" (rare; retry the task).
- ``"derive"``: :func:`derive_port` maps the job id to a port in a configurable range (default
  29400-29999, starting at torchrun's own default port, which firewalls between training hosts
  often open). No round trip and the same port on every retry of a job, but two jobs whose
  ids hash alike, or another program, may hold it.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import paramiko

from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.launch.command import validate_job_id
from airflow_hetero_gpu.launch.failures import JobStartError
from airflow_hetero_gpu.launch.orphans import ClientFactory

#: The range :func:`derive_port` draws from, inclusive.
DEFAULT_PORT_RANGE = (29400, 29999)

#: A constant command: nothing from the user is interpolated into it.
FREE_PORT_COMMAND = (
    "python3 -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); "
    "print(s.getsockname()[1]); s.close()'"
)


class PortProbeError(RuntimeError):
    """The free-port probe on the first host failed; the message says how."""


def derive_port(job_id: str, port_range: tuple[int, int] = DEFAULT_PORT_RANGE) -> int:
    """A port in ``port_range`` (inclusive) that depends only on the job id (SHA-256 based)."""
    low, high = port_range
    if not (1 <= low <= high <= 65535):
        raise ValueError(f"invalid port range {port_range!r}: need 1 <= low <= high <= 65535")
    digest = hashlib.sha256(validate_job_id(job_id).encode("utf-8")).digest()
    return low + int.from_bytes(digest[:8], "big") % (high - low + 1)


def probe_free_port(client: paramiko.SSHClient, timeout: float = 15.0) -> int:
    """Ask the host behind ``client`` for a free TCP port (see :data:`FREE_PORT_COMMAND`)."""
    try:
        _, stdout, stderr = client.exec_command(FREE_PORT_COMMAND, timeout=timeout)
        out = stdout.read().decode("utf-8", "replace").strip()
        err = stderr.read().decode("utf-8", "replace").strip()
        status = stdout.channel.recv_exit_status()
    except Exception as exc:  # paramiko raises socket errors and SSHException alike
        raise PortProbeError(f"free-port probe failed: {exc}") from exc
    if status != 0 or not out.isdigit() or not 1 <= int(out) <= 65535:
        detail = err.splitlines()[-1] if err else out or "(no output)"
        raise PortProbeError(f"free-port probe exited with status {status}: {detail}")
    return int(out)


def choose_rdzv_port(job_id: str, first: SshTarget, client_factory: ClientFactory,
                     policy: int | Literal["probe", "derive"] = "probe",
                     port_range: tuple[int, int] = DEFAULT_PORT_RANGE) -> int:
    """The rendezvous port by ``policy``: a fixed number, ``"derive"`` (from the job id) or
    ``"probe"`` (a free port on the first host, reached through ``client_factory``)."""
    if isinstance(policy, int) and not isinstance(policy, bool):
        if not 1 <= policy <= 65535:
            raise ValueError(f"invalid rendezvous port {policy}: must be 1-65535")
        return policy
    if policy == "derive":
        return derive_port(job_id, port_range)
    if policy != "probe":
        raise ValueError(f"invalid rendezvous port policy {policy!r}: use a port, 'probe' or 'derive'")
    try:
        client = client_factory(first)
    except Exception as exc:
        raise JobStartError(first.host_name, f"{exc or type(exc).__name__}") from exc
    try:
        return probe_free_port(client)
    finally:
        client.close()


__all__ = ["DEFAULT_PORT_RANGE", "FREE_PORT_COMMAND", "PortProbeError", "choose_rdzv_port", "derive_port",
           "probe_free_port"]
