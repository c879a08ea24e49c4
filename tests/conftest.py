"""Shared test helpers. Fixtures of subsystems live beside them and are imported explicitly.

``ci_skips`` turns a skipped main-path test into a failure under ``CI=true``. The tests listed in
``slow_tests.txt`` (measured: 2.5 s or more, scripts/slow_tests.py) are marked ``slow``, so
``make test-fast`` (``-m "not slow and not serial"``) leaves them out."""

from pathlib import Path

import pytest

pytest_plugins = ("ci_skips",)

SLOW_LIST = Path(__file__).resolve().parent / "slow_tests.txt"


def _slow_tests() -> set[str]:
    names = set()
    for line in SLOW_LIST.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.lstrip().startswith("#"):
            names.add(parts[1])
    return names


def pytest_collection_modifyitems(config, items):
    slow = _slow_tests()
    for item in items:
        if item.nodeid.split("[")[0] in slow:
            item.add_marker(pytest.mark.slow)
