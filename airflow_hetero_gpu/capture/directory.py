"""Reading a capture directory (SPEC §2).

```
DIR/
  cluster.yaml              optional
  topology.conf             optional
  hosts/<host>/query.csv    nvidia-smi --query-gpu=<FIELDS> --format=csv
  hosts/<host>/topo.txt     nvidia-smi topo -m
  hosts/<host>/xid.log      optional
  hosts/<host>/mig.txt      nvidia-smi -L, where a GPU has MIG enabled (optional)
  hosts/<host>/mig-usage.txt  nvidia-smi (the table), with mig.txt (optional)
  hosts/<host>/apps.csv     nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,process_name --format=csv (optional)
  hosts/<host>/procs.txt    ps -o pid=,pgid=,user= of those processes (optional)
  hosts/<host>/error.txt    present when collecting from that host failed
```
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Mapping

from airflow_hetero_gpu.capture.apps import ComputeApp, Owner, parse_apps_csv, parse_procs
from airflow_hetero_gpu.capture.mig import MigListing, MigUsage, parse_mig_list, parse_mig_usage
from airflow_hetero_gpu.capture.query import QueryResult, parse_query_csv
from airflow_hetero_gpu.capture.slurm import SwitchTopology, parse_topology_conf
from airflow_hetero_gpu.capture.topo import TopoMatrix, parse_topo
from airflow_hetero_gpu.capture.xid import XidEvent, parse_xid_log
from airflow_hetero_gpu.errors import CaptureError

QUERY_FIELDS = (
    "index,uuid,name,pci.bus_id,memory.total,memory.used,utilization.gpu,temperature.gpu,"
    "power.draw,power.limit,ecc.errors.uncorrected.volatile.total,retired_pages.pending"
)
HOST_NAME = re.compile(r"^[A-Za-z0-9_.:\-]+$")


@dataclass
class HostCapture:
    host: str
    query: QueryResult | None = None
    topo: TopoMatrix | None = None
    xid: list[XidEvent] = field(default_factory=list)
    error: str | None = None  # why collecting from this host failed (its GPUs are unreachable)
    notes: list[str] = field(default_factory=list)  # things worth telling, not failures
    # when the outputs were read: the ledger's inventory knows it; for a capture directory, the
    # modification time of xid.log (the collector writes it as it reads the kernel log) or of
    # query.csv. The offline Xid rule ages journal lines against it (core/inventory.py).
    collected_at: datetime | None = None
    stale: str | None = None  # why the outputs are too old to place on ("inventory 312 s old (max 120 s)")
    mig: MigListing | None = None  # mig.txt: the MIG devices of MIG-enabled GPUs
    mig_usage: MigUsage | None = None  # mig-usage.txt: their memory and processes
    apps: list[ComputeApp] | None = None  # apps.csv: the GPUs' compute processes (None: not read)
    owners: dict[int, Owner] = field(default_factory=dict)  # procs.txt: their owners and groups
    drained: str | None = None  # set by a reader with a ledger: why the host is drained


@dataclass
class CaptureSet:
    root: Path | None  # the directory read (None: the ledger's inventory)
    hosts: dict[str, HostCapture]
    switches: SwitchTopology | None = None
    config_path: Path | None = None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise CaptureError(str(path), f"cannot read: {err.strerror or err}") from None


#: The raw outputs a host's capture holds, in the order they are read.
HOST_FILES = ("error.txt", "query.csv", "topo.txt", "xid.log", "mig.txt", "mig-usage.txt", "apps.csv", "procs.txt")


def parse_host(host: str, files: Mapping[str, str], where: str, *, error: str | None = None,
               query: QueryResult | None = None) -> HostCapture:
    """Parse one host's raw outputs (``{file name: text}``, the files of ``hosts/<host>/``).

    ``where`` names the host's capture in messages (its directory, or the ledger row);
    ``error`` is the host's collection failure when it does not come as an ``error.txt`` file;
    ``query`` is ``files["query.csv"]`` already parsed (the ledger's facts), used instead of
    parsing the text again.
    """
    if not HOST_NAME.match(host):
        raise CaptureError(where, f"host directory name {host!r} is not a valid host name")
    cap = HostCapture(host)
    text = files.get("error.txt") if error is None else error
    if text is not None:
        cap.error = " ".join(text.split()) or "collection failed (empty error.txt)"
    q = f"{where}/query.csv"
    if "query.csv" in files:
        cap.query = query if query is not None else parse_query_csv(files["query.csv"], q)
        if cap.query.host_error and cap.error is None:
            cap.error = cap.query.host_error
    elif cap.error is None:
        raise CaptureError(where, "missing query.csv (and no error.txt saying why)")
    has_rows = cap.query is not None and bool(cap.query.rows)
    if "topo.txt" in files and has_rows:
        try:
            cap.topo = parse_topo(files["topo.txt"], f"{where}/topo.txt")
        except CaptureError:
            if cap.error is None:
                raise
            cap.notes.append("topo.txt unreadable (host collection failed)")
    elif has_rows:
        cap.notes.append("no topo.txt: GPU pairs treated as SYS")
    if "xid.log" in files:
        cap.xid = parse_xid_log(files["xid.log"], f"{where}/xid.log")
    if "mig.txt" in files:
        cap.mig = parse_mig_list(files["mig.txt"], f"{where}/mig.txt")
    if "mig-usage.txt" in files:
        cap.mig_usage = parse_mig_usage(files["mig-usage.txt"], f"{where}/mig-usage.txt")
    if "apps.csv" in files:
        cap.apps = parse_apps_csv(files["apps.csv"], f"{where}/apps.csv")
    if "procs.txt" in files:
        cap.owners = parse_procs(files["procs.txt"], f"{where}/procs.txt")
    return cap


def host_files(host_dir: Path) -> dict[str, str]:
    """The raw outputs present in one host's directory."""
    files = {}
    for name in HOST_FILES:
        path = host_dir / name
        if path.exists():
            files[name] = _read_text(path)
    return files


def read_host(host_dir: Path) -> HostCapture:
    cap = parse_host(host_dir.name, host_files(host_dir), str(host_dir))
    for name in ("xid.log", "query.csv"):
        path = host_dir / name
        if path.exists():
            cap.collected_at = datetime.fromtimestamp(path.stat().st_mtime).astimezone()
            break
    return cap


def read_capture_dir(root: str | Path) -> CaptureSet:
    """Parse every file of a capture directory; any unreadable file is a one-line CaptureError."""
    root = Path(root)
    if not root.is_dir():
        raise CaptureError(str(root), "not a directory (expected a capture directory with hosts/<host>/query.csv)")
    hosts_dir = root / "hosts"
    host_dirs = sorted(p for p in hosts_dir.iterdir() if p.is_dir()) if hosts_dir.is_dir() else []
    if not host_dirs:
        raise CaptureError(str(root), "no hosts found (expected hosts/<host>/query.csv)")
    hosts = {d.name: read_host(d) for d in host_dirs}
    switches = None
    conf = root / "topology.conf"
    if conf.exists():
        switches = parse_topology_conf(_read_text(conf), str(conf))
    cfg = root / "cluster.yaml"
    return CaptureSet(root, hosts, switches, cfg if cfg.exists() else None)
