"""Pytest fixtures for the emulated GPU cluster. Import them explicitly in a test module::

    from cluster_fixtures import emulated_cluster  # noqa: F401

    def test_something(emulated_cluster):
        cluster = emulated_cluster()                 # the demo fleet, started
        small = emulated_cluster(small_hosts(2))     # or any list of HostSpec

Every cluster the factory made is stopped at teardown (sshd and every remote command killed).
Tests using it are skipped, with the reason, only when the OpenSSH server is not installed.
``embedded_cluster`` is the same for the asyncssh-served fleet (no sshd needed).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import pytest

from airflow_hetero_gpu.testing import sshd_available
from airflow_hetero_gpu.testing.cluster import EmulatedCluster
from airflow_hetero_gpu.testing.demo import demo_hosts
from airflow_hetero_gpu.testing.embedded import EmbeddedCluster
from airflow_hetero_gpu.testing.state import HostSpec

ClusterFactory = Callable[..., EmulatedCluster]

SKIP_REASON = (
    "OpenSSH server not installed (no sshd/ssh-keygen): "
    "apt-get install openssh-server openssh-client"
)


def _started_clusters(tmp_path_factory: pytest.TempPathFactory, cls: Callable[..., Any],
                      prefix: str) -> Iterator[Callable[..., Any]]:
    """Yield a factory of started ``cls`` clusters (demo hosts by default), stopping them all after."""
    made: list[Any] = []

    def factory(hosts: Sequence[HostSpec] | None = None, **kwargs: Any) -> Any:
        cluster = cls(tmp_path_factory.mktemp(prefix), list(hosts) if hosts is not None else demo_hosts(), **kwargs)
        made.append(cluster)
        return cluster.start()

    try:
        yield factory
    finally:
        for cluster in made:
            cluster.stop()


@pytest.fixture
def emulated_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFactory]:
    """A factory ``(hosts=None, **kwargs) -> started EmulatedCluster`` (demo hosts by default)."""
    if not sshd_available():
        pytest.skip(SKIP_REASON)
    yield from _started_clusters(tmp_path_factory, EmulatedCluster, "emucluster")


@pytest.fixture
def embedded_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """A factory ``(hosts=None, **kwargs) -> started EmbeddedCluster`` (demo hosts by default):
    the asyncssh-served fleet, which needs no sshd and is never skipped."""
    yield from _started_clusters(tmp_path_factory, EmbeddedCluster, "embedded")
