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
            "python-modules": ["airflow_hetero_gpu.hooks.hetero_gpu"],
        }
    ],
    "operators": [],
    "sensors": [],
    "triggers": [],
    "plugins": [],
    "connection-types": [],
}
