"""The exit codes of every ``hetero-gpu`` command (its text forms are in :mod:`airflow_hetero_gpu.text`).

Exit status of every command:

* 0 (``EXIT_OK``): done (placed, collected, checked);
* 2 (``EXIT_BAD_INPUT``): bad input, with one line on stderr naming the file, key, value or
  connection;
* 3 (``EXIT_NO_CAPACITY``): no pool can host the job now (``plan``), every pool's reason printed;
* 4 (``EXIT_NOTHING_COLLECTED``): no host could be collected (``collect``, ``check``).
"""

from __future__ import annotations

EXIT_OK, EXIT_BAD_INPUT, EXIT_NO_CAPACITY, EXIT_NOTHING_COLLECTED = 0, 2, 3, 4
