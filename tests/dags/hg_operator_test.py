"""DAGs for the operator's end-to-end tests. Everything test-specific comes from HG_TEST_* env
variables, read at run time (the file imports cleanly with none of them set)."""

from __future__ import annotations

import json
import os
import sys

import pendulum
from airflow.sdk import dag, task

from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator


def _cfg(name: str, default: str = "") -> str:
    return os.environ.get(f"HG_TEST_{name}", default)


def _train(task_id: str, **overrides) -> HeteroTrainOperator:
    cfg = json.loads(_cfg("CONFIG", "{}"))
    args = dict(
        task_id=task_id,
        gpu_count=cfg.get("gpu_count", 4),
        gpu_type=cfg.get("gpu_type"),
        script=None if "command" in cfg else cfg.get("script", "train_tiny.py"),
        command=cfg.get("command"),
        script_args=cfg.get("script_args", []),
        env={"OMP_NUM_THREADS": "1", **cfg.get("env", {})},
        workdir=cfg.get("workdir"),
        ssh_conn_ids=cfg.get("ssh_conn_ids", []),
        captures_dir=cfg.get("captures_dir"),
        ledger_url=cfg.get("ledger_url"),
        launcher=cfg.get("launcher", [sys.executable, "-m", "torch.distributed.run"]),
        checkpoint_dir=cfg.get("checkpoint_dir"),
        lease_seconds=cfg.get("lease_seconds", 30),
        host_timeout=cfg.get("host_timeout", 60),
        # the tests of the plain path keep their short leases; a test of the durable path says so
        durable=cfg.get("durable", False),
        unattended_timeout=cfg.get("unattended_timeout", 900),
        wait_for_capacity=cfg.get("wait_for_capacity", False),
        deferrable=cfg.get("deferrable", False),
        capacity_poll_interval=cfg.get("capacity_poll_interval", 2),
        capacity_timeout=cfg.get("capacity_timeout", 300),
        on_no_replacement=cfg.get("on_no_replacement", "fail"),
        job_id=cfg.get("job_id"),
        inventory_max_age=cfg.get("inventory_max_age"),
        rdzv_host=cfg.get("rdzv_host"),
        **({"team": cfg["team"]} if "team" in cfg else {}),
        retries=0,
        **{k: cfg[k] for k in ("priority", "preemptible", "preemption_signal", "preemption_grace",
                               "checkpoint_storage") if k in cfg},
    )
    args.update(overrides)
    return HeteroTrainOperator(**args)


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False, tags=["test"])
def hg_train_test():
    train = _train("train")

    @task
    def evaluate(decision: dict, ti=None) -> dict:
        out = _cfg("OUT")
        if out:
            with open(out, "w") as fh:
                json.dump(decision, fh)
            with open(out + ".xcom", "w") as fh:  # the plan the operator pushed under the key "decision"
                json.dump(ti.xcom_pull(task_ids="train", key="decision"), fh)
        return {"pool": decision["pool"], "hosts": decision["hosts"]}

    evaluate(train.output)


hg_train_test()


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False, tags=["test"])
def hg_command_test():
    """The operator in command mode; HG_TEST_COMMAND_CONFIG overrides HG_TEST_CONFIG's arguments."""
    _train("run", **json.loads(_cfg("COMMAND_CONFIG", "{}")))


hg_command_test()


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False, tags=["test"])
def hg_retry_test():
    """The training task with a retry; HG_TEST_RETRY_CONFIG overrides HG_TEST_CONFIG's arguments."""
    import datetime

    overrides = json.loads(_cfg("RETRY_CONFIG", "{}"))
    _train("train", retries=1, retry_delay=datetime.timedelta(seconds=overrides.pop("retry_delay_s", 1)),
           **overrides)


hg_retry_test()


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False, tags=["test"])
def hg_durable_test():
    """The training task, durable, with a retry (``retries`` in HG_TEST_DURABLE_CONFIG: more);
    HG_TEST_DURABLE_CONFIG overrides HG_TEST_CONFIG's arguments."""
    import datetime

    overrides = json.loads(_cfg("DURABLE_CONFIG", "{}"))
    _train("train", retries=overrides.pop("retries", 1),
           retry_delay=datetime.timedelta(seconds=overrides.pop("retry_delay_s", 1)), **overrides)


hg_durable_test()


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False, tags=["test"])
def hg_durable_deferred_test():
    """hg_durable_test with its run phase deferred (``deferrable=True``), beside it in one deployment."""
    import datetime

    overrides = json.loads(_cfg("DURABLE_CONFIG", "{}"))
    overrides["deferrable"] = True
    _train("train", retries=overrides.pop("retries", 1),
           retry_delay=datetime.timedelta(seconds=overrides.pop("retry_delay_s", 1)), **overrides)


hg_durable_deferred_test()
