"""Pointing an Airflow at a running emulated cluster: ready-to-source ``export`` lines.

``python -m airflow_hetero_gpu.testing start --root DIR`` writes ``DIR/airflow.env`` (and
prints it) once every host answers: one ``AIRFLOW_CONN_*`` ``ssh`` connection per host (client
key file, host key pinned), and the ``[hetero_gpu]`` settings that make them the deployment's
fleet (``ssh_conn_ids``; the demo fleet's ``cluster.yaml`` and ``topology.conf``, written into
DIR; a capture directory and a SQLite ledger under DIR, the ledger created on first use as the
deployment's own). ``. DIR/airflow.env`` in a shell, then any ``airflow`` command there (``dags
test``, ``standalone``) runs tasks against the emulated hosts (docs/quickstart.md).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from airflow_hetero_gpu.testing.airflow_env import connection_env
from airflow_hetero_gpu.testing.demo import CLUSTER_YAML, TOPOLOGY_CONF

ENV_FILE = "airflow.env"


def write_fleet_files(root: Path, demo: bool) -> dict[str, Path]:
    """The demo fleet's ``cluster.yaml`` and ``topology.conf`` under ``root`` (other host sets:
    none, the defaults apply): ``{setting: path}``."""
    if not demo:
        return {}
    files = {"cluster_config": root / "cluster.yaml", "topology_conf": root / "topology.conf"}
    files["cluster_config"].write_text(CLUSTER_YAML)
    files["topology_conf"].write_text(TOPOLOGY_CONF)
    return files


def export_lines(cluster: Any, root: Path, files: dict[str, Path]) -> str:
    """``export NAME='value'`` lines for a POSIX shell: connections, then the settings."""
    conns, ids = connection_env(cluster)
    settings = {"ssh_conn_ids": ",".join(f"{h}={c}" for h, c in ids.items()),
                **{name: str(path) for name, path in files.items()},
                "captures_dir": str(root / "captures"),
                "ledger_url": f"sqlite:///{root / 'ledger.db'}"}
    lines = ["# the emulated cluster's hosts as Airflow ssh connections, and the [hetero_gpu] settings",
             *(f"export {name}={shlex.quote(value)}" for name, value in conns.items()),
             *(f"export AIRFLOW__HETERO_GPU__{name.upper()}={shlex.quote(value)}" for name, value in settings.items())]
    return "\n".join(lines) + "\n"


def write_recipe(cluster: Any, root: Path, demo: bool) -> Path:
    """Write the fleet files and ``root/airflow.env`` (last: its presence says the cluster is up)."""
    text = export_lines(cluster, root, write_fleet_files(root, demo))
    path = root / ENV_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


__all__ = ["ENV_FILE", "export_lines", "write_fleet_files", "write_recipe"]
