"""Write a capture directory (SPEC §2) from emulated host specs, without SSH.

The files hold exactly what the emulated ``nvidia-smi`` prints for those hosts (the same
renderer the fake tools use) for the collector's commands (the query with its optional fields,
``topo -m``, and ``-L`` plus the table where a GPU has MIG on), so tests and samples exercise
the real readers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from airflow_hetero_gpu.capture.directory import QUERY_FIELDS
from airflow_hetero_gpu.capture.query import OPTIONAL_FIELDS
from airflow_hetero_gpu.testing import nvsmi
from airflow_hetero_gpu.testing.state import HostSpec


def write_capture_dir(
    root: str | Path,
    hosts: Iterable[HostSpec],
    *,
    topology_conf: str | None = None,
    cluster_yaml: str | None = None,
    errors: dict[str, str] | None = None,
) -> Path:
    """Render ``hosts`` into ``root``; ``errors`` maps host -> error.txt text (collection failed)."""
    root = Path(root)
    for spec in hosts:
        d = root / "hosts" / spec.name
        d.mkdir(parents=True, exist_ok=True)
        for name, text in host_files(spec).items():
            if text or name != "xid.log":
                (d / name).write_text(text)
    for host, message in (errors or {}).items():
        d = root / "hosts" / host
        d.mkdir(parents=True, exist_ok=True)
        (d / "error.txt").write_text(message + "\n")
    if topology_conf is not None:
        (root / "topology.conf").write_text(topology_conf)
    if cluster_yaml is not None:
        (root / "cluster.yaml").write_text(cluster_yaml)
    return root


def host_files(spec: HostSpec) -> dict[str, str]:
    """The raw outputs a collection of ``spec`` reads (what :func:`write_capture_dir` writes):
    the query with its optional fields, ``topo -m``, the kernel log's Xid lines, and ``-L`` plus
    the table where a GPU has MIG on (collect/ssh.py)."""
    state = spec.to_state()
    files = {"query.csv": nvsmi.query_gpu(state, ",".join([QUERY_FIELDS, *OPTIONAL_FIELDS]), "csv")[0],
             "topo.txt": nvsmi.topo_text(state)}
    files["xid.log"] = "".join(line for line in nvsmi.dmesg_text(state).splitlines(True) if "NVRM: Xid" in line)
    if any(str(g.get("mig_mode") or "").lower() == "enabled" for g in state["gpus"]):
        files["mig.txt"] = nvsmi.list_gpus(state)[0]
        files["mig-usage.txt"] = nvsmi.table_text(state)
    return files
