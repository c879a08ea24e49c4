"""The runtime package imports no pytest: every module of ``airflow_hetero_gpu`` (the emulated
cluster in ``testing/`` included, which the demo uses) imports in an interpreter where pytest
cannot be imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CODE = r'''
import importlib, json, pkgutil, sys

class NoPytest:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pytest", "_pytest"):
            raise ImportError(f"pytest is blocked: {name}")
        return None

sys.meta_path.insert(0, NoPytest())
import airflow_hetero_gpu
failed = {}
names = []
for info in pkgutil.walk_packages(airflow_hetero_gpu.__path__, "airflow_hetero_gpu."):
    if info.name.endswith("__main__"):
        continue
    names.append(info.name)
    try:
        importlib.import_module(info.name)
    except Exception as err:
        failed[info.name] = f"{type(err).__name__}: {err}"
print(json.dumps({"names": names, "failed": failed,
                  "pytest": [m for m in sys.modules if m.split(".")[0] in ("pytest", "_pytest")]}))
'''


def test_no_module_of_the_package_imports_pytest():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    found = json.loads(r.stdout.strip().splitlines()[-1])
    assert "airflow_hetero_gpu.testing.cluster" in found["names"]
    assert "airflow_hetero_gpu.testing.postgres" in found["names"]
    assert found["failed"] == {} and found["pytest"] == [], found


def test_the_command_line_builds_its_parser_without_the_heavy_libraries():
    """`hetero-gpu collect` of 1,000 hosts has 10 s: its start-up loads none of what only other
    sub-commands need (numpy alone also starts a BLAS thread per CPU)."""
    code = ("import json, sys\nfrom airflow_hetero_gpu.cli import app\napp.build_parser()\n"
            "print(json.dumps([m for m in ('numpy', 'pandas', 'networkx', 'sqlalchemy', 'airflow') if m in sys.modules]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


def test_a_write_that_runs_an_admission_pass_loads_no_airflow(tmp_path):
    """A process that has not loaded Airflow (the command line's `plan --reserve`, `release`)
    reads the `[hetero_gpu]` settings the pass needs from the environment and airflow.cfg: its
    first pass imports no Airflow (over a second under the ledger's lock, and Airflow's logging
    would write onto the command's output), and still honours the settings."""
    code = ("import json, sys\nfrom airflow_hetero_gpu.ledger import Ledger\n"
            "from airflow_hetero_gpu.core.model import PlanRequest\n"
            f"led = Ledger.from_url('sqlite:///{tmp_path}/l.db')\n"
            "led.enqueue('j1', PlanRequest(1))\n"
            "print(json.dumps([led.preemption is None, 'airflow' in sys.modules]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__HETERO_GPU__PREEMPTION": "off"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[true, false]"


LOCKED = r'''
import json, sys, time
import airflow_hetero_gpu.settings as settings
from airflow_hetero_gpu.core.admission import teams_from_mapping
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.ledger.base import LedgerDatabase
from airflow_hetero_gpu.ledger.inventory import HostRecord
from airflow_hetero_gpu.testing.captures import host_files
from airflow_hetero_gpu.testing.demo import small_hosts

url = sys.argv[1]
if sys.argv[2] == "fill":
    with Ledger.from_url(url) as led:
        led.store_collection([HostRecord(s.name, True, host_files(s)) for s in small_hosts(4, gpus=4)], collector="t")
        led.apply_teams(teams_from_mapping({"teams": {"a": {"quota": {"*": 4}}, "b": {"quota": {"*": 12}}}}, "t"))
        assert led.enqueue("held", PlanRequest(4), lease_seconds=3600, team="a").admitted
        led.take_admission("held")
    sys.exit()
inside, seen = [False], []
read = settings.setting
def setting(name, *a, **k):
    if inside[0]:
        seen.append(("setting", name))
    return read(name, *a, **k)
settings.setting = setting
locked = LedgerDatabase.locked
def watched(self, action):
    cm = locked(self, action)
    class Span:
        def __enter__(s):
            s.before = set(sys.modules); inside[0] = True
            return cm.__enter__()
        def __exit__(s, *exc):
            try:
                return cm.__exit__(*exc)
            finally:
                inside[0] = False
                seen.extend(("import", m) for m in sorted(set(sys.modules) - s.before))
    return Span()
LedgerDatabase.locked = watched
with Ledger.from_url(url) as led:
    waits = not led.enqueue("big", PlanRequest(16), lease_seconds=3600, team="a").admitted
    led.renew_queue_entry("big")
    led.release("held")
    led.leave_queue("big")
print(json.dumps({"waited": waits, "seen": seen}))
'''


def test_a_fresh_processs_writes_read_no_setting_and_import_nothing_under_the_ledger_lock(tmp_path):
    """A fresh process's writes (an enqueue that waits, a renewal, a release whose pass runs with
    teams and preemption on, leaving the queue) read the settings the pass needs and import what
    it needs before they take the ledger's lock: every other writer waits on it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__HETERO_GPU__PREEMPTION": "on"}
    url = f"sqlite:///{tmp_path}/l.db"
    for step in ("fill", "watch"):
        r = subprocess.run([sys.executable, "-c", LOCKED, url, step], capture_output=True, text=True, env=env,
                           timeout=300, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["waited"] is True
    assert got["seen"] == []
