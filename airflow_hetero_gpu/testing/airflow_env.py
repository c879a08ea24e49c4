"""Airflow around the emulated cluster: ssh connections, an AIRFLOW_HOME, ``airflow dags test``.

Used by the tests and the demo. Connections are given as ``AIRFLOW_CONN_<ID>`` environment
variables in JSON (host key pinned through the ``host_key`` extra, so host keys are verified);
Airflow runs on an embedded SQLite metadata database.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterable, Mapping


def host_public_key(cluster, name: str) -> str:
    """``ssh-ed25519 AAAA...``: the emulated host's key as listed in the cluster's known_hosts."""
    host = cluster.host(name)
    for line in cluster.known_hosts_path.read_text().splitlines():
        endpoint, key_type, key = line.split()[:3]
        if endpoint == f"[{host.address}]:{host.port}":
            return f"{key_type} {key}"
    raise KeyError(name)


def airflow_connection(cluster, name: str) -> str:
    """The JSON of an Airflow ``ssh`` connection to an emulated host (key file + pinned host key)."""
    host = cluster.host(name)
    return json.dumps({
        "conn_type": "ssh", "host": host.address, "port": host.port, "login": cluster.user,
        "extra": {"key_file": str(cluster.identity_file), "host_key": host_public_key(cluster, name),
                  "look_for_keys": "false"},
    })


def conn_id_of(name: str) -> str:
    return "gpu_" + name.replace("-", "_").replace(".", "_")


def connection_env(cluster, names: Iterable[str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """(``AIRFLOW_CONN_*`` variables, ``{host name: conn id}``) for the cluster's hosts."""
    env, ids = {}, {}
    for host in cluster.hosts if names is None else [cluster.host(n) for n in names]:
        conn_id = conn_id_of(host.name)
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = airflow_connection(cluster, host.name)
        ids[host.name] = conn_id
    return env, ids


def airflow_command() -> list[str]:
    """The ``airflow`` command of the running interpreter's environment."""
    exe = Path(sys.executable).with_name("airflow")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "airflow"]


def airflow_env(home: Path, dags_folder: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for an embedded Airflow: its own home, SQLite, no examples, the given DAGs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "OMP_NUM_THREADS": "1",
    })
    env.update(extra or {})
    return env


