"""PostgreSQL fixtures of the test suite, on :class:`airflow_hetero_gpu.testing.postgres.PostgresServer`.

Import them explicitly into a test module::

    from postgres_fixtures import postgres_url  # noqa: F401

``postgres_url`` gives each test its own fresh database on one server shared by the whole test
session (stopped when the session ends); ``ledger_db_url`` is parametrized over SQLite and
PostgreSQL so one test runs against both. Without PostgreSQL binaries the PostgreSQL cases are
skipped with a reason saying so (a failure under ``CI=true``, see ``ci_skips.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from airflow_hetero_gpu.testing.postgres import PostgresServer, PostgresUnavailable

_SESSION_SERVER: dict[int, PostgresServer] = {}


def _session_server(config: pytest.Config) -> PostgresServer:
    """The test session's server, started on first use and stopped when the session ends."""
    key = id(config)
    if key not in _SESSION_SERVER:
        try:
            server = PostgresServer().start()
        except PostgresUnavailable as err:
            pytest.skip(str(err))
        _SESSION_SERVER[key] = server

        def _stop() -> None:
            _SESSION_SERVER.pop(key, None)
            server.stop()

        config.add_cleanup(_stop)
    return _SESSION_SERVER[key]


@pytest.fixture
def postgres_server(request: pytest.FixtureRequest) -> PostgresServer:
    """The session's private PostgreSQL server (started on first use)."""
    return _session_server(request.config)


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a fresh, empty database on the session's private PostgreSQL server."""
    server = _session_server(request.config)
    url = server.create_database()
    yield url
    server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh ledger database URL: a SQLite file, then a PostgreSQL database (same test, twice)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    server = _session_server(request.config)
    url = server.create_database()
    yield url
    server.drop_database(url.rsplit("/", 1)[1])
