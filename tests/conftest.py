"""Shared test helpers. Fixtures of subsystems live beside them and are imported explicitly.

``ci_skips`` turns a skipped main-path test into a failure under ``CI=true``. The tests listed in
``slow_tests.txt`` (measured: 2.5 s or more, scripts/slow_tests.py) are marked ``slow``, so
``make test-fast`` (``-m "not slow and not serial"``) leaves them out, and every run starts with
the modules of the longest tests."""

from pathlib import Path

import pytest

pytest_plugins = ("ci_skips",)

SLOW_LIST = Path(__file__).resolve().parent / "slow_tests.txt"


def _durations() -> dict[str, float]:
    """Test (without parameters) -> its measured seconds, from ``slow_tests.txt``."""
    out = {}
    for line in SLOW_LIST.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.lstrip().startswith("#"):
            out[parts[1]] = float(parts[0])
    return out


def pytest_collection_modifyitems(config, items):
    durations = _durations()
    weight: dict[str, float] = {}
    for item in items:
        name = item.nodeid.split("[")[0]
        if name in durations:
            item.add_marker(pytest.mark.slow)
            module = name.split("::")[0]
            weight[module] = max(weight.get(module, 0.0), durations[name])
    # The modules of the longest tests first, each kept whole and in its order (a stable sort):
    # two processes (pytest-xdist's worksteal) then end together on short tests, instead of one
    # of them running a long end-to-end test alone at the end while the other waits.
    items.sort(key=lambda item: -weight.get(item.nodeid.split("::")[0], 0.0))
