"""The collector's MIG step: on a host whose query shows a GPU with MIG enabled, list its MIG
devices (``nvidia-smi -L`` -> ``mig.txt``) and read their memory and processes (the plain
``nvidia-smi`` table -> ``mig-usage.txt``). Both are constant command lines.

Kept apart from the SSH plumbing: ``run(command, label) -> (returncode, stdout, stderr)`` is the
collector's way of running a command on the host it is connected to.
"""

from __future__ import annotations

from typing import Callable

from airflow_hetero_gpu.capture.query import parse_query_csv
from airflow_hetero_gpu.errors import CaptureError

MIG_LIST_COMMAND = "nvidia-smi -L"
MIG_USAGE_COMMAND = "nvidia-smi"
#: The files this step writes; a later collection without a MIG GPU removes them.
MIG_FILES = ("mig.txt", "mig-usage.txt")

Run = Callable[[str, str], "tuple[int, str, str]"]


def mig_enabled(query_text: str) -> bool:
    """Whether the query shows a GPU with ``mig.mode.current`` Enabled."""
    try:
        rows = parse_query_csv(query_text, "query.csv").rows
    except CaptureError:
        return False  # the reader will say what is wrong with it
    return any((r.mig_mode_current or "").lower() == "enabled" for r in rows)


def _first_line(*texts: str) -> str:
    for text in texts:
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return "(no output)"


def mig_files(run: Run, warnings: list[str]) -> dict[str, str]:
    """``mig.txt`` and ``mig-usage.txt``; without ``mig.txt`` the host's MIG GPUs hand out nothing
    (the inventory notes it), without ``mig-usage.txt`` their instances count as busy."""
    rc, out, err = run(MIG_LIST_COMMAND, MIG_LIST_COMMAND)
    if rc != 0 or "MIG " not in out:
        warnings.append(f"MIG devices not listed ({MIG_LIST_COMMAND}: {_first_line(out, err)})")
        return {}
    urc, uout, uerr = run(MIG_USAGE_COMMAND, MIG_USAGE_COMMAND)
    if urc != 0:
        warnings.append(f"MIG usage not read ({MIG_USAGE_COMMAND}: {_first_line(uout, uerr)}): "
                        "MIG instances count as busy")
        return {"mig.txt": out}
    return {"mig.txt": out, "mig-usage.txt": uout}
