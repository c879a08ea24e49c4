"""Airflow around the emulated cluster: ssh connections, an AIRFLOW_HOME, ``airflow dags test``.

Used by the tests and the demo. Connections are given as ``AIRFLOW_CONN_<ID>`` environment
variables in JSON (host key pinned through the ``host_key`` extra, so host keys are verified);
Airflow runs on an embedded SQLite metadata database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    for line in proc.stdout:
        lines.append(line)
        stream(line)
    proc.wait(timeout=timeout)
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(lines), "")
