"""A tiny but real distributed training: an MLP learning a synthetic regression, data-parallel.

Start it with torchrun (it reads RANK, LOCAL_RANK and WORLD_SIZE from torchrun's environment)::

    torchrun --nnodes 1 --nproc-per-node 2 train_tiny.py --epochs 5 --checkpoint-dir /tmp/ckpt

- Data: ``--samples`` points ``x ~ N(0, 1)^features``, ``y = sin(x·w) + x·v + noise``, generated
  from ``--seed`` so every rank builds the same set; each rank trains on its own shard.
- Data-parallel as ``DistributedDataParallel`` is: rank 0's weights go to every rank at the
  start, and after each step's backward the gradients are averaged over the ranks in one
  all-reduce before the optimizer's step (SGD with momentum, torch.optim.SGD's update). Both are
  written out here, a few lines each: building a ``DistributedDataParallel`` or any
  ``torch.optim`` optimizer imports PyTorch's compiler stack (``torch._dynamo``), about 1.2 s of
  CPU in every process, longer than this whole training takes.
- Backend: gloo on CPU (the default), or ``--backend nccl`` on the GPU ``LOCAL_RANK`` of the
  devices the launcher made visible (needs CUDA).
- Every rank prints ``rank R of W (local rank L) on HOST, device D`` once it joined the group;
  rank 0 prints ``epoch E loss L`` after every epoch (``--log-every``), the loss being the mean
  over all ranks, so a log shows it falling.
- ``--checkpoint-dir``: rank 0 writes model, optimizer and epoch after every ``--checkpoint-every``
  epochs (default 1), atomically (temporary file, fsync, rename), and prints ``checkpoint of epoch
  N saved``. On start, rank 0 loads the last checkpoint when there is one and broadcasts it, so
  the directory only needs to exist on rank 0's host; every rank then prints ``rank R resumed
  from epoch N``. Environment variables in the path are expanded (``$HETERO_GPU_HOST``: a
  directory of each host's own, as on hosts without shared storage).
- ``--fail-at-epoch E --fail-rank R``: rank R exits with status 3 at the start of epoch E
  (a simulated crash, for tests of failure handling); ``--fail-host NAME`` instead makes the
  first local rank of the node whose ``HETERO_GPU_HOST`` is NAME crash (ranks are given out by
  the rendezvous, so a host is the stable way to name where the crash happens).
- ``--stop-file PATH``: finish successfully after the epoch during which PATH appears on rank
  0's host (a clean early stop that needs no signal).
- ``--hold-after-epoch E --hold-file PATH``: after epoch E (its loss printed and its checkpoint
  written), every rank waits until PATH appears on rank 0's host, printing ``holding after epoch
  E until PATH appears`` once; a run resumed past epoch E does not hold. Tests use it to make a
  job wait for an event (a GPU replaced, a database back) instead of racing it against a clock.
- A loss that turns NaN or infinite (a learning rate too high, bad data) stops every rank
  after that epoch with ``loss is nan at epoch E: stopping`` on rank 0 and exit status 4,
  before the checkpoint of that epoch is written (the last good checkpoint stays).
- SIGTERM (what torchrun and the launcher send to stop a job, and what preemption sends first)
  stops the loop after the current step on every rank together (the ranks agree on it in each
  step), or during a hold; rank 0 then saves the last completed epoch's checkpoint if it is not
  on disk yet (``SIGTERM received: checkpoint of epoch N saved``, or ``kept``), and the process
  exits with status 143. Relaunched with the same arguments, it resumes from that epoch.

Needs only PyTorch: this file is copied to, or installed on, the training hosts.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

CHECKPOINT_NAME = "checkpoint.pt"
CRASH_EXIT_CODE = 3
NAN_EXIT_CODE = 4
SIGTERM_EXIT_CODE = 128 + signal.SIGTERM


class Stop:
    """Set by the SIGTERM handler; the training loop checks it between steps."""

    requested = False


def _on_sigterm(signum: int, frame: Any) -> None:
    Stop.requested = True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="train until this epoch (1-based)")
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    parser.add_argument("--checkpoint-every", type=int, default=1, help="write the checkpoint every N epochs")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--log-every", type=int, default=1, help="print the loss every N epochs")
    parser.add_argument("--sleep", type=float, default=0.0,
                        help="seconds to pause after each epoch (to watch or interrupt a run)")
    parser.add_argument("--fail-at-epoch", type=int, default=None)
    parser.add_argument("--fail-rank", type=int, default=0)
    parser.add_argument("--fail-host", default=None)
    parser.add_argument("--stop-file", type=Path, default=None,
                        help="finish successfully after the epoch during which this file appears on rank 0's host")
    parser.add_argument("--hold-after-epoch", type=int, default=None,
                        help="after this epoch, wait until --hold-file appears on rank 0's host")
    parser.add_argument("--hold-file", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.checkpoint_dir is not None:
        args.checkpoint_dir = Path(os.path.expandvars(str(args.checkpoint_dir)))
    if (args.hold_after_epoch is None) != (args.hold_file is None):
        parser.error("--hold-after-epoch and --hold-file go together")
    if args.epochs < 1 or args.samples < 1 or args.batch_size < 1 or args.log_every < 1 or args.checkpoint_every < 1:
        parser.error("--epochs, --samples, --batch-size, --log-every and --checkpoint-every must be at least 1")
    return args


def make_data(samples: int, features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same synthetic regression set on every rank (fixed seed)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=gen)
    w = torch.randn(features, 1, generator=gen)
    v = torch.randn(features, 1, generator=gen) * 0.5
    y = torch.sin(x @ w) + x @ v + 0.05 * torch.randn(samples, 1, generator=gen)
    return x, y


def make_model(features: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, 1))


def broadcast_parameters(model: nn.Module) -> None:
    """Rank 0's weights on every rank (what ``DistributedDataParallel`` does when it is built)."""
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, src=0)


