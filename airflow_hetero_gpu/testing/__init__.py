"""The emulated GPU cluster: real ``sshd`` per host, fake ``nvidia-smi`` behind each.

Used by the test suite and the demo; see ``docs/emulated-cluster.md``. Public names::

    EmulatedCluster, EmulatedHost, HostSpec, GpuSpec, demo_hosts, small_hosts, FAULTS,
    sshd_available, EmbeddedCluster (one asyncssh process for many hosts), scale_hosts

The names load lazily so that the fake tools, which import this package on every remote
command, pay only for what they use.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "EmulatedCluster": "airflow_hetero_gpu.testing.cluster",
    "EmulatedHost": "airflow_hetero_gpu.testing.hoststate",
    "EmbeddedCluster": "airflow_hetero_gpu.testing.embedded.cluster",
    "scale_hosts": "airflow_hetero_gpu.testing.fleets",
    "HostSpec": "airflow_hetero_gpu.testing.state",
    "GpuSpec": "airflow_hetero_gpu.testing.state",
    "FAULTS": "airflow_hetero_gpu.testing.state",
    "demo_hosts": "airflow_hetero_gpu.testing.demo",
    "small_hosts": "airflow_hetero_gpu.testing.demo",
    "SshdError": "airflow_hetero_gpu.testing.sshd",
    "find_sshd": "airflow_hetero_gpu.testing.sshd",
}

__all__ = sorted(_EXPORTS) + ["sshd_available"]


def sshd_available() -> bool:
    """True when the OpenSSH server and ssh-keygen are installed."""
    from airflow_hetero_gpu.testing.sshd import find_ssh_keygen, find_sshd

    return find_sshd() is not None and find_ssh_keygen() is not None


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'airflow_hetero_gpu.testing' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
