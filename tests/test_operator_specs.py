"""The training operator's specs: every argument belongs to one, each is built from the
operator's (rendered) arguments, and a bad value is refused in one line naming its argument."""

from __future__ import annotations

import inspect

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator
from airflow_hetero_gpu.operators.specs import FleetSpec, LifecycleSpec, ProgramSpec, RequestSpec, Specs

BASE = {"task_id": "t", "gpu_count": 2, "script": "train.py", "ssh_conn_ids": ["a"]}
SPECS = {"request": RequestSpec, "fleet": FleetSpec, "program": ProgramSpec, "lifecycle": LifecycleSpec}
#: the arguments no spec takes: the operator's own (its default needs the task instance)
OPERATORS_OWN = {"job_id"}


def _defaults() -> dict:
    """The operator's arguments with their defaults, and BASE's."""
    parameters = inspect.signature(HeteroTrainOperator.__init__).parameters
    out = {n: p.default for n, p in parameters.items() if p.kind is p.KEYWORD_ONLY}
    return {**out, **{k: v for k, v in BASE.items() if k != "task_id"}}


def test_every_argument_belongs_to_exactly_one_spec():
    parameters = [n for n, p in inspect.signature(HeteroTrainOperator.__init__).parameters.items()
                  if p.kind is p.KEYWORD_ONLY]
    owners = {name: [key for key, spec in SPECS.items() if name in spec.ARGUMENTS] for name in parameters}
    assert {n: o for n, o in owners.items() if len(o) != (0 if n in OPERATORS_OWN else 1)} == {}
    assert sorted(Specs.ARGUMENTS) == sorted(set(parameters) - OPERATORS_OWN)


@pytest.mark.parametrize("arguments, spec, expected", [
    ({"gpu_count": "4", "gpu_type": ["A100*"], "gpu_memory_mib": "40000", "priority": 5, "team": "vision",
      "weights": {"topology": 0.6}}, "request",
     {"priority": 5, "team": "vision", "preemptible": True, "weights": {"topology": 0.6}}),
    ({"ssh_conn_ids": {"node01": "c1"}, "inventory_max_age": "30", "cluster_config": {"weights": {"topology": 1}},
      "ledger_url": "sqlite:////tmp/l.db"}, "fleet",
     {"ssh_conn_ids": {"node01": "c1"}, "inventory_max_age": 30.0, "cluster_config": {"weights": {"topology": 1}},
      "ledger_url": "sqlite:////tmp/l.db", "ledger_conn_id": None}),
    ({"script_args": ["--epochs", "3"], "launcher": ["python3", "-m", "torch.distributed.run"], "rdzv_port": 29555,
      "checkpoint_dir": "ckpt", "checkpoint_storage": "host", "workdir": "/srv"}, "program",
     {"script": "train.py", "script_args": ("--epochs", "3"), "command": None,
      "launcher": ("python3", "-m", "torch.distributed.run"), "rdzv_port": 29555, "checkpoint_storage": "host"}),
    ({"command": ["python", "x.py"], "script": None, "env": {"A": "1"}}, "program",
     {"script": None, "command": ("python", "x.py"), "env": {"A": "1"}}),
    ({}, "lifecycle", {"lease_seconds": 900 + 300 + 15, "durable": True, "unattended_timeout": 900.0,
                       "preemption_signal": "TERM", "preemption_grace": 300.0, "host_timeout": 60.0,
                       "capacity_timeout": 3600.0, "max_restarts": 3, "on_no_replacement": "fail"}),
    ({"durable": False, "preemption_signal": 10, "capacity_poll_interval": "5", "wait_for_capacity": True,
      "deferrable": True}, "lifecycle",
     {"lease_seconds": 120.0, "durable": False, "preemption_signal": "USR1", "capacity_poll_interval": 5.0,
      "queue_poll_interval": 5.0, "wait_for_capacity": True, "deferrable": True}),
])
def test_each_spec_is_built_from_the_operators_arguments(arguments, spec, expected):
    op = HeteroTrainOperator(**{**BASE, **arguments})
    built = getattr(op._validate(), spec)
    assert isinstance(built, SPECS[spec])
    assert {key: getattr(built, key) for key in expected} == expected
    assert SPECS[spec].build({**_defaults(), **arguments}) == built  # the same from the arguments alone


