"""Training as a TaskFlow function: ``@task.hetero_train`` runs it on every rank.

hyperparameters (@task) -> train (@task.hetero_train: the planner's GPUs, torchrun on each host)
-> report (@task: rank 0's return value)

The function travels to the hosts as source with its arguments; it imports what it needs
(torch) itself, on the hosts' own Python. It trains a small regression model with
DistributedDataParallel (NCCL on GPUs, gloo on CPU), keeps a checkpoint in ``checkpoint_dir``
on rank 0's host (rank 0 loads it after a restart and DDP hands the weights to every rank, so
no shared file system is needed) and returns the losses; rank 0's value is the task's XCom.
Preempted (docs/preemption.md), it gets SIGTERM: every rank stops after the epoch it is in, its
checkpoint on disk, and the task relaunches it later with the same arguments, resuming there.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, task

from _common import CHECKPOINT_ROOT


@dag(
    dag_id="hetero_gpu_train_decorated",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["hetero-gpu", "training", "taskflow"],
    params={
        "gpu_count": Param(4, type="integer", minimum=1, maximum=64, description="GPUs for the job"),
        "epochs": Param(20, type="integer", minimum=1, maximum=100000),
        "lr": Param(0.05, type="number", exclusiveMinimum=0, maximum=10),
    },
    doc_md=__doc__,
)
def hetero_gpu_train_decorated():
    @task
    def hyperparameters(params: dict | None = None) -> dict:
        """What a tuning step would choose; here, the run's params."""
        return {"lr": float(params["lr"]), "epochs": int(params["epochs"])}

    @task.hetero_train(
        gpu_count="{{ params.gpu_count }}",
        checkpoint_dir=CHECKPOINT_ROOT + "/{{ dag.dag_id }}/{{ run_id | replace(':', '_') | replace('+', '_') }}",
        env={"OMP_NUM_THREADS": "1"},
        wait_for_capacity=True,
        capacity_timeout=4 * 3600,
        on_no_replacement="wait",
    )
    def train(lr: float, epochs: int, checkpoint_dir: str | None = None):
        """Runs on every rank; rank 0's return value is the task's."""
        import os
        import signal
        import sys

        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        stop = [False]  # SIGTERM (preemption, or the task being killed): stop after this epoch
        signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
        gpu = torch.cuda.is_available()
        dist.init_process_group("nccl" if gpu else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if gpu else torch.device("cpu")
        if gpu:
            torch.cuda.set_device(device)

        # a fixed synthetic regression set; each rank trains on its own shard
        data = torch.Generator().manual_seed(1234)
        x = torch.randn(1024, 16, generator=data)
        y = x @ torch.randn(16, 1, generator=data) + 0.1 * torch.randn(1024, 1, generator=data)
        x, y = x[rank::world].to(device), y[rank::world].to(device)

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        path = os.path.join(checkpoint_dir, "checkpoint.pt") if checkpoint_dir else None
        start = [0]
        if rank == 0 and path and os.path.exists(path):
            state = torch.load(path)
            model.load_state_dict(state["model"])
            start = [state["epoch"]]
            print(f"resumed from epoch {start[0]}", flush=True)
        dist.broadcast_object_list(start, src=0)
        model = DistributedDataParallel(model.to(device))  # rank 0's weights go to every rank
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)

        losses = []
        for epoch in range(start[0] + 1, epochs + 1):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(round(mean.item() / world, 6))
            if rank == 0:
                print(f"epoch {epoch} loss {losses[-1]}", flush=True)
                if path:
                    os.makedirs(checkpoint_dir, exist_ok=True)
                    torch.save({"model": model.module.state_dict(), "epoch": epoch}, path + ".tmp")
                    os.replace(path + ".tmp", path)
                    print(f"checkpoint of epoch {epoch} saved", flush=True)
            flag = torch.tensor([float(stop[0])], device=device)
            dist.all_reduce(flag)  # every rank stops at the same epoch
            if flag.item() > 0:
                if rank == 0:
                    print(f"SIGTERM received: checkpoint of epoch {epoch} kept", flush=True)
                sys.exit(143)
        hosts = [None] * world
        dist.all_gather_object(hosts, os.environ.get("HETERO_GPU_HOST"))
        dist.destroy_process_group()
        return {"rank": rank, "world_size": world, "hosts": sorted(set(hosts)), "lr": lr,
                "epochs": epochs, "losses": losses}

    @task
    def report(result: dict) -> dict:
        """What an evaluation step would start from."""
        losses = result["losses"]
        print(f"trained on {result['world_size']} rank(s) on {', '.join(result['hosts'])}: "
              f"loss {losses[0] if losses else float('nan'):.4f} -> {losses[-1] if losses else float('nan'):.4f}")
        return {"final_loss": losses[-1] if losses else None, "hosts": result["hosts"]}

    hp = hyperparameters()
    report(train(hp["lr"], hp["epochs"]))


hetero_gpu_train_decorated()
