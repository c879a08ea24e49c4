"""The training example on its own, under real torchrun on CPU (gloo)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import airflow_hetero_gpu.examples.train_tiny as train_tiny

pytest.importorskip("torch")

SCRIPT = Path(train_tiny.__file__)


def _torchrun(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(SCRIPT), "--samples", "64", *args],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_a_loss_that_turns_nan_stops_every_rank_with_a_clear_line_and_exit_4(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    done = _torchrun(tmp_path, "--epochs", "50", "--lr", "1e12", "--checkpoint-dir", str(ckpt))
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "loss is nan at epoch" in out or "loss is inf at epoch" in out, out
    assert "training done" not in out
    # it stopped at the first bad epoch, not after all 50
    bad = next(line for line in out.splitlines() if "loss is" in line and "stopping" in line)
    epoch = int(bad.split("at epoch ")[1].split(":")[0])
    assert epoch < 50 and f"epoch {epoch} loss" not in out
    assert sum(1 for line in out.splitlines() if "stopping (lower --lr" in line) == 1  # rank 0 says it once


def test_a_finite_loss_trains_to_the_end(tmp_path):
    done = _torchrun(tmp_path, "--epochs", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "training done" in done.stdout and "loss is" not in done.stderr