def test_the_request_spec_holds_the_placement_request():
    op = HeteroTrainOperator(**{**BASE, "gpu_count": "4"}, gpu_type=["A100*", "H200"], task_type="llm")
    spec = op.specs.request
    assert spec.plan.to_json() == {"gpus": 4, "gpu_type": ["A100*", "H200"], "task_type": "llm",
                                   "gpu_memory_mib": None}


def test_the_program_spec_makes_the_launch_and_the_carried_directory():
    program = HeteroTrainOperator(**BASE, script_args=["--lr", "0.1"], checkpoint_dir="ckpt", workdir="/srv",
                                  checkpoint_storage="host", env={"A": "1"}).specs.program
    launch = program.launch_spec("j1")
    assert launch.program.script == "train.py" and launch.program.args == ("--lr", "0.1", "--checkpoint-dir", "ckpt")
    assert launch.env == {"A": "1"} and launch.workdir == "/srv"
    assert program.carried_checkpoint_dir() == "/srv/ckpt"
    assert HeteroTrainOperator(**BASE, checkpoint_dir="ckpt").specs.program.carried_checkpoint_dir() is None


@pytest.mark.parametrize("changes, message", [
    ({"gpu_count": "two"}, "gpu_count: expected a positive integer, got 'two'"),
    ({"weights": [0.5]}, "weights: expected a mapping like {'topology': 0.6}, got [0.5]"),
    ({"preemptible": 1}, "preemptible: expected True or False, got 1"),
    ({"inventory_max_age": -1}, "inventory_max_age: expected seconds >= 0, got -1"),
    ({"ledger_conn_id": "l", "ledger_url": "sqlite://"}, "give ledger_conn_id or ledger_url, not both"),
    ({"command": "python x.py", "script": None}, "command: expected a list of strings, got 'python x.py'"),
    ({"checkpoint_storage": "nfs"}, "checkpoint_storage: expected 'shared' or 'host', got 'nfs'"),
    ({"capacity_timeout": "an hour"}, "capacity_timeout: expected a number of seconds, got 'an hour'"),
    ({"capacity_poll_interval": None}, "capacity_poll_interval: expected a number of seconds, got None"),
    ({"max_restarts": 1.5}, "max_restarts: expected a non-negative integer, got 1.5"),
    ({"preemption_signal": "STOP"}, "preemption_signal: expected a signal the job can catch, such as 'SIGTERM' or "
                                    "'SIGUSR1', got 'STOP'"),
    ({"durable": None}, "durable: expected True or False, got None"),
])
def test_a_bad_value_is_refused_in_one_line_naming_its_argument(changes, message):
    with pytest.raises(AirflowFailException) as err:
        HeteroTrainOperator(**{**BASE, **changes})._validate()
    assert str(err.value) == message and "\n" not in message


def test_the_specs_are_built_from_the_rendered_arguments():
    """Templates render after __init__: the specs come from what execute() sees, and a spec
    built before rendering is built again."""
    op = HeteroTrainOperator(**BASE, team="{{ params.team }}", script_args=["--epochs", "{{ params.epochs }}"],
                             env={"RUN": "{{ run_id }}"})
    assert op.specs.request.team == "{{ params.team }}"  # before rendering: the template itself
    op.render_template_fields({"params": {"team": "vision", "epochs": 3}, "run_id": "r1"})
    specs = op._validate()  # what execute() does first
    assert specs.request.team == "vision" and op.specs is specs
    assert specs.program.script_args == ("--epochs", "3") and specs.program.env == {"RUN": "r1"}
    assert op.team == "vision" and op.script_args == ["--epochs", "3"]  # the attributes: rendered, as before
    op = HeteroTrainOperator(**{**BASE, "gpu_count": "{{ params.k }}"})
    with pytest.raises(AirflowFailException, match=r"gpu_count: expected a positive integer, got '\{\{ params.k \}\}'"):
        op.specs
    op.render_template_fields({"params": {"k": 4}})
    assert op._validate().request.plan.gpus == 4
