"""The package registers itself as an Airflow provider and installs the hetero-gpu command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from airflow_hetero_gpu import __version__, get_provider_info


def test_entry_point_resolves_to_provider_info():
    eps = [ep for ep in entry_points(group="apache_airflow_provider") if ep.value.startswith("airflow_hetero_gpu")]
    assert len(eps) == 1 and eps[0].name == "provider_info"
    info = eps[0].load()()
    assert info == get_provider_info()
    assert info["package-name"] == "airflow-hetero-gpu"
    assert info["versions"] == [__version__]


def test_airflow_providers_list_shows_it(tmp_path):
    airflow = Path(sys.executable).with_name("airflow")
    if not airflow.exists():
        pytest.skip(f"the airflow command is not installed beside {sys.executable}")
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    r = subprocess.run([str(airflow), "providers", "list"], capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("airflow-hetero-gpu")), None)
    assert line is not None, r.stdout[-2000:]
    assert __version__ in line


def test_console_script_is_installed():
    exe = Path(sys.executable).with_name("hetero-gpu")
    if not exe.exists():
        exe = shutil.which("hetero-gpu")
    if exe is None:
        pytest.skip("hetero-gpu is not installed (the package is used from a source tree)")
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "plan" in r.stdout
