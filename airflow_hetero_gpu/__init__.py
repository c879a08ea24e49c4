"""airflow-hetero-gpu: place distributed training on heterogeneous GPU fleets.

The placement engine lives in :mod:`airflow_hetero_gpu.core` and imports nothing from Airflow;
the Airflow hook, operator, sensor and trigger are thin skins over it.
"""

from __future__ import annotations

__version__ = "0.2.0"


def get_provider_info() -> dict:
    """Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""
    from airflow_hetero_gpu.provider_info import PROVIDER_INFO

    return dict(PROVIDER_INFO, versions=[__version__])
