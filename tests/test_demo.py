"""``make demo-ui`` as a user runs it: on the port asked for (a taken one said in one line), with
the virtualenv not on PATH, and stopped by SIGTERM with nothing left behind (no sshd of the
emulated hosts, no Airflow component, no demo directory). The demo's own run (and its log, kept
in the directory it names) is tested in test_example_dags.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_hetero_gpu.testing import procs, sshd_available

ROOT = Path(__file__).resolve().parents[1]
DAGS = ROOT / "dags"
#: PATH of a shell where the virtualenv is not activated (the case `airflow standalone` failed in)
BARE_PATH = "/usr/local/bin:/usr/bin:/bin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def _demo(tmp_path: Path, *args: str, **kwargs) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(TMPDIR=str(tmp_path), PATH=BARE_PATH, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "airflow_hetero_gpu.demo", "--dags-folder", str(DAGS), *args],
                            env=env, cwd=tmp_path, text=True, **kwargs)


def _left_behind(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("hetero-gpu-demo"))


def test_a_taken_port_is_said_in_one_line_before_anything_starts(tmp_path):
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _demo(tmp_path, "--ui", "--port", str(port), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (out, err)
    assert err == f"demo: port {port} is taken (another program listens on it): choose a free one, e.g. make " \
                  f"demo-ui PORT={port + 1}\n"
    assert "Traceback" not in out + err and _left_behind(tmp_path) == []


@pytest.mark.slow
def test_demo_ui_serves_on_the_chosen_port_and_sigterm_leaves_nothing_behind(tmp_path):
    import httpx

    if not sshd_available():
        pytest.skip("OpenSSH server (sshd) is not installed")
    port = _free_port()
    log = open(tmp_path / "demo-ui.log", "w+")
    proc = _demo(tmp_path, "--ui", "--port", str(port), stdout=log, stderr=subprocess.STDOUT,
                 start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        while True:  # the api-server answers once `airflow standalone` found its components
            assert proc.poll() is None, (tmp_path / "demo-ui.log").read_text()[-5000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "demo-ui.log").read_text()[-5000:]
            time.sleep(1)
        (demo_dir,) = _left_behind(tmp_path)
        home = str(tmp_path / demo_dir / "airflow")
        assert procs.with_env("AIRFLOW_HOME", home), "no Airflow component found"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=180) == 0  # a normal end: `make demo-ui` prints no "Error 143"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()
    text = (tmp_path / "demo-ui.log").read_text()
    assert "FileNotFoundError" not in text, text[-5000:]
    assert "demo-ui stopped (SIGTERM): stopping Airflow and the emulated hosts" in text
    assert f"ledger: sqlite:///{tmp_path / demo_dir / 'ledger.db'} (the tasks' ledger while the demo runs" in text
    assert _left_behind(tmp_path) == [], text[-3000:]
    assert procs.with_env("AIRFLOW_HOME", home) == []  # every Airflow component is gone
    sshds = subprocess.run(["pgrep", "-f", str(tmp_path / demo_dir)], capture_output=True, text=True).stdout
    assert sshds == ""  # and every emulated host's sshd


def test_without_sshd_the_demo_chooses_the_embedded_server_and_says_so(tmp_path, monkeypatch):
    import io

    from airflow_hetero_gpu import demo_setup
    from airflow_hetero_gpu.testing.cluster import EmulatedCluster
    from airflow_hetero_gpu.testing.embedded import EmbeddedCluster

    monkeypatch.setattr(demo_setup, "sshd_available", lambda: False)  # what a machine without OpenSSH answers
    out = io.StringIO()
    assert isinstance(demo_setup.demo_cluster(tmp_path / "a", "auto", out), EmbeddedCluster)
    assert out.getvalue() == ("emulated hosts: the embedded SSH server (asyncssh, one process for all hosts), "
                              "OpenSSH's sshd is not installed here\n")
    with pytest.raises(demo_setup.DemoError, match="--ssh-server sshd: OpenSSH's sshd or ssh-keygen is not installed"):
        demo_setup.demo_cluster(tmp_path / "b", "sshd", out)
    monkeypatch.setattr(demo_setup, "sshd_available", lambda: True)
    assert isinstance(demo_setup.demo_cluster(tmp_path / "c", "auto", io.StringIO()), EmulatedCluster)


@pytest.mark.slow
def test_the_demo_runs_end_to_end_on_the_embedded_ssh_server(tmp_path):
    """What a user without OpenSSH gets: the same run, the hosts served by one asyncssh process."""
    pytest.importorskip("torch", reason="the demo trains with torch (CPU build)")
    proc = _demo(tmp_path, "--ssh-server", "embedded", "--epochs", "2", stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-6000:]
    assert "emulated hosts: the embedded SSH server (asyncssh, one process for all hosts), as asked" in out
    assert "decision: pool 'finetune+llm-pretrain@NVIDIA H200' -> hgx-h200 GPU 0,1,2,3" in out
    assert "] epoch 2 loss " in out and "DAG run finished: success" in out
    (left,) = [p for p in _left_behind(tmp_path) if (tmp_path / p).is_dir()]   # the named directory, its log only
    assert [p.name for p in (tmp_path / left).iterdir()] == ["dag-run.log"]
    assert f"DAG run log: {tmp_path / left / 'dag-run.log'}" in out
