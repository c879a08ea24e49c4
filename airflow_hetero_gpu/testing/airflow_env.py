"""Airflow around the emulated cluster: ssh connections, an AIRFLOW_HOME, ``airflow dags test``.

Used by the tests and the demo. Connections are given as ``AIRFLOW_CONN_<ID>`` environment
variables in JSON (host key pinned through the ``host_key`` extra, so host keys are verified);
Airflow runs on an embedded SQLite metadata database, or (:class:`AirflowDeployment`) on any
metadata database with its components as separate processes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
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


def airflow_connection(cluster, name: str, *, inline_key: bool = False) -> str:
    """The JSON of an Airflow ``ssh`` connection to an emulated host: the client key (its file,
    or with ``inline_key`` its text in the ``private_key`` extra, so no file has to exist where
    the connection is used) and the pinned host key."""
    host = cluster.host(name)
    key = ({"private_key": cluster.identity_file.read_text()} if inline_key
           else {"key_file": str(cluster.identity_file)})
    return json.dumps({
        "conn_type": "ssh", "host": host.address, "port": host.port, "login": cluster.user,
        "extra": {**key, "host_key": host_public_key(cluster, name), "look_for_keys": "false"},
    })


def fleet_connection(cluster) -> str:
    """The JSON of the one Airflow ``ssh`` connection that reaches every emulated host listed in
    a hosts file (``GpuHealthSensor(hosts_file=..., ssh_conn_id=...)``): the login, the client
    key, and the cluster's known_hosts file, against which every host key is verified."""
    return json.dumps({
        "conn_type": "ssh", "login": cluster.user,
        "extra": {"key_file": str(cluster.identity_file), "known_hosts": str(cluster.known_hosts_path)},
    })


def conn_id_of(name: str) -> str:
    return "gpu_" + name.replace("-", "_").replace(".", "_")


def connection_env(cluster, names: Iterable[str] | None = None, *,
                   inline_key: bool = False) -> tuple[dict[str, str], dict[str, str]]:
    """(``AIRFLOW_CONN_*`` variables, ``{host name: conn id}``) for the cluster's hosts."""
    env, ids = {}, {}
    for host in cluster.hosts if names is None else [cluster.host(n) for n in names]:
        conn_id = conn_id_of(host.name)
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = airflow_connection(cluster, host.name, inline_key=inline_key)
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
    """``airflow db migrate`` on the environment's metadata database.

    An SQLite database in AIRFLOW_HOME (no ``SQL_ALCHEMY_CONN`` given) is a copy of one this
    installation of Airflow migrated once (:func:`migrated_sqlite_template`): the same schema
    and rows (it holds no path of its home), without the 4 s of CPU a migration costs each home."""
    if "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" in env or not env.get("AIRFLOW_HOME"):
        _run_migrate(env, timeout)
        return
    target = Path(env["AIRFLOW_HOME"]) / "airflow.db"
    if target.exists():  # a home migrated before: migrate it (nothing to do, or an upgrade)
        _run_migrate(env, timeout)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated_sqlite_template(env, timeout), target)


