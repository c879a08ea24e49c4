"""Where traces and node lists come from: a file path, or ``alibaba:NAME`` for a pod list of
Alibaba's cluster-trace-gpu-v2023 (``openb_pod_list_NAME.csv``).

The Alibaba CSVs are not shipped with the package (they are the ``cluster-trace-gpu-v2023/csv``
folder of https://github.com/alibaba/clusterdata). They are looked for in ``--alibaba-dir``, then
``$HETERO_GPU_ALIBABA_DIR``, then ``data/traces/alibaba-gpu-v2023`` under the current directory,
its parent and the parent's ``shared/`` folder.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.sim.trace import Trace, read_alibaba, read_jobs_csv

ALIBABA_PREFIX = "alibaba:"
ALIBABA_NODES = "openb_node_list_gpu_node.csv"
_SUBDIR = Path("data") / "traces" / "alibaba-gpu-v2023"


def alibaba_dir(explicit: str | Path | None = None) -> Path:
    """The folder holding the Alibaba CSVs."""
    if explicit:
        d = Path(explicit)
        if not d.is_dir():
            raise HeteroGpuError(f"--alibaba-dir: no such folder, got {str(explicit)!r}")
        return d
    env = os.environ.get("HETERO_GPU_ALIBABA_DIR")
    if env:
        if not Path(env).is_dir():
            raise HeteroGpuError(f"HETERO_GPU_ALIBABA_DIR: no such folder, got {env!r}")
        return Path(env)
    here = Path.cwd()
    for base in (here, here.parent, here.parent / "shared", here / "shared"):
        if (base / _SUBDIR / ALIBABA_NODES).is_file():
            return base / _SUBDIR
    raise HeteroGpuError(
        "cannot find the Alibaba cluster-trace-gpu-v2023 CSVs: pass --alibaba-dir DIR (the "
        "cluster-trace-gpu-v2023/csv folder of github.com/alibaba/clusterdata) or set HETERO_GPU_ALIBABA_DIR"
    )


def resolve_trace(spec: str, directory: str | Path | None = None) -> Path:
    """``alibaba:NAME`` -> its pod list; anything else is a path."""
    if spec.startswith(ALIBABA_PREFIX):
        name = spec[len(ALIBABA_PREFIX):].strip()
        if not name:
            raise HeteroGpuError(f"--trace: expected alibaba:NAME (e.g. alibaba:multigpu50), got {spec!r}")
        path = alibaba_dir(directory) / f"openb_pod_list_{name}.csv"
        if not path.is_file():
            raise HeteroGpuError(f"--trace {spec}: no such pod list, {path} does not exist")
        return path
    path = Path(spec)
    if not path.is_file():
        raise HeteroGpuError(f"--trace: no such file, got {spec!r}")
    return path


def load_trace(spec: str, *, fractional: str = "round-up", seed: int = 0, directory: str | Path | None = None) -> Trace:
    """Read a trace, telling Alibaba pod lists (``num_gpu`` column) from the plain job CSV
    (``job_id`` column) by their header."""
    path = resolve_trace(spec, directory)
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:
            header = next(csv.reader(fh), [])
    except (OSError, UnicodeDecodeError) as err:
        raise HeteroGpuError(f"{path}: cannot read: {err}") from None
    header = [h.strip() for h in header]
    if "num_gpu" in header:
        return read_alibaba(path, fractional=fractional, seed=seed)
    if "job_id" in header:
        return read_jobs_csv(path)
    raise HeteroGpuError(f"{path}:1: not a trace: expected a job_id column (job CSV) or a num_gpu column "
                         f"(Alibaba pod list), header has {', '.join(header) or 'nothing'}")


def resolve_nodes(spec: str | None, trace_spec: str, directory: str | Path | None = None) -> Path:
    """``--nodes``, or for an Alibaba trace its GPU node list beside it."""
    if spec:
        if spec.startswith(ALIBABA_PREFIX):
            path = alibaba_dir(directory) / f"openb_node_list_{spec[len(ALIBABA_PREFIX):]}.csv"
        else:
            path = Path(spec)
        if not path.is_file():
            raise HeteroGpuError(f"--nodes: no such file, got {spec!r}")
        return path
    if trace_spec.startswith(ALIBABA_PREFIX):
        return alibaba_dir(directory) / ALIBABA_NODES
    sibling = Path(trace_spec).with_name(ALIBABA_NODES)
    if sibling.is_file():
        return sibling
    raise HeteroGpuError("--nodes: a node list (columns sn, gpu, model) is needed for this trace")