def migrate(env: Mapping[str, str], timeout: float = 300) -> None:
    """``airflow db migrate`` on the environment's SQLite database (a few seconds)."""
    r = subprocess.run([*airflow_command(), "db", "migrate"], env=dict(env), capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed ({r.returncode}): {r.stderr[-2000:]}")


def dags_test(dag_id: str, env: Mapping[str, str], *, conf: Mapping | None = None, timeout: float = 600,
              stream=None) -> subprocess.CompletedProcess:
    """Run ``airflow dags test DAG_ID`` (every task in this process, triggers inline)."""
    cmd = [*airflow_command(), "dags", "test", dag_id]
    if conf:
        cmd += ["--conf", json.dumps(dict(conf))]
    if stream is None:
        return subprocess.run(cmd, env=dict(env), capture_output=True, text=True, timeout=timeout)
    proc = subprocess.Popen(cmd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line)
            stream(line)
        proc.wait(timeout=timeout)
    except BaseException:  # interrupted (a signal, Ctrl-C, a timeout): the run goes with us
        _stop(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(lines), "")


def _stop(proc: subprocess.Popen, grace: float = 10) -> None:
    """SIGTERM (the task's on_kill stops its job), then SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class AirflowDeployment:
    """Airflow's components as separate processes, as a real deployment runs them: api-server
    (with the task execution API), scheduler (LocalExecutor: each task in a supervised child
    process that writes the task log file), dag-processor and triggerer, on one SQLite metadata
    database. Any component can be killed and started again (:meth:`restart`)::

        with AirflowDeployment(home, dags, env) as airflow:
            run_id = airflow.trigger("my_dag")
            airflow.wait_for_state("my_dag", run_id, "train", {"deferred"})
            airflow.restart("triggerer")
    """

    COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")

    def __init__(self, home: Path, dags_folder: Path, extra: Mapping[str, str] | None = None):
        self.home = Path(home)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.env = airflow_env(self.home, dags_folder, {
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.port}/execution/",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            # a task's calls to the api-server: on a loaded machine one can take longer than the
            # default 5 s, and a try that gives up fails for no reason of its own
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
            "AIRFLOW__API_AUTH__JWT_SECRET": os.urandom(16).hex(),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
            "AIRFLOW__SCHEDULER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
            **(extra or {}),
        })
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: dict[str, object] = {}

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> "AirflowDeployment":
        migrate(self.env)
        for name in self.COMPONENTS:
            self.start_component(name)
        return self

    def start_component(self, name: str) -> None:
        log_dir = self.home / "components"
        log_dir.mkdir(parents=True, exist_ok=True)
        handle = open(log_dir / f"{name}.log", "ab")
        self._logs[name] = handle
        self.procs[name] = subprocess.Popen([*airflow_command(), name], env=self.env, stdout=handle,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def stop_component(self, name: str, sig: int | None = None, timeout: float = 30) -> None:
        """Stop one component and every process it started (SIGTERM, or ``sig``)."""
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        try:
            os.killpg(proc.pid, sig if sig is not None else signal.SIGTERM)
            proc.wait(timeout=timeout)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        handle = self._logs.pop(name, None)
        if handle is not None:
            handle.close()

    def restart(self, name: str, sig: int | None = None) -> None:
        self.stop_component(name, sig)
        self.start_component(name)

    def stop(self) -> None:
        for name in list(self.procs):
            self.stop_component(name)

    def __enter__(self) -> "AirflowDeployment":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def component_log(self, name: str) -> str:
        path = self.home / "components" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- the metadata database ----------------------------------------------------------------
    def query(self, sql: str, *params: object) -> list[tuple]:
        with sqlite3.connect(self.home / "airflow.db", timeout=30) as db:
            return db.execute(sql, params).fetchall()

    def wait_for(self, predicate, timeout: float, what: str, poll: float = 1.0):
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:g} s")
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"airflow {name} exited ({proc.returncode}): "
                                       f"{self.component_log(name)[-3000:]}")
            time.sleep(poll)

    def trigger(self, dag_id: str, run_id: str | None = None, timeout: float = 240) -> str:
        """Trigger a DAG run once the dag-processor has parsed the DAG; returns its run id."""
        self.wait_for(lambda: self.query("select 1 from dag where dag_id = ?", dag_id), timeout,
                      f"DAG {dag_id} parsed")
        run_id = run_id or f"manual__{uuid.uuid4().hex[:12]}"
        r = subprocess.run([*airflow_command(), "dags", "trigger", dag_id, "--run-id", run_id],
                           env=self.env, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"airflow dags trigger failed ({r.returncode}): {r.stderr[-2000:]}")
        return run_id

    def task_state(self, dag_id: str, run_id: str, task_id: str) -> str | None:
        rows = self.query("select state from task_instance where dag_id = ? and run_id = ? and task_id = ?",
                          dag_id, run_id, task_id)
        return rows[0][0] if rows else None

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        rows = self.query("select state from dag_run where dag_id = ? and run_id = ?", dag_id, run_id)
        return rows[0][0] if rows else None

    def wait_for_state(self, dag_id: str, run_id: str, task_id: str | None, states: set[str],
                       timeout: float) -> str:
        """Wait until the task (or, with ``task_id=None``, the run) is in one of ``states``."""
        def check():
            state = (self.run_state(dag_id, run_id) if task_id is None
                     else self.task_state(dag_id, run_id, task_id))
            return state if state in states else None

        return self.wait_for(check, timeout, f"{dag_id}/{run_id}/{task_id or 'run'} in {sorted(states)}")

    def task_log(self, dag_id: str, run_id: str, task_id: str) -> str:
        """Every attempt's task log file of the task, as the task supervisor wrote them."""
        root = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        return "".join(p.read_text(errors="replace") for p in sorted(root.rglob("*.log")))
