"""Render an emulated host's state the way the real ``nvidia-smi`` (and the kernel log) print it.

Pure functions from the host state (a JSON-able dict, see :mod:`..state`) to text. The fake
``nvidia-smi`` script calls them, and tests call them directly to compare with real samples.
Only the standard library is used: this package runs inside every emulated SSH session.

One module per output: :mod:`.query` (``--query-gpu``, ``-L``), :mod:`.topo` (``topo -m``),
:mod:`.table` (the plain table), :mod:`.kernel_log` (``dmesg``, ``journalctl -k``), and
:mod:`.common` (messages, return codes). Their public names are re-exported here.

What "as the real one prints" means here, with the evidence in ``docs/emulated-cluster.md``:

* ``--query-gpu``: header fields joined by ``", "``, aliases echoed under their canonical name
  (``gpu_name`` -> ``name``), units in the header (``memory.total [MiB]``) and, unless
  ``nounits``, after each value (``81920 MiB``, ``35 %``, ``250.00 W``); ``[N/A]`` carries no unit;
  a MIG-enabled GPU's utilization is ``[N/A]``; the fabric fields print bare ``N/A`` on a GPU
  without an NVLink fabric.
* ``topo -m``: tab-separated, a leading tab on the header, `` X `` on the diagonal, affinity
  columns, the quirky empty cell before ``GPU NUMA ID``, then the Legend (and NIC Legend).
* ``-L``: ``GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-...)``, and under a MIG-enabled GPU one
  ``  MIG 3g.40gb     Device  0: (UUID: MIG-...)`` line per MIG device.
* the plain table: GPU rows, the "MIG devices:" block and the process list (R545-R590 layout).
"""

from __future__ import annotations

from airflow_hetero_gpu.testing.nvsmi.common import (
    DRIVER_NOT_LOADED,
    INVALID_ARGS,
    NA,
    NO_DEVICES,
    RC_DRIVER_NOT_LOADED,
    RC_GPU_IS_LOST,
    RC_INVALID_ARGUMENT,
    RC_NOT_FOUND,
    RC_OK,
    RC_OTHER,
    QueryError,
)
from airflow_hetero_gpu.testing.nvsmi.apps import query_compute_apps
from airflow_hetero_gpu.testing.nvsmi.kernel_log import (
    XID_TEXT,
    dmesg_text,
    journal_text,
    kernel_messages,
    xid_bus,
    xid_message,
)
from airflow_hetero_gpu.testing.nvsmi.query import (
    ALIASES,
    FIELDS,
    KNOWN_FIELDS,
    KNOWN_FIELDS_FILE,
    Field,
    canonical_field,
    header_line,
    iter_field_names,
    list_gpus,
    lost_message,
    lost_returncode,
    parse_format,
    query_gpu,
    select_gpus,
    value_text,
)
from airflow_hetero_gpu.testing.nvsmi.table import table_text
from airflow_hetero_gpu.testing.nvsmi.topo import (
    ANSI_RESET,
    ANSI_UNDERLINE,
    LEGEND,
    LINK_LABEL,
    TOPO_SAMPLE_DIR,
    read_sample,
    render_topo,
    sample_names,
    topo_text,
    validate_matrix,
)

__all__ = [
    "ALIASES", "ANSI_RESET", "ANSI_UNDERLINE", "DRIVER_NOT_LOADED", "FIELDS", "Field", "INVALID_ARGS",
    "KNOWN_FIELDS", "KNOWN_FIELDS_FILE", "LEGEND", "LINK_LABEL", "NA", "NO_DEVICES", "QueryError",
    "RC_DRIVER_NOT_LOADED", "RC_GPU_IS_LOST", "RC_INVALID_ARGUMENT", "RC_NOT_FOUND", "RC_OK", "RC_OTHER",
    "TOPO_SAMPLE_DIR", "XID_TEXT", "canonical_field", "dmesg_text", "header_line", "iter_field_names",
    "journal_text", "kernel_messages", "list_gpus", "lost_message", "lost_returncode", "parse_format",
    "query_compute_apps", "query_gpu", "read_sample", "render_topo", "sample_names", "select_gpus", "table_text", "topo_text",
    "validate_matrix", "value_text", "xid_bus", "xid_message",
]
