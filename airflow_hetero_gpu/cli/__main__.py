"""``python -m airflow_hetero_gpu.cli``: the same as ``hetero-gpu``."""

import sys

from airflow_hetero_gpu.cli.app import main

sys.exit(main())
