"""@task.hetero_train as a DAG author meets it: registered with Airflow's task decorators, the
operator's arguments, what it refuses when the DAG file is parsed, and the function's arguments
as the task assembles them (a mistake there fails the task without retries)."""

from __future__ import annotations

import threading

import pendulum
import pytest
from airflow.sdk import dag, task
from airflow.sdk.definitions.xcom_arg import XComArg
from airflow.sdk.exceptions import AirflowFailException

from airflow_hetero_gpu.decorators.hetero_train import HeteroTrainDecoratedOperator, hetero_train_task
from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator


def build(**decorator_args):
    """A DAG with an upstream task feeding the decorated function; (dag, train task)."""

    @dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1))
    def d():
        @task
        def lr() -> float:
            return 0.1

        @task.hetero_train(gpu_count=2, **decorator_args)
        def train(lr: float, epochs: int, run_id=None, checkpoint_dir=None):
            return {"lr": lr}

        train(lr(), epochs=3)

    made = d()
    return made, made.get_task("train")


def test_task_hetero_train_is_the_providers_decorator():
    assert task.hetero_train is hetero_train_task
    _, op = build()
    assert isinstance(op, HeteroTrainDecoratedOperator) and isinstance(op, HeteroTrainOperator)
    assert isinstance(op.op_args[0], XComArg) and op.op_kwargs == {"epochs": 3}
    assert op.upstream_task_ids == {"lr"}


def test_templated_fields_are_the_operators_and_the_functions_arguments():
    _, op = build(checkpoint_dir="/ckpt/{{ run_id }}")
    fields = set(op.template_fields)
    assert {"op_args", "op_kwargs", "checkpoint_dir", "gpu_count", "gpu_type", "env", "job_id"} <= fields
    assert not fields & {"script", "script_args", "command"}
    assert op.checkpoint_dir == "/ckpt/{{ run_id }}"


@pytest.mark.parametrize("argument", ["script", "script_args", "command"])
def test_what_to_run_is_the_function(argument):
    with pytest.raises(TypeError, match=f"runs the decorated function under torchrun; it takes no {argument} argument"):
        build(**{argument: ["x"]})


def test_an_async_function_is_refused_when_parsed():
    with pytest.raises(TypeError, match="'train' is async; give a plain def function"):
        @dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1))
        def d():
            @task.hetero_train(gpu_count=1)
            async def train():
                return 1

            train()

        d()


def test_the_functions_arguments_as_the_task_assembles_them():
    _, op = build(checkpoint_dir="/ckpt/run-1")
    op.op_args = [0.25]  # as rendered: the upstream XCom resolved
    args, kwargs = op._function_arguments({"run_id": "manual__1", "ti": object()})
    # the context values its signature names, checkpoint_dir as rendered; nothing else of the context
    assert (args, kwargs) == ([0.25], {"epochs": 3, "run_id": "manual__1", "checkpoint_dir": "/ckpt/run-1"})


def test_an_argument_that_cannot_travel_fails_the_task_without_retries():
    _, op = build()
    op.op_args = [threading.Lock()]
    with pytest.raises(AirflowFailException) as err:
        op._prepare({"run_id": "r"})
    assert str(err.value).startswith("@task.hetero_train: positional argument 0 of 'train' cannot travel to the hosts")


def test_a_function_that_uses_its_dag_files_globals_fails_the_task_without_retries():
    @dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1))
    def d():
        @task.hetero_train(gpu_count=1)
        def train():
            return pendulum.now().isoformat()     # pendulum is this file's import

        train()

    op = d().get_task("train")
    with pytest.raises(AirflowFailException, match="uses pendulum from its DAG file"):
        op._prepare({})
