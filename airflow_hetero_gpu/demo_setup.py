"""What both demos (``make demo``, ``make demo-ui``) set up: the emulated fleet, its files, the
embedded Airflow's environment, and a clean stop on SIGTERM.

- :func:`demo_cluster`: the emulated five-host cluster behind a real ``sshd`` per host, or,
  where OpenSSH's server is not installed (or ``ssh_server="embedded"``), behind the embedded
  SSH server (one asyncssh process for every host); it says which in one line.
- :func:`demo_env`: ``cluster.yaml``, ``topology.conf`` and the ``AIRFLOW__*`` / connection
  variables of the demo's Airflow in its directory.
- :func:`stop_on_signals`: SIGTERM and SIGHUP raise :class:`Stopped` in the main thread, so
  every ``finally`` runs (hosts stopped, directory removed) however the demo is ended.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, TextIO

from airflow_hetero_gpu.testing import sshd_available
from airflow_hetero_gpu.testing.airflow_env import airflow_env, connection_env
from airflow_hetero_gpu.testing.cluster import EmulatedCluster
from airflow_hetero_gpu.testing.demo import CLUSTER_YAML, TOPOLOGY_CONF, demo_hosts

SSH_SERVERS = ("auto", "sshd", "embedded")


class DemoError(RuntimeError):
    """A reason the demo cannot run, said in one line (no traceback)."""


class Stopped(BaseException):
    """The demo was asked to stop (SIGTERM, SIGHUP); a BaseException, like KeyboardInterrupt."""


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Inside: SIGTERM/SIGHUP raise :class:`Stopped` once; a second signal during the clean-up
    is ignored, so the clean-up finishes. Outside: the previous handlers."""
    watched = (signal.SIGTERM, signal.SIGHUP)

    def handler(signum: int, frame: Any) -> None:
        for sig in watched:
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in watched}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def embedded_cluster_class() -> type | None:
    """The embedded SSH server's cluster class, or None where this installation lacks it."""
    try:
        from airflow_hetero_gpu.testing.embedded import EmbeddedCluster
    except ImportError:
        return None
    return EmbeddedCluster


def demo_cluster(root: Path, ssh_server: str = "auto", out: TextIO = sys.stdout):
    """The (not yet started) emulated demo cluster; says in one line when it is not OpenSSH."""
    if ssh_server not in SSH_SERVERS:
        raise DemoError(f"--ssh-server: expected one of {', '.join(SSH_SERVERS)}, got {ssh_server!r}")
    if ssh_server == "sshd" or (ssh_server == "auto" and sshd_available()):
        if not sshd_available():
            raise DemoError("--ssh-server sshd: OpenSSH's sshd or ssh-keygen is not installed "
                            "(apt-get install -y openssh-server openssh-client)")
        return EmulatedCluster(root, demo_hosts())
    embedded = embedded_cluster_class()
    if embedded is None:
        raise DemoError("OpenSSH's sshd is not installed and this installation has no embedded SSH server: "
                        "install openssh-server and openssh-client (apt-get install -y openssh-server "
                        "openssh-client)")
    why = "as asked" if ssh_server == "embedded" else "OpenSSH's sshd is not installed here"
    out.write(f"emulated hosts: the embedded SSH server (asyncssh, one process for all hosts), {why}\n")
    return embedded(root, demo_hosts())


def demo_env(root: Path, cluster: Any, dags: Path) -> dict[str, str]:
    """The demo Airflow's environment: its home and settings under ``root``, a connection per host."""
    conns, ids = connection_env(cluster)
    config = root / "cluster.yaml"
    config.write_text(CLUSTER_YAML)
    topology = root / "topology.conf"
    topology.write_text(TOPOLOGY_CONF)
    env = airflow_env(root / "airflow", dags, {
        **conns,
        "AIRFLOW__HETERO_GPU__SSH_CONN_IDS": ",".join(f"{h}={c}" for h, c in ids.items()),
        "AIRFLOW__HETERO_GPU__CAPTURES_DIR": str(root / "captures"),
        "AIRFLOW__HETERO_GPU__CLUSTER_CONFIG": str(config),
        "AIRFLOW__HETERO_GPU__TOPOLOGY_CONF": str(topology),
        "AIRFLOW__HETERO_GPU__LEDGER_URL": f"sqlite:///{root / 'ledger.db'}",
        "HETERO_GPU_CHECKPOINT_ROOT": str(root / "checkpoints"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(dags), os.environ.get("PYTHONPATH", "")) if p),
    })
    # `airflow standalone` (and anything else started as a bare `airflow`) finds this environment's
    # command first, whether or not the virtualenv is activated
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir] + [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bin_dir])
    return env
