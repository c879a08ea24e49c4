"""The provider's registration record (kept in one place so docs and tests can read it)."""

from __future__ import annotations

PROVIDER_INFO: dict = {
    "package-name": "airflow-hetero-gpu",
    "name": "Heterogeneous GPU placement",
    "description": (
        "Topology- and load-aware placement of distributed training on a mixed fleet of GPU "
        "servers reached over SSH: candidate pools by task type, an evaluation of load balance, "
        "fragmentation and topology, reservations in a ledger, and torchrun launches."
    ),
    "integrations": [
        {
            "integration-name": "Heterogeneous GPU cluster",
            "external-doc-url": "https://github.com/airflow-hetero-gpu/airflow-hetero-gpu",
            "tags": ["compute"],
        }
    ],
    "hooks": [
        {
            "integration-name": "Heterogeneous GPU cluster",
            "python-modules": ["airflow_hetero_gpu.hooks.hetero_gpu", "airflow_hetero_gpu.hooks.ledger"],
        }
    ],
    "operators": [
        {
            "integration-name": "Heterogeneous GPU cluster",
            "python-modules": ["airflow_hetero_gpu.operators.hetero_train"],
        }
    ],
    "sensors": [
        {
            "integration-name": "Heterogeneous GPU cluster",
            "python-modules": ["airflow_hetero_gpu.sensors.gpu_health"],
        }
    ],
    "triggers": [
        {
            "integration-name": "Heterogeneous GPU cluster",
            "python-modules": ["airflow_hetero_gpu.triggers.gpu_health", "airflow_hetero_gpu.triggers.capacity",
                               "airflow_hetero_gpu.triggers.queue", "airflow_hetero_gpu.triggers.training"],
        }
    ],
    "task-decorators": [
        {"name": "hetero_train", "class-name": "airflow_hetero_gpu.decorators.hetero_train.hetero_train_task"},
    ],
    # The cluster page plugin is registered through the "airflow.plugins" entry point (pyproject),
    # which Airflow loads in every configuration; listed here too it would load twice.
    "connection-types": [],
    "config": {
        "hetero_gpu": {
            "description": (
                "The GPU fleet of this deployment: its hosts, the capture directory, cluster.yaml, "
                "topology.conf and the ledger, used by the operator, the health sensor, the hooks and "
                "the cluster page (Browse > GPU cluster) wherever no argument names them."
            ),
            "options": {
                "ssh_conn_ids": {
                    "description": (
                        "The GPU hosts' Airflow ssh connections, used by the operator, the health sensor and "
                        "the hook when no ssh_conn_ids argument is given: CONN,CONN or LABEL=CONN,LABEL=CONN "
                        "(the label names the host in captures, pools and topology.conf)."
                    ),
                    "version_added": "0.1.0",
                    "type": "string",
                    "example": "dgx-a1=ssh_dgx_a1,dgx-a2=ssh_dgx_a2,rtx-box=ssh_rtx_box",
                    "default": None,
                },
                "hosts_file": {
                    "description": (
                        "A large fleet's hosts for the health sensor given no hosts argument, one "
                        "[NAME=][USER@]HOST[:PORT] a line (the hetero-gpu check --hosts-file format), reached "
                        "through the one ssh connection fleet_conn_id; wins over ssh_conn_ids for the sensor "
                        "only (the operator launches through ssh_conn_ids)."
                    ),
                    "version_added": "0.1.0",
                    "type": "string",
                    "example": "/srv/hetero-gpu/hosts",
                    "default": None,
                },
                "fleet_conn_id": {
                    "description": (
                        "The Airflow ssh connection that reaches every host of hosts_file: its login and port "
                        "for the lines that name none, its key_file extra, host keys verified against its "
                        "known_hosts extra (default ~/.ssh/known_hosts)."
                    ),
                    "version_added": "0.1.0",
                    "type": "string",
                    "example": "gpu_fleet",
                    "default": None,
                },
                "cluster_config": {
                    "description": "Path of cluster.yaml (weights, thresholds, task types) used when none is given.",
                    "version_added": "0.1.0",
                    "type": "string",
                    "example": "/opt/airflow/gpu/cluster.yaml",
                    "default": None,
                },
                "topology_conf": {
                    "description": "Path of the Slurm-style topology.conf (switch tiers between hosts) used when none is given.",
                    "version_added": "0.1.0",
                    "type": "string",
                    "example": "/opt/airflow/gpu/topology.conf",
                    "default": None,
                },
                "captures_dir": {
                    "description": (
                        "Optional. A capture directory where collections are also written (hosts/<host>/"
                        "query.csv, topo.txt, ...). The inventory itself lives in the ledger; set this only "
                        "to keep a directory copy for other tools (hetero-gpu captures export writes one "
                        "from the ledger on demand)."
                    ),
                    "version_added": "0.1.0",
                    "type": "string",
                    "example": "/opt/airflow/gpu-captures",
                    "default": None,
                },
                "ledger_conn_id": {
                    "description": (
                        "An Airflow connection naming the reservation ledger (postgres, sqlite, or any type "
                        "with an extra 'url'). Wins over ledger_url."
                    ),
                    "version_added": "0.1.0",
                    "type": "string",
                    "example": "hetero_gpu_ledger",
                    "default": None,
                },
                "ledger_url": {
                    "description": (
                        "SQLAlchemy URL (or SQLite file path) of the reservation ledger. With neither this "
                        "nor ledger_conn_id: the SQLite file $AIRFLOW_HOME/hetero_gpu_ledger.db."
                    ),
                    "version_added": "0.1.0",
                    "type": "string",
                    "example": "postgresql://ledger:secret@db.example:5432/hetero_gpu",
                    "default": None,
                    "sensitive": True,
                },
                "inventory_max_age": {
                    "description": (
                        "Seconds a host's inventory in the ledger may be old before a training task collects "
                        "that host itself (and stores what it collected). A host still older after that is not "
                        "placed on. 0: every task collects the whole fleet first."
                    ),
                    "version_added": "0.2.0",
                    "type": "float",
                    "example": "120",
                    "default": "300",
                },
                "history_interval": {
                    "description": (
                        "Seconds between two history samples of a host whose state did not change (a change "
                        "of health, reservation or eviction is sampled at once)."
                    ),
                    "version_added": "0.2.0",
                    "type": "float",
                    "example": "60",
                    "default": "300",
                },
                "history_retention": {
                    "description": "Seconds the ledger keeps history samples, GPU events and collection records.",
                    "version_added": "0.2.0",
                    "type": "float",
                    "example": "86400",
                    "default": "604800",
                },
                "default_team": {
                    "description": ("The team a training job counts against when its operator's team argument "
                                    "is not given (the teams' GPU quotas: hetero-gpu teams apply)."),
                    "version_added": "0.2.0",
                    "type": "string",
                    "example": "research",
                    "default": "default",
                },
                "preemption": {
                    "description": (
                        "on: a job waiting in the queue may preempt running jobs of lower priority "
                        "(docs/preemption.md); off: never. Read by every process that writes the ledger."
                    ),
                    "version_added": "0.3.0",
                    "type": "string",
                    "example": "off",
                    "default": "on",
                },
                "preemption_min_runtime": {
                    "description": "Seconds a job runs after its (re)start before it may be preempted.",
                    "version_added": "0.3.0",
                    "type": "float",
                    "example": "1800",
                    "default": "600",
                },
                "preemption_delay": {
                    "description": "Seconds a job waits in the queue before it may preempt another.",
                    "version_added": "0.3.0",
                    "type": "float",
                    "example": "300",
                    "default": "60",
                },
                "refresh_seconds": {
                    "description": "How often the cluster page reloads itself, in seconds; 0 never.",
                    "version_added": "0.1.0",
                    "type": "integer",
                    "example": None,
                    "default": "60",
                },
            },
        }
    },
}