def _run_migrate(env: Mapping[str, str], timeout: float) -> None:
    r = subprocess.run([*airflow_command(), "db", "migrate"], env=dict(env), capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed ({r.returncode}): {r.stderr[-2000:]}")


def migrated_sqlite_template(env: Mapping[str, str], timeout: float = 300) -> Path:
    """An SQLite metadata database freshly migrated by this installation's Airflow, made once per
    Airflow version and interpreter (under the temporary directory, ``airflow-hetero-gpu-*``),
    the first caller making it while the others wait on a file lock."""
    import fcntl
    import hashlib
    import tempfile
    from importlib.metadata import version

    key = hashlib.sha256(f"{sys.executable}\0{version('apache-airflow')}".encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"airflow-hetero-gpu-metadata-{key}"
    folder.mkdir(exist_ok=True)
    template = folder / "airflow.db"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template.exists():
            home = Path(tempfile.mkdtemp(prefix="home-", dir=folder))
            try:
                _run_migrate({**env, "AIRFLOW_HOME": str(home)}, timeout)
                os.replace(home / "airflow.db", template)
            finally:
                shutil.rmtree(home, ignore_errors=True)
    return template


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


@dataclass
class Component:
    """One Airflow process of a deployment: ``airflow ARGS...``, with its own environment
    additions and, when ``home`` is given, its own AIRFLOW_HOME, working directory and TMPDIR
    (as if it ran on a machine of its own)."""

    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    home: Path | None = None


def metadata_env(url: str | None) -> dict[str, str]:
    """``[database]`` settings for a metadata database URL (none: SQLite in AIRFLOW_HOME).

    psycopg 3 (``postgresql+psycopg://``) serves Airflow's async engine as well, so the async
    URL is the same one (Airflow would otherwise derive ``postgresql+asyncpg://``)."""
    if not url:
        return {}
    env = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url}
    if url.startswith("postgresql+psycopg://"):
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"] = url
    return env


def _stop(proc: subprocess.Popen, grace: float = 10) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds. (The task's on_kill stops a job that is not
    durable; a durable one runs on, as nobody stopped its task, until the emulated hosts stop.)"""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


#: words of a component's log line worth a failing test's message
_WORTH_READING = ("[error", "[warning", "exception", "traceback", "exited", "signal")


class AirflowDeployment:
    """Airflow's components as separate processes, as a real deployment runs them: api-server
    (with the task execution API), scheduler (LocalExecutor by default: each task in a
    supervised child process that writes the task log file), dag-processor and triggerer, on a
    SQLite metadata database in ``home`` unless ``metadata_url`` names another one. Any
    component can be killed and started again (:meth:`restart`); :meth:`add_component` adds
    more (Celery workers, see :mod:`airflow_hetero_gpu.testing.celery_deployment`)::

        with AirflowDeployment(home, dags, env) as airflow:
            run_id = airflow.trigger("my_dag")
            airflow.wait_for_state("my_dag", run_id, "train", {"deferred"})
            airflow.restart("triggerer")

    The api-server's simple auth manager knows one user, ``admin`` (an Admin) with the password
    :attr:`password`; :meth:`token` logs in the way a REST client does.
    """

    COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
    USER = "admin"

    def __init__(self, home: Path, dags_folder: Path, extra: Mapping[str, str] | None = None, *,
                 executor: str = "LocalExecutor", metadata_url: str | None = None):
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.dags_folder = Path(dags_folder)
        self.metadata_url = metadata_url
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.password = os.urandom(12).hex()
        (self.home / "passwords.json").write_text(json.dumps({self.USER: self.password}))
        self.env = airflow_env(self.home, dags_folder, {
            "AIRFLOW__CORE__EXECUTOR": executor,
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{self.USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": os.urandom(32).hex(),
            # a loaded machine can take tens of seconds to answer a task's first call; a retry of
            # a call that did go through is refused ("already running"), failing the task
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "300",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
            "AIRFLOW__SCHEDULER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
            **metadata_env(metadata_url),
            **(extra or {}),
        })
        self.components: dict[str, Component] = {name: Component((name,)) for name in self.COMPONENTS}
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: dict[str, object] = {}
        #: components told to exit by themselves (wait_for does not count their exit as a failure)
        self.expected_exits: set[str] = set()
        #: components started again when they exit, as a service manager (systemd's
        #: ``Restart=always``, a Kubernetes Deployment) does; ``restarted`` counts them
        self.keep_running: set[str] = set()
        self.restarted: dict[str, int] = {}
        self._engine = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add_component(self, name: str, args: Iterable[str], env: Mapping[str, str] | None = None,
                      home: Path | None = None) -> Component:
        """Declare one more process (started by :meth:`start`, or :meth:`start_component`).

        With ``home`` it gets that directory as AIRFLOW_HOME, working directory and (under
        ``tmp/``) TMPDIR, and a copy of the DAGs folder of its own (``dags/``), as a machine of
        its own has: it shares no directory with the others."""
        if home is not None:
            home = Path(home)
            (home / "tmp").mkdir(parents=True, exist_ok=True)
            if not (home / "dags").exists():
                shutil.copytree(self.dags_folder, home / "dags", ignore=shutil.ignore_patterns("__pycache__"))
            env = {"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
                   "TMPDIR": str(home / "tmp"), **(env or {})}
        component = self.components[name] = Component(tuple(args), dict(env or {}), home)
        return component

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> "AirflowDeployment":
        migrate(self.env)
        for name in self.components:
            self.start_component(name)
        return self

    def start_component(self, name: str) -> None:
        component = self.components[name]
        log_dir = self.home / "components"
        log_dir.mkdir(parents=True, exist_ok=True)
        handle = open(log_dir / f"{name}.log", "ab")
        self._logs[name] = handle
        self.procs[name] = subprocess.Popen([*airflow_command(), *component.args], env={**self.env, **component.env},
                                            cwd=component.home, stdout=handle, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def stop_component(self, name: str, sig: int | None = None, timeout: float = 30) -> None:
        """Stop one component and every process it started (SIGTERM, or ``sig``)."""
        if name in self.procs:
            self._signal(name, sig if sig is not None else signal.SIGTERM)
            self._reap(name, timeout)

    def _signal(self, name: str, sig: int) -> None:
        try:
            os.killpg(self.procs[name].pid, sig)
        except ProcessLookupError:
            pass

    def _reap(self, name: str, timeout: float) -> None:
        proc = self.procs.pop(name)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        self._close_log(name)

    def _close_log(self, name: str) -> None:
        handle = self._logs.pop(name, None)
        if handle is not None:
            handle.close()

    def restart(self, name: str, sig: int | None = None) -> None:
        self.stop_component(name, sig)
        self.start_component(name)

    def stop(self) -> None:
        """Stop every component: all are signalled at once, then each is waited for."""
        names = list(self.procs)
        for name in names:
            self._signal(name, signal.SIGTERM)
        for name in names:
            self._reap(name, 30)
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

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

    def failure_context(self, dag_id: str, run_id: str, task_id: str, *components: str) -> str:
        """For a test's failure message: the task's log tail, then each component's lines (the
        scheduler's by default, whose executor's task supervisors log there what never reaches
        the task log: a task process that died at its start) that name the run or are warnings
        or errors."""
        parts = [self.task_log(dag_id, run_id, task_id)[-4000:]]
        for name in components or ("scheduler",):
            lines = [line for line in self.component_log(name).splitlines()
                     if run_id in line or any(w in line.lower() for w in _WORTH_READING)]
            parts.append(f"--- {name}: lines naming {run_id}, warnings, errors ---\n" + "\n".join(lines[-40:])[-4000:])
        return "\n".join(parts)

    # -- the metadata database (read-only) ----------------------------------------------------
    def query(self, sql: str, *params: object) -> list[tuple]:
        """Rows of a read-only query (``?`` placeholders) on the metadata database."""
        if not self.metadata_url:
            with sqlite3.connect(self.home / "airflow.db", timeout=30) as db:
                return db.execute(sql, params).fetchall()
        if self._engine is None:
            from sqlalchemy import create_engine

            # every transaction of this engine is read-only: the test only looks
            # (pre-ping: a test may restart the database under it)
            self._engine = create_engine(self.metadata_url, pool_size=1, max_overflow=0, pool_pre_ping=True,
                                         connect_args={"options": "-c default_transaction_read_only=on"})
        if self._engine.dialect.paramstyle in ("format", "pyformat"):
            sql = sql.replace("%", "%%").replace("?", "%s")
        with self._engine.connect() as conn:
            return [tuple(row) for row in conn.exec_driver_sql(sql, tuple(params))]

    def wait_for(self, predicate, timeout: float, what: str, poll: float = 1.0):
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:g} s")
            for name, proc in list(self.procs.items()):
                if proc.poll() is None or name in self.expected_exits:
                    continue
                if name in self.keep_running:
                    self._reap(name, 10)
                    self.start_component(name)
                    self.restarted[name] = self.restarted.get(name, 0) + 1
                    continue
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

    # -- task logs ------------------------------------------------------------------------------
    def log_homes(self) -> dict[str, Path]:
        """Where task log files are written: the deployment's home, and every component's own."""
        homes = {"": self.home}
        homes.update({name: c.home for name, c in self.components.items() if c.home is not None})
        return homes

    def task_logs(self, dag_id: str, run_id: str, task_id: str) -> dict[str, str]:
        """The task's log text per home that holds any (``""``: the deployment's own home)."""
        out = {}
        for name, home in self.log_homes().items():
            root = home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
            text = "".join(p.read_text(errors="replace") for p in sorted(root.rglob("*.log")))
            if text:
                out[name] = text
        return out

    def task_log(self, dag_id: str, run_id: str, task_id: str) -> str:
        """Every attempt's task log file of the task, as the task supervisors wrote them."""
        return "".join(self.task_logs(dag_id, run_id, task_id).values())

    # -- the REST API -----------------------------------------------------------------------
    def api_ready(self) -> bool:
        """Whether the api-server answers its health endpoint."""
        import httpx

        try:
            return httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def token(self) -> str:
        """A bearer token of the api-server for :attr:`USER` (``POST /auth/token``)."""
        import httpx

        r = httpx.post(f"{self.base_url}/auth/token", json={"username": self.USER, "password": self.password},
                       timeout=60)
        if r.status_code != 201:
            raise RuntimeError(f"api-server login failed ({r.status_code}): {r.text[:500]}")
        return r.json()["access_token"]

    def client(self):
        """An ``httpx.Client`` on the api-server, logged in as :attr:`USER`."""
        import httpx

        return httpx.Client(base_url=self.base_url, timeout=60, headers={"Authorization": f"Bearer {self.token()}"})
