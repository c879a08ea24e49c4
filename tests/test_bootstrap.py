"""scripts/bootstrap.sh, what `make demo`, `make test` and `.ci/run` run first: silent when all is
there; without a system package and without the right to install it, `make test`'s step stops
with one line naming the packages and `make demo`'s goes on; a Python or pip failure is one line.

Missing packages are made missing in a private mount namespace (``unshare -m``: a file without
execute permission over ``/usr/sbin/sshd``, an empty directory over ``/usr/lib/postgresql``), so
nothing on the machine changes; that needs root, which CI has."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bootstrap.sh"


def _bootstrap(*args: str, hide: tuple[str, ...] = (), cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, **env}
    command = [str(SCRIPT), *args]
    if hide:
        mounts = []
        for path in hide:
            if Path(path).is_dir():
                mounts.append(f"mount -t tmpfs none {path}")
            else:
                mounts.append(f"mount --bind {environment['HIDDEN']} {path}")
        command = ["unshare", "-m", "sh", "-c", " && ".join(mounts) + ' && exec "$0" "$@"', *command]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=environment, timeout=300)


def _installed() -> list[str]:
    missing = [what for what, found in (
        ("sshd", Path("/usr/sbin/sshd").exists()), ("ssh-keygen", shutil.which("ssh-keygen")),
        ("initdb", list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))),
        ("redis-server", shutil.which("redis-server")), ("chromium", Path("/usr/bin/chromium").exists()),
    ) if not found]
    return missing


@pytest.fixture
def hidden_file(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root (a private mount namespace) to make installed packages look missing")
    path = tmp_path / "not-executable"
    path.write_text("#!/bin/false\n")
    path.chmod(0o644)
    return str(path)


def test_with_everything_installed_it_says_nothing():
    missing = _installed()
    if missing:
        pytest.skip(f"not installed here: {', '.join(missing)}")
    for purpose in ("demo", "test"):
        r = _bootstrap("system", purpose, HETERO_GPU_NO_SYSTEM_INSTALL="1")
        assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), purpose


def test_missing_packages_stop_make_test_in_one_line_and_not_make_demo(hidden_file):
    hide = ("/usr/sbin/sshd", "/usr/lib/postgresql")
    r = _bootstrap("system", "test", hide=hide, HIDDEN=hidden_file, HETERO_GPU_NO_SYSTEM_INSTALL="1")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == ("make test needs these system packages (HETERO_GPU_NO_SYSTEM_INSTALL=1, so not installed "
                        "here): openssh-server postgresql -- as root: apt-get install -y openssh-server postgresql\n")
    # the demo goes on: it runs its hosts on the embedded SSH server, and says so itself
    r = _bootstrap("system", "demo", hide=hide, HIDDEN=hidden_file, HETERO_GPU_NO_SYSTEM_INSTALL="1")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_no_python_is_one_line(tmp_path):
    r = _bootstrap("venv", str(tmp_path / "no-python3"), str(tmp_path / "venv"))
    assert r.returncode == 1
    assert r.stderr == f"no {tmp_path / 'no-python3'}: install Python 3.10 or newer (or give PYTHON=/path/to/python3)\n"
    assert not (tmp_path / "venv").exists()


def test_a_failing_pip_install_is_one_line_naming_its_log(tmp_path):
    """A project pip cannot install (here: a pyproject.toml that is not TOML) ends in one line with
    pip's own error and the log file, not in pip's traceback; no stamp is written."""
    (tmp_path / "pyproject.toml").write_text("this is [not toml\n")
    r = _bootstrap("venv", "python3", str(tmp_path / "venv"), cwd=tmp_path)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert lines[0].startswith("installing the package and its test extra into ")
    assert len(lines) == 2 and lines[1].startswith("pip could not install the Python packages (")
    assert lines[1].endswith(f"full log: {tmp_path / 'venv' / 'pip-install.log'}")
    assert "Traceback" not in r.stderr and not (tmp_path / "venv" / ".installed").exists()
