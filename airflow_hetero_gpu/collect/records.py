"""A collection's outcome as the ledger stores it: one record per host with its raw outputs."""

from __future__ import annotations

from pathlib import Path

from airflow_hetero_gpu.collect.ssh import CollectReport
from airflow_hetero_gpu.fsutil import read_text
from airflow_hetero_gpu.ledger.inventory import HostRecord


def host_records(report: CollectReport) -> list[HostRecord]:
    """The hosts of ``report`` with the texts their collection wrote into its directory (kept
    in memory by the collection; read back from the directory for a report made elsewhere)."""
    out = []
    for h in report.hosts:
        if h.ok:
            host_dir = Path(report.out_dir) / "hosts" / h.host
            files = {name: h.texts[name] if name in h.texts else read_text(host_dir / name) for name in h.files}
            out.append(HostRecord(h.host, True, files, None, tuple(h.warnings), h.query_source))
        else:
            out.append(HostRecord(h.host, False, {}, h.reason or "collection failed", tuple(h.warnings)))
    return out
