"""Under ``CI=true`` a test of the main path may not skip: such a skip fails the run, with its reason.

The main path is what the provider does for a user: OpenSSH's ``sshd`` behind every emulated
host, torch for the real torchrun training, PostgreSQL for the shared ledger, the collection of
real ``nvidia-smi`` outputs (``tests/data/real``), the browser (Chromium driven by Playwright),
Redis for the Celery deployment, the ``airflow`` command, and every Python package a test
imports (all of them are declared in the package's ``test`` extra). A skip whose reason names one
of them is turned into a failure (``MAIN_PATH``), unless the reason is on the short allow-list
of skips that are legitimate in CI (``ALLOWED``, each with why). Skips for other reasons stay
skips.

Outside CI nothing changes: a missing component skips its tests with the reason, and ``-ra``
lists them at the end of the run.

Loaded by ``tests/conftest.py`` (``pytest_plugins``); ``tests/test_ci_skips.py`` runs it on tiny
test files with and without ``CI=true``.
"""

from __future__ import annotations

import os
import re

import pytest

#: (component, pattern over the skip reason): a skip naming one of them fails under CI=true.
MAIN_PATH: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("OpenSSH (sshd, ssh-keygen)", re.compile(r"\bsshd\b|openssh|ssh-keygen", re.I)),
    ("torch", re.compile(r"\btorch(run)?\b", re.I)),
    ("PostgreSQL", re.compile(r"postgres|\binitdb\b|\bpg_ctl\b", re.I)),
    ("the real-output collection (tests/data/real)",
     re.compile(r"real (nvidia-smi )?samples?\b|real-output collection|shared[/_ ]data", re.I)),
    ("the browser (Chromium, Playwright)", re.compile(r"chromium|playwright", re.I)),
    ("Redis", re.compile(r"\bredis", re.I)),
    ("the airflow command", re.compile(r"airflow command", re.I)),
    ("a Python package of the test extra", re.compile(r"could not import", re.I)),
)

#: (pattern over the skip reason, why that skip is legitimate in CI). Keep it short.
ALLOWED: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"needs a real NVIDIA GPU", re.I),
     "CI machines have no GPU; the real-driver paths are checked on a GPU machine "
     "(scripts/device_check_nvml.sh), and every other test emulates the GPU"),
)

CI_VALUES = ("1", "true", "yes", "on")


def in_ci() -> bool:
    """True when the environment says this is a CI run (``CI=true``, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in CI_VALUES


def skip_reason(longrepr: object) -> str:
    """The reason of a skip report (``(path, line, "Skipped: reason")`` or a plain string)."""
    # a tuple, or a list once a pytest-xdist worker has sent the report to the controller
    text = longrepr[2] if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3 else str(longrepr)
    return str(text).removeprefix("Skipped: ")


def main_path_component(reason: str) -> str | None:
    """The main-path component a skip reason names, or None (also None when allow-listed)."""
    if any(pattern.search(reason) for pattern, _why in ALLOWED):
        return None
    return next((component for component, pattern in MAIN_PATH if pattern.search(reason)), None)


def failure_text(component: str, reason: str) -> str:
    return (f"CI=true: a main-path test skipped because {component} is missing: {reason} -- install it "
            "(.ci/run and `make test` do as root), or, if this skip is legitimate in CI, add its reason "
            "to ALLOWED in tests/ci_skips.py with why")


def _main_path_skip(report) -> str | None:
    """The failure text for a skip report of a main-path test under CI, else None."""
    if not in_ci() or report.outcome != "skipped" or hasattr(report, "wasxfail"):
        return None
    reason = skip_reason(report.longrepr)
    component = main_path_component(reason)
    return None if component is None else failure_text(component, reason)


_COLLECTION_SKIPS = pytest.StashKey[list]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    text = _main_path_skip(report)
    if text is not None:
        report.outcome = "failed"
        report.longrepr = text
    return report


def pytest_collectreport(report):
    """A module-level skip (``pytest.importorskip`` at import) skips a whole module while it is
    collected. Failing the collection would stop the whole run, so the module stays skipped, is
    listed at the end, and the run's exit status is set to "tests failed". (With pytest-xdist the
    workers send their skipped collection reports to the controller, which calls this hook too.)"""
    text = _main_path_skip(report)
    if text is not None:
        _CONFIG[0].stash.setdefault(_COLLECTION_SKIPS, []).append((report.nodeid, text))


_CONFIG: list = []


def pytest_configure(config):
    _CONFIG[:] = [config]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = config.stash.get(_COLLECTION_SKIPS, [])
    if skipped:
        terminalreporter.write_sep("=", "main-path modules skipped under CI=true (the run fails)", red=True)
        for nodeid, text in skipped:
            terminalreporter.write_line(f"FAILED {nodeid} - {text}")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if session.config.stash.get(_COLLECTION_SKIPS, []) and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
