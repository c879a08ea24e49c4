"""Deployment-wide defaults from Airflow's configuration, section ``[hetero_gpu]``.

An administrator names the fleet once (``AIRFLOW__HETERO_GPU__SSH_CONN_IDS``, ...) and every
DAG, the health sensor and the cluster page use it; an argument given to an operator, sensor or
hook wins over its setting. Read at run time only, never when a DAG file is parsed.
"""

from __future__ import annotations

SECTION = "hetero_gpu"

#: option -> what it holds (declared in provider_info's ``config`` section too)
OPTIONS = {
    "ssh_conn_ids": "the GPU hosts' ssh connections: CONN,CONN or LABEL=CONN,LABEL=CONN",
    "captures_dir": "the capture directory holding the last inventory",
    "cluster_config": "path of cluster.yaml (weights, thresholds, task types)",
    "topology_conf": "path of the Slurm-style topology.conf (switch tiers between hosts)",
    "ledger_conn_id": "Airflow connection of the reservation ledger",
    "ledger_url": "SQLAlchemy URL of the reservation ledger",
}


def setting(name: str) -> str | None:
    """The value of ``[hetero_gpu] <name>``, stripped; None when unset or empty."""
    if name not in OPTIONS and name != "refresh_seconds":
        raise KeyError(name)
    try:
        from airflow.configuration import conf
    except ImportError:  # pragma: no cover - Airflow is a dependency
        return None
    value = conf.get(SECTION, name, fallback=None)
    return value.strip() if isinstance(value, str) and value.strip() else None
