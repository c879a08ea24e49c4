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
  hosts/<host>/error.txt    present when collecting from that host failed
```
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

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
    # when the kernel log was read (xid.log's modification time: the collector writes it then);
    # the offline Xid rule ages journal lines against it (core/inventory.py)
    captured_at: datetime | None = None
    mig: MigListing | None = None  # mig.txt: the MIG devices of MIG-enabled GPUs
    mig_usage: MigUsage | None = None  # mig-usage.txt: their memory and processes


@dataclass
class CaptureSet:
    root: Path
    hosts: dict[str, HostCapture]
    switches: SwitchTopology | None = None
    config_path: Path | None = None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise CaptureError(str(path), f"cannot read: {err.strerror or err}") from None


def read_host(host_dir: Path) -> HostCapture:
    host = host_dir.name
    if not HOST_NAME.match(host):
        raise CaptureError(str(host_dir), f"host directory name {host!r} is not a valid host name")
    cap = HostCapture(host)
    err_file = host_dir / "error.txt"
    if err_file.exists():
        text = " ".join(_read_text(err_file).split())
        cap.error = text or "collection failed (empty error.txt)"
    q = host_dir / "query.csv"
    if q.exists():
        cap.query = parse_query_csv(_read_text(q), str(q))
        if cap.query.host_error and cap.error is None:
            cap.error = cap.query.host_error
    elif cap.error is None:
        raise CaptureError(str(host_dir), "missing query.csv (and no error.txt saying why)")
    t = host_dir / "topo.txt"
    if t.exists() and cap.query is not None and cap.query.rows:
        try:
            cap.topo = parse_topo(_read_text(t), str(t))
        except CaptureError:
            if cap.error is None:
                raise
            cap.notes.append("topo.txt unreadable (host collection failed)")
    elif cap.query is not None and cap.query.rows:
        cap.notes.append("no topo.txt: GPU pairs treated as SYS")
    x = host_dir / "xid.log"
    if x.exists():
        cap.xid = parse_xid_log(_read_text(x), str(x))
        cap.captured_at = datetime.fromtimestamp(x.stat().st_mtime).astimezone()
    m = host_dir / "mig.txt"
    if m.exists():
        cap.mig = parse_mig_list(_read_text(m), str(m))
    u = host_dir / "mig-usage.txt"
    if u.exists():
        cap.mig_usage = parse_mig_usage(_read_text(u), str(u))
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
