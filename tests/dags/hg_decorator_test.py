"""A DAG for @task.hetero_train's failure tests: the function fails on one rank, or imports a
module the hosts lack. Everything test-specific comes from HG_TEST_CONFIG (JSON), read when the
file is parsed (it parses with none set)."""

from __future__ import annotations

import json
import os
import sys

import pendulum
from airflow.sdk import dag, task

CFG = json.loads(os.environ.get("HG_TEST_CONFIG", "{}"))


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False, tags=["test"])
def hg_decorator_test():
    @task
    def settings() -> dict:
        return {"mode": CFG.get("mode", "fail"), "fail_host": CFG.get("fail_host", "node02")}

    @task.hetero_train(
        gpu_count=CFG.get("gpu_count", 4),
        ssh_conn_ids=CFG.get("ssh_conn_ids", []),
        captures_dir=CFG.get("captures_dir"),
        ledger_url=CFG.get("ledger_url"),
        workdir=CFG.get("workdir"),
        launcher=CFG.get("launcher", [sys.executable, "-m", "torch.distributed.run"]),
        env={"OMP_NUM_THREADS": "1"},
        lease_seconds=30,
        retries=0,
    )
    def train(mode: str, fail_host: str):
        import os
        import time

        if mode == "import":
            import hetero_gpu_module_the_hosts_lack  # noqa: F401
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        dist.barrier()
        if mode == "fail" and os.environ["HETERO_GPU_HOST"] == fail_host and os.environ["LOCAL_RANK"] == "1":
            raise ValueError(f"loss diverged at global rank {rank}")
        time.sleep(600)  # the other ranks wait, out of any collective, until the job is stopped

    s = settings()
    train(s["mode"], s["fail_host"])


hg_decorator_test()
