"""Shared bits of the example DAGs. Nothing here touches the network or a database: the fleet
(hosts, capture directory, ledger) comes from the ``[hetero_gpu]`` settings at run time."""

from __future__ import annotations

import importlib.util
import os

# The training script on the GPU hosts. The example one ships with the package; on a real fleet
# point HETERO_GPU_TRAIN_SCRIPT (or the DAG's params) at your own script on the hosts.
TRAIN_SCRIPT = os.environ.get("HETERO_GPU_TRAIN_SCRIPT") or (
    importlib.util.find_spec("airflow_hetero_gpu.examples.train_tiny").origin
)
# Where the training job keeps its checkpoints on rank 0's host (resume after a GPU replacement).
CHECKPOINT_ROOT = os.environ.get("HETERO_GPU_CHECKPOINT_ROOT", "/tmp/hetero-gpu-checkpoints")
