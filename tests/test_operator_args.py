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
    ],
)
def test_bad_arguments_fail_without_retry(changes, message):
    op = HeteroTrainOperator(**{**BASE, **changes})
    with pytest.raises(AirflowFailException) as err:
        op._validate()
        op._request()
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
    op._validate()
    assert op._request().to_json() == expected


def test_default_job_id_is_stable_and_valid():
    a = default_job_id("retrain llm", "train", "manual__2026-11-29T10:45:49.810561+00:00")
    assert a == default_job_id("retrain llm", "train", "manual__2026-11-29T10:45:49.810561+00:00")
    assert a != default_job_id("retrain llm", "train", "scheduled__2026-11-30T00:00:00+00:00")
    assert a.startswith("retrain_llm.train.") and len(a) <= 128
    long = default_job_id("d" * 300, "t" * 300, "r")
    assert len(long) <= 128
