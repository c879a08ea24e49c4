"""A collection's outcome as the ledger stores it: one record per host with its raw outputs."""

from __future__ import annotations

from pathlib import Path

from airflow_hetero_gpu.collect.ssh import CollectReport, HostResult
from airflow_hetero_gpu.fsutil import read_text
from airflow_hetero_gpu.ledger.inventory import HostRecord


def host_record(h: HostResult, out_dir: str | Path | None = None) -> HostRecord:
    """One host's record, with the texts its collection kept in memory (a text it did not keep
    is read back from ``out_dir``, the collection's directory)."""
    if not h.ok:
        return HostRecord(h.host, False, {}, h.reason or "collection failed", tuple(h.warnings))
    missing = [name for name in h.files if name not in h.texts]
    if missing and out_dir is None:
        raise ValueError(f"host {h.host}: {missing[0]} was not kept in memory and no directory was given")
    host_dir = Path(out_dir or ".") / "hosts" / h.host
    files = {name: h.texts[name] if name in h.texts else read_text(host_dir / name) for name in h.files}
    return HostRecord(h.host, True, files, None, tuple(h.warnings), h.query_source)


def host_records(report: CollectReport) -> list[HostRecord]:
    """The hosts of ``report`` with the texts their collection wrote into its directory (kept
    in memory by the collection; read back from the directory for a report made elsewhere)."""
    return [host_record(h, report.out_dir) for h in report.hosts
            if h.ok or h.duplicate_of is None]  # a second name of a collected address: nothing to store
