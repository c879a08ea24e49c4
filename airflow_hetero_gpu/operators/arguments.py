"""The training operator's arguments, read and checked once templates are rendered (in
``execute()``): the placement request, and a one-line, never-retried failure for each mistake."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from airflow.sdk.exceptions import AirflowFailException

from airflow_hetero_gpu.errors import HeteroGpuError

if TYPE_CHECKING:
    from airflow_hetero_gpu.core.model import PlanRequest

ON_NO_REPLACEMENT = ("fail", "wait")


def fail(message: str) -> AirflowFailException:
    """A setup mistake: one line, no retries."""
    return AirflowFailException(" ".join(message.split()))


def as_int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise fail(f"{name}: expected a positive integer, got {value!r}")
    try:
        number = int(str(value).strip()) if isinstance(value, str) else value
    except ValueError:
        raise fail(f"{name}: expected a positive integer, got {value!r}") from None
    if not isinstance(number, int):
        raise fail(f"{name}: expected a positive integer, got {value!r}")
    return number


def request_of(op: Any) -> "PlanRequest":
    """The operator's placement request (gpu_count, gpu_type, training_task_type, gpu_memory_mib)."""
    from airflow_hetero_gpu.core.model import PlanRequest

    count = as_int(op.gpu_count, "gpu_count")
    memory = None
    if op.gpu_memory_mib not in (None, ""):
        try:
            memory = float(op.gpu_memory_mib)
        except (TypeError, ValueError):
            raise fail(f"gpu_memory_mib: expected a number of MiB, got {op.gpu_memory_mib!r}") from None
        memory = int(memory) if memory.is_integer() else memory
    gpu_type = op.gpu_type
    if isinstance(gpu_type, (list, tuple)):
        gpu_type = tuple(gpu_type) if len(gpu_type) != 1 else gpu_type[0]
    if gpu_type == "":
        gpu_type = None
    try:
        return PlanRequest(count, gpu_type, op.training_task_type or None, memory)
    except HeteroGpuError as err:
        raise fail(str(err).replace("gpus:", "gpu_count:", 1)) from None


def validate(op: Any) -> None:
    """Every other argument's type and range."""
    if op.on_no_replacement not in ON_NO_REPLACEMENT:
        raise fail(f"on_no_replacement: expected 'fail' or 'wait', got {op.on_no_replacement!r}")
    if bool(op.script) == bool(op.command):
        raise fail("give either script (run under torchrun) or command (a full argv), not both or neither")
    for name in ("script_args", "command"):
        value = getattr(op, name)
        if value is not None and (isinstance(value, str) or not all(isinstance(v, str) for v in value)):
            raise fail(f"{name}: expected a list of strings, got {value!r}")
    if op.env is not None and not isinstance(op.env, Mapping):
        raise fail(f"env: expected a mapping of names to strings, got {op.env!r}")
    if isinstance(op.max_restarts, bool) or not isinstance(op.max_restarts, int) or op.max_restarts < 0:
        raise fail(f"max_restarts: expected a non-negative integer, got {op.max_restarts!r}")
    from airflow_hetero_gpu.durations import MAX_DURATION_S
    from airflow_hetero_gpu.ledger.checks import MAX_PRIORITY

    for name, least in (("lease_seconds", 3.0), ("host_timeout", 2.0)):
        value = getattr(op, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= least:
            raise fail(f"{name}: expected a number of seconds >= {least:g}, got {value!r}")
        if not value <= MAX_DURATION_S:
            raise fail(f"{name}: expected at most {MAX_DURATION_S:.0f} seconds (365 days), got {value!r}")
    if isinstance(op.priority, bool) or not isinstance(op.priority, int):
        raise fail(f"priority: expected an integer (higher first), got {op.priority!r}")
    if not -MAX_PRIORITY <= op.priority <= MAX_PRIORITY:
        raise fail(f"priority: expected an integer from {-MAX_PRIORITY} to {MAX_PRIORITY}, got {op.priority}")
    if op.weights is not None and not isinstance(op.weights, Mapping):
        raise fail(f"weights: expected a mapping like {{'topology': 0.6}}, got {op.weights!r}")
