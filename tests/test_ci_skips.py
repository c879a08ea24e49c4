"""tests/ci_skips.py: under CI=true a main-path skip fails the run, with its reason; outside CI
it stays a skip. Each case runs pytest in a subprocess on a tiny test folder using the plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import ci_skips

HERE = Path(__file__).resolve().parent

TESTS = '''
import pytest

def test_passes():
    assert True

def test_needs_sshd():
    pytest.skip("OpenSSH server (sshd) not installed")

@pytest.mark.skipif(True, reason="PostgreSQL server binaries (initdb, pg_ctl) not found")
def test_needs_postgres():
    pass

def test_needs_chromium():
    pytest.skip("no Chromium at /usr/bin/chromium")

def test_allowed_in_ci():
    pytest.skip("needs a real NVIDIA GPU (NVML reports no device)")

def test_other_reason():
    pytest.skip("only meaningful on Windows")

@pytest.mark.xfail(reason="torch is flaky here", strict=False)
def test_xfail_is_not_a_skip():
    assert False
'''

MODULE_SKIP = '''
import pytest
pytest.importorskip("no_such_module_for_the_ci_skip_test")

def test_never_collected():
    pass
'''


def _run(tmp_path: Path, files: dict[str, str], ci: str | None,
         workers: int = 0) -> tuple[int, str, dict[str, str]]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "conftest.py").write_text('pytest_plugins = ("ci_skips",)\n')
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    junit = tmp_path / "junit.xml"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
         *(["-n", str(workers)] if workers else []), "--junitxml", str(junit), str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=180)
    outcomes: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[case.get("name")] = kinds[0] if kinds else "passed"
    return r.returncode, r.stdout + r.stderr, outcomes


def test_outside_ci_every_skip_stays_a_skip(tmp_path):
    code, out, outcomes = _run(tmp_path, {"test_cases.py": TESTS, "test_module_skip.py": MODULE_SKIP}, ci=None)
    assert code == 0, out
    assert outcomes["test_needs_sshd"] == outcomes["test_needs_postgres"] == "skipped"
    assert outcomes["test_needs_chromium"] == outcomes["test_other_reason"] == "skipped"
    assert "main-path" not in out


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "xdist-2"])  # make test runs with -n 2
def test_under_ci_a_main_path_skip_fails_with_its_reason(tmp_path, workers):
    code, out, outcomes = _run(tmp_path, {"test_cases.py": TESTS}, ci="true", workers=workers)
    assert code == 1, out
    assert outcomes["test_passes"] == "passed"
    # skip() in the test body and a skipif mark (setup) both become failures
    assert outcomes["test_needs_sshd"] == "failure"
    assert outcomes["test_needs_postgres"] in ("failure", "error")
    assert outcomes["test_needs_chromium"] == "failure"
    # the allow-list, a reason naming no component, and an xfail are left alone
    assert outcomes["test_allowed_in_ci"] == outcomes["test_other_reason"] == "skipped"
    assert outcomes["test_xfail_is_not_a_skip"] == "skipped"
    assert "because OpenSSH (sshd, ssh-keygen) is missing: OpenSSH server (sshd) not installed" in out
    assert "because PostgreSQL is missing" in out
    assert "because the browser (Chromium, Playwright) is missing: no Chromium at /usr/bin/chromium" in out


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "xdist-2"])
@pytest.mark.parametrize("ci, expected_code", [(None, 0), ("false", 0), ("true", 1), ("1", 1)])
def test_a_module_level_skip_fails_the_run_under_ci_only(tmp_path, ci, expected_code, workers):
    code, out, _ = _run(tmp_path, {"test_module_skip.py": MODULE_SKIP, "test_ok.py": "def test_ok():\n    pass\n"},
                        ci=ci, workers=workers)
    assert code == expected_code, out
    named = "test_module_skip.py - CI=true: a main-path test skipped because a Python package" in out
    assert named == (expected_code == 1), out
    assert "1 passed" in out  # the rest of the run went on


@pytest.mark.parametrize("reason, component", [
    ("OpenSSH server (sshd) is not installed", "OpenSSH (sshd, ssh-keygen)"),
    ("ssh-keygen not found (install openssh-client)", "OpenSSH (sshd, ssh-keygen)"),
    ("torch (CPU build) is needed to train the example model", "torch"),
    ("could not import 'torch': No module named 'torch'", "torch"),
    ("PostgreSQL server binaries (initdb, pg_ctl) not found on PATH", "PostgreSQL"),
    ("real nvidia-smi samples not present at /x", "the real-output collection (tests/data/real)"),
    ("real sample query-gpu-allfields-h100.csv not present", "the real-output collection (tests/data/real)"),
    ("shared real-output collection not found at /x", "the real-output collection (tests/data/real)"),
    ("could not import 'playwright.sync_api': No module named 'playwright'", "the browser (Chromium, Playwright)"),
    ("redis-server not installed", "Redis"),
    ("the airflow command is not installed beside /v/bin/python", "the airflow command"),
    ("could not import 'httpx': No module named 'httpx'", "a Python package of the test extra"),
    ("needs a real NVIDIA GPU (no device)", None),
    ("the shipped sample capture directory is absent", None),
])
def test_reasons_are_classified(reason, component):
    assert ci_skips.main_path_component(reason) == component