def average_gradients(params: list[torch.Tensor], world: int) -> None:
    """Every parameter's gradient averaged over the ranks, in one all-reduce of them all
    (``DistributedDataParallel``'s reduction, as one bucket)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


class MomentumSGD:
    """SGD with momentum, the update ``torch.optim.SGD(lr=..., momentum=...)`` makes (the first
    step's buffer is the gradient; then ``buf = momentum * buf + grad``; ``p -= lr * buf``)."""

    def __init__(self, params, lr: float, momentum: float) -> None:
        self.params = list(params)
        self.lr, self.momentum = lr, momentum
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            buf = self.buffers[i]
            if buf is None:
                buf = self.buffers[i] = p.grad.detach().clone()
            else:
                buf.mul_(self.momentum).add_(p.grad)
            p.add_(buf, alpha=-self.lr)

    def state_dict(self) -> dict[str, Any]:
        """In ``torch.optim.SGD``'s format: a checkpoint either of them wrote, the other reads."""
        return {"state": {i: {"momentum_buffer": b.clone()} for i, b in enumerate(self.buffers) if b is not None},
                "param_groups": [{"lr": self.lr, "momentum": self.momentum, "dampening": 0, "weight_decay": 0,
                                  "nesterov": False, "maximize": False, "params": list(range(len(self.params)))}]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        (group,) = state["param_groups"]
        if len(group["params"]) != len(self.params):
            raise ValueError(f"the checkpoint's optimizer has {len(group['params'])} parameters, "
                             f"the model {len(self.params)}")
        self.lr, self.momentum = group["lr"], group["momentum"]  # as torch.optim.SGD resumes: the saved ones
        buffers = [state["state"].get(i, {}).get("momentum_buffer") for i in range(len(self.params))]
        self.buffers = [None if b is None else b.clone() for b in buffers]


def save_checkpoint(directory: Path, model: nn.Module, optimizer: MomentumSGD,
                    epoch: int) -> None:
    """Write the checkpoint atomically: a reader sees the old one or the new one, never half."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / CHECKPOINT_NAME
    tmp = directory / f".{CHECKPOINT_NAME}.{os.getpid()}.tmp"
    state = {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    with open(tmp, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(directory: Path | None) -> dict[str, Any] | None:
    if directory is None:
        return None
    path = directory / CHECKPOINT_NAME
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def say(text: str, *, err: bool = False) -> None:
    """One whole line in one write: the ranks of a node share torchrun's stdout, and a line
    written in pieces (text, then newline) can be cut in two by another rank's line."""
    stream = sys.stderr if err else sys.stdout
    stream.flush()
    os.write(stream.fileno(), (text + "\n").encode("utf-8", "replace"))


def train(args: argparse.Namespace) -> int:
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.backend == "nccl":
        if not torch.cuda.is_available():
            say(f"rank {rank}: --backend nccl needs CUDA, and none is available", err=True)
            return 2
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    torch.set_num_threads(1)
    dist.init_process_group(backend=args.backend)
    say(f"rank {rank} of {world} (local rank {local_rank}) on {socket.gethostname()}, device {device}")
    try:
        return _train(args, rank, world, device)
    finally:
        if not Stop.requested:
            dist.destroy_process_group()


def _train(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> int:
    torch.manual_seed(args.seed)
    x, y = make_data(args.samples, args.features, args.seed)
    x, y = x[rank::world].to(device), y[rank::world].to(device)
    model = make_model(args.features, args.hidden).to(device)
    optimizer = MomentumSGD(model.parameters(), lr=args.lr, momentum=0.9)

    # Rank 0 reads the checkpoint and hands it to everyone: no shared file system needed.
    box: list[Any] = [load_checkpoint(args.checkpoint_dir) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    checkpoint = box[0]
    start = 1
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start = int(checkpoint["epoch"]) + 1
        say(f"rank {rank} resumed from epoch {checkpoint['epoch']}")
    broadcast_parameters(model)
    if rank == 0:
        say(f"training: world size {world}, {args.samples} samples, epochs {start}..{args.epochs}, "
            f"backend {args.backend}")

    loss_fn = nn.MSELoss(reduction="sum")
    ckpt = Checkpoints(args.checkpoint_dir if rank == 0 else None, args.checkpoint_every, start - 1)
    for epoch in range(start, args.epochs + 1):
        if args.fail_at_epoch == epoch and (
            (args.fail_host is None and args.fail_rank == rank)
            or (args.fail_host is not None and args.fail_host == os.environ.get("HETERO_GPU_HOST")
                and int(os.environ.get("LOCAL_RANK", "0")) == 0)
        ):
            say(f"rank {rank}: simulated crash at epoch {epoch}", err=True)
            os._exit(CRASH_EXIT_CODE)
        total = torch.zeros(3, device=device)
        for first in range(0, x.shape[0], args.batch_size):
            if stop_agreed(device):
                say(f"rank {rank}: SIGTERM received, stopping in epoch {epoch}", err=True)
                ckpt.on_signal(model, optimizer)
                return SIGTERM_EXIT_CODE
            xb, yb = x[first:first + args.batch_size], y[first:first + args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            (loss / xb.shape[0]).backward()
            average_gradients(optimizer.params, world)
            optimizer.step()
            total += torch.stack([loss.detach(), torch.tensor(float(xb.shape[0]), device=device),
                                  torch.tensor(0.0, device=device)])
        if rank == 0 and args.stop_file is not None and args.stop_file.exists():
            total[2] = 1.0  # summed over ranks with the loss: every rank learns it in the same step
        dist.all_reduce(total)
        mean = (total[0] / total[1]).item()
        if not math.isfinite(mean):  # the same all-reduced value on every rank: all stop together
            if rank == 0:
                say(f"loss is {mean} at epoch {epoch}: stopping (lower --lr, or check the data)", err=True)
            return NAN_EXIT_CODE
        if rank == 0:
            if epoch % args.log_every == 0 or epoch == args.epochs:
                say(f"epoch {epoch} loss {mean:.6f}")
            ckpt.after_epoch(model, optimizer, epoch)
        if total[2].item() > 0:
            if rank == 0:
                say(f"stop file {args.stop_file} found: finishing after epoch {epoch}")
            break
        if args.hold_after_epoch == epoch and not hold(args.hold_file, rank, epoch, device):
            say(f"rank {rank}: SIGTERM received, stopping while holding after epoch {epoch}", err=True)
            ckpt.on_signal(model, optimizer)
            return SIGTERM_EXIT_CODE
        if args.sleep > 0:
            deadline = time.monotonic() + args.sleep
            while not Stop.requested and time.monotonic() < deadline:
                time.sleep(min(0.05, args.sleep))
    if rank == 0:
        say("training done")
    return 0


def stop_agreed(device: torch.device) -> bool:
    """Whether any rank was asked to stop: one small all-reduce per step, so that every rank
    stops at the same step and none waits in a collective for a rank that already left."""
    flag = torch.tensor([float(Stop.requested)], device=device)
    dist.all_reduce(flag)
    return flag.item() > 0


class Checkpoints:
    """Rank 0's checkpoints (``directory`` None on the other ranks): every ``every`` epochs, and
    the last completed epoch on SIGTERM when it is not on disk yet."""

    def __init__(self, directory: Path | None, every: int, saved: int):
        self.directory, self.every, self.saved = directory, every, saved
        self.done: tuple[int, dict, dict] | None = None  # the last completed epoch's state, unsaved

    def after_epoch(self, model: nn.Module, optimizer: MomentumSGD, epoch: int) -> None:
        if self.directory is None:
            return
        if epoch % self.every == 0:
            save_checkpoint(self.directory, model, optimizer, epoch)
            self.saved, self.done = epoch, None
            say(f"checkpoint of epoch {epoch} saved")
        else:
            import copy

            self.done = (epoch, copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()))

    def on_signal(self, model: nn.Module, optimizer: MomentumSGD) -> None:
        if self.directory is None:
            return
        if self.done is not None:
            epoch, model_state, optimizer_state = self.done
            model.load_state_dict(model_state)
            optimizer.load_state_dict(optimizer_state)
            save_checkpoint(self.directory, model, optimizer, epoch)
            self.saved = epoch
            say(f"SIGTERM received: checkpoint of epoch {epoch} saved")
        elif self.saved > 0:
            say(f"SIGTERM received: checkpoint of epoch {self.saved} kept")


def hold(path: Path, rank: int, epoch: int, device: torch.device, poll: float = 0.1) -> bool:
    """Wait, on every rank, until ``path`` exists on rank 0's host: True then, False on SIGTERM.

    Every rank takes part in one small all-reduce per poll (the file seen by rank 0, a SIGTERM
    seen by any rank), so all of them leave the wait in the same step."""
    if rank == 0:
        say(f"holding after epoch {epoch} until {path} appears")
    while True:
        flags = torch.tensor([float(rank == 0 and path.exists()), float(Stop.requested)], device=device)
        dist.all_reduce(flags)
        if flags[1].item() > 0:
            return False
        if flags[0].item() > 0:
            return True
        time.sleep(poll)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    args = parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        say("train_tiny.py must be started by torchrun (RANK and WORLD_SIZE are not set)", err=True)
        return 2
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
