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


def test_the_written_out_momentum_sgd_makes_torch_optim_sgds_updates():
    import torch

    torch.manual_seed(0)
    ours, theirs = train_tiny.make_model(8, 16), train_tiny.make_model(8, 16)
    theirs.load_state_dict(ours.state_dict())
    opt_ours = train_tiny.MomentumSGD(ours.parameters(), lr=0.05, momentum=0.9)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for step in range(12):
        if step == 6:  # each resumes from the other's state dict (a checkpoint either wrote): the
            # momentum, and the saved lr and momentum over those it was built with
            mine, its = opt_ours.state_dict(), opt_theirs.state_dict()
            opt_ours = train_tiny.MomentumSGD(ours.parameters(), lr=0.5, momentum=0.5)
            opt_ours.load_state_dict(its)
            opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.5, momentum=0.5)
            opt_theirs.load_state_dict(mine)
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)


def test_a_training_process_does_not_import_the_compiler_stack(tmp_path):
    """What a rank does (join the group, take rank 0's weights, a step with its gradients
    averaged, a checkpoint written and read) leaves ``torch._dynamo`` unimported: its import
    costs every process of every job about 1.2 s of CPU."""
    code = (f"import sys; sys.path.insert(0, {str(SCRIPT.parent)!r}); import train_tiny as t; import torch\n"
            "import torch.distributed as dist; from pathlib import Path\n"
            f"dist.init_process_group('gloo', init_method={(tmp_path / 'group').as_uri()!r}, rank=0, world_size=1)\n"
            "m = t.make_model(8, 16); o = t.MomentumSGD(m.parameters(), lr=0.05, momentum=0.9)\n"
            "t.broadcast_parameters(m)\n"
            "x, y = t.make_data(32, 8, 1); ((m(x) - y) ** 2).mean().backward(); t.average_gradients(o.params, 1)\n"
            "o.step(); t.save_checkpoint(Path('ckpt'), m, o, 1); assert t.load_checkpoint(Path('ckpt'))['epoch'] == 1\n"
            "dist.destroy_process_group(); print('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
