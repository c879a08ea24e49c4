"""``python -m airflow_hetero_gpu.testing.embedded serve FLEET.json`` (see :mod:`.serve`)."""

import sys

from airflow_hetero_gpu.testing.embedded.serve import main

sys.exit(main())
