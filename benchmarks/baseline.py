"""Run a benchmark against the package as it was at another git revision, in the same run.

    python benchmarks/plan_latency.py --baseline main~3     # this script, old and new code

The package of ``REV`` is extracted (``git archive``) into a temporary directory and the same
benchmark script runs in a subprocess with only that package on its path, asked for JSON; its
figures then print beside the current code's. The script must use only what both versions of
the package have.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def extract(rev: str, into: Path) -> Path:
    """The package ``airflow_hetero_gpu`` at ``rev``, under ``into``."""
    try:
        data = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "airflow_hetero_gpu"],
                              check=True, capture_output=True).stdout
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"--baseline {rev}: git archive failed: {e.stderr.decode().strip()}") from None
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def run(rev: str, script: str, args: list[str]) -> object:
    """``script args --json`` with the package of ``rev``; its parsed JSON output."""
    with tempfile.TemporaryDirectory(prefix="hetero-gpu-baseline-") as tmp:
        extract(rev, Path(tmp))
        env = {**os.environ, "PYTHONPATH": tmp}
        out = subprocess.run([sys.executable, script, *args, "--json"], env=env, cwd=tmp, check=True,
                             capture_output=True, text=True)
    return json.loads(out.stdout)


def revision(rev: str) -> str:
    """``rev`` as a short commit id, for the printout."""
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                          capture_output=True, text=True).stdout.strip()
