"""The embedded emulated fleet: one asyncssh server process for many emulated GPU hosts.

For scale (hundreds to thousands of hosts on one machine) and where no ``sshd`` is installed; the
real-sshd :class:`~airflow_hetero_gpu.testing.cluster.EmulatedCluster` stays the one for
end-to-end tests. See ``docs/emulated-cluster.md``. Modules:

- :mod:`.shell`: the part of the shell answered in-process by the fake tools;
- :mod:`.server`: the asyncssh hosts, sessions and real processes;
- :mod:`.serve`: the server process (``python -m airflow_hetero_gpu.testing.embedded serve``);
- :mod:`.cluster`: :class:`EmbeddedCluster`, which starts and drives that process.
"""

from airflow_hetero_gpu.testing.embedded.cluster import EmbeddedCluster, EmbeddedServerError

__all__ = ["EmbeddedCluster", "EmbeddedServerError"]
