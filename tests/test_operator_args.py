"""HeteroTrainOperator argument checks: a user mistake fails the task at once (no retry) with
one line naming the argument."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator, default_job_id

BASE = {"task_id": "t", "gpu_count": 2, "script": "train.py", "ssh_conn_ids": ["a"]}


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"gpu_count": 0}, "gpu_count: must be at least 1, got 0"),
        ({"gpu_count": "two"}, "gpu_count: expected a positive integer, got 'two'"),
        ({"gpu_count": True}, "gpu_count: expected a positive integer, got True"),
        ({"gpu_memory_mib": "lots"}, "gpu_memory_mib: expected a number of MiB, got 'lots'"),
        ({"gpu_memory_mib": -5}, "gpu_memory_mib: must not be negative, got -5"),
        ({"on_no_replacement": "retry"}, "on_no_replacement: expected 'fail' or 'wait', got 'retry'"),
        ({"script": None}, "give either script (run under torchrun) or command (a full argv), not both or neither"),
        ({"command": ["python", "x.py"]}, "give either script (run under torchrun) or command (a full argv), not both or neither"),
        ({"script_args": "--epochs 3"}, "script_args: expected a list of strings, got '--epochs 3'"),
        ({"max_restarts": -1}, "max_restarts: expected a non-negative integer, got -1"),
        ({"env": ["A=1"]}, "env: expected a mapping of names to strings, got ['A=1']"),
        ({"lease_seconds": 1}, "lease_seconds: expected a number of seconds >= 3, got 1"),
        ({"lease_seconds": "long"}, "lease_seconds: expected a number of seconds >= 3, got 'long'"),
        ({"host_timeout": 0}, "host_timeout: expected a number of seconds >= 2, got 0"),
        ({"host_timeout": float("nan")}, "host_timeout: expected a number of seconds >= 2, got nan"),
        ({"priority": "high"}, "priority: expected an integer (higher first), got 'high'"),
        ({"priority": 1.5}, "priority: expected an integer (higher first), got 1.5"),
        ({"priority": True}, "priority: expected an integer (higher first), got True"),
        ({"priority": 10 ** 30}, "priority: expected an integer from -1000000 to 1000000, got " + str(10 ** 30)),
        ({"lease_seconds": float("inf")}, "lease_seconds: expected at most 31536000 seconds (365 days), got inf"),
        ({"host_timeout": 1e300}, "host_timeout: expected at most 31536000 seconds (365 days), got 1e+300"),
        ({"preemption_grace": float("inf")}, "preemption_grace: expected at most 86400 seconds (a day), got inf"),
        ({"preemptible": "no"}, "preemptible: expected True or False, got 'no'"),
        ({"preemption_signal": "SIGNOPE"}, "preemption_signal: expected a signal the job can catch, such as "
                                           "'SIGTERM' or 'SIGUSR1', got 'SIGNOPE'"),
        ({"preemption_signal": "KILL"}, "preemption_signal: expected a signal the job can catch, such as "
                                        "'SIGTERM' or 'SIGUSR1', got 'KILL'"),
        ({"preemption_grace": -1}, "preemption_grace: expected a number of seconds >= 0, got -1"),
        ({"checkpoint_storage": "nfs"}, "checkpoint_storage: expected 'shared' or 'host', got 'nfs'"),
        ({"checkpoint_storage": "host"}, "checkpoint_storage='host' needs checkpoint_dir (the directory to carry "
                                         "between hosts)"),
    ],
)
def test_bad_arguments_fail_without_retry(changes, message):
    op = HeteroTrainOperator(**{**BASE, **changes})
    with pytest.raises(AirflowFailException) as err:
        op._validate()
    assert str(err.value) == message


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"gpu_count": "4", "gpu_type": ["A100-SXM4-80GB"], "gpu_memory_mib": "40000"},
         {"gpus": 4, "gpu_type": "A100-SXM4-80GB", "task_type": None, "gpu_memory_mib": 40000}),
        ({"gpu_count": 8, "gpu_type": ["A100*", "H200"], "task_type": "llm"},
         {"gpus": 8, "gpu_type": ["A100*", "H200"], "task_type": "llm", "gpu_memory_mib": None}),
        ({"gpu_count": "1", "gpu_type": "", "task_type": ""},
         {"gpus": 1, "gpu_type": None, "task_type": None, "gpu_memory_mib": None}),
    ],
)
def test_rendered_strings_become_a_request(kwargs, expected):
    op = HeteroTrainOperator(**{**BASE, **kwargs})
    assert op._validate().request.plan.to_json() == expected


def test_default_job_id_is_stable_and_valid():
    a = default_job_id("retrain llm", "train", "manual__2026-11-29T10:45:49.810561+00:00")
    assert a == default_job_id("retrain llm", "train", "manual__2026-11-29T10:45:49.810561+00:00")
    assert a != default_job_id("retrain llm", "train", "scheduled__2026-11-30T00:00:00+00:00")
    assert a.startswith("retrain_llm.train.") and len(a) <= 128
    long = default_job_id("d" * 300, "t" * 300, "r")
    assert len(long) <= 128


def test_inventory_max_age_is_checked():
    op = HeteroTrainOperator(**BASE, inventory_max_age="soon")
    with pytest.raises(AirflowFailException, match=r"inventory_max_age: expected seconds >= 0, got 'soon'"):
        op.max_age()
    assert HeteroTrainOperator(**BASE, inventory_max_age=0).max_age() == 0
    assert HeteroTrainOperator(**BASE).max_age() == 300


def test_deferrable_follows_airflows_default_deferrable():
    """As Airflow's own operators: ``[operators] default_deferrable`` is the default."""
    import subprocess
    import sys

    code = ("from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator as O;"
            "print(O(task_id='t', gpu_count=1, script='s.py').deferrable,"
            "      O(task_id='u', gpu_count=1, script='s.py', deferrable=False).deferrable)")
    for value, expected in (("True", "True False"), ("False", "False False")):
        env = {**__import__("os").environ, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert out.stdout.strip().splitlines()[-1] == expected, out.stderr[-2000:]


def test_rdzv_host_is_the_rendezvous_address_the_hosts_get():
    """A management network or a bastion: the other hosts reach the rendezvous at rdzv_host."""
    from airflow_hetero_gpu.collect.targets import SshTarget
    from airflow_hetero_gpu.launch.command import LaunchSpec, Torchrun
    from airflow_hetero_gpu.launch.remote import torchrun_job
    from airflow_hetero_gpu.operators.run_loop import RunSettings

    op = HeteroTrainOperator(**BASE, rdzv_host="10.1.0.7", rdzv_port=29555)
    assert "rdzv_host" in HeteroTrainOperator.template_fields and op.rdzv_host == "10.1.0.7"
    settings = RunSettings(LaunchSpec("j1", Torchrun("train.py")), rdzv_port=op.rdzv_port, rdzv_host=op.rdzv_host)
    placements = [(SshTarget("a", "192.0.2.1"), (0,)), (SshTarget("b", "192.0.2.2"), (0,))]
    job = torchrun_job(settings.spec, placements, lambda t: None, rdzv_port=settings.rdzv_port,
                       rdzv_address=settings.rdzv_host)
    assert all("--rdzv-endpoint 10.1.0.7:29555" in w.command for w in job.workers)
    job = torchrun_job(settings.spec, placements, lambda t: None, rdzv_port=29555)
    assert all("--rdzv-endpoint 192.0.2.1:29555" in w.command for w in job.workers)


def test_the_default_sqlite_ledger_is_refused_under_a_distributed_executor(monkeypatch, caplog):
    from airflow_hetero_gpu.hooks.ledger import UnshareableLedger, check_shareable

    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    with pytest.raises(UnshareableLedger, match=r"default SQLite file .* cannot share, and \[core\] executor is "
                                                r"CeleryExecutor: set \[hetero_gpu\] ledger_conn_id or ledger_url"):
        check_shareable(None)
    with caplog.at_level("WARNING"):
        check_shareable("sqlite:////var/lib/ledger.db")  # given on purpose: a warning
    assert "only safe when every task that reserves GPUs runs on this one machine" in caplog.text
    check_shareable("postgresql://db/ledger")
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    check_shareable(None)  # one machine: the default file is right
    # the operator fails at once (no retry) instead of reserving in a ledger no other worker sees
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "KubernetesExecutor")
    op = HeteroTrainOperator(**BASE)
    with pytest.raises(AirflowFailException, match="cannot share"):
        op.ledger


def test_preemption_signal_names_and_numbers():
    from airflow_hetero_gpu.operators.specs import signal_name

    assert [signal_name(v) for v in ("SIGTERM", "term", "USR1", 15, "SIGNOPE", True)] == [
        "TERM", "TERM", "USR1", "TERM", None, None]
