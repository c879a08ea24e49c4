"""cluster.yaml: evaluation weights, thresholds and task-type rules (SPEC §3).

Validation goes through pydantic with unknown keys forbidden; every error becomes one
:class:`~airflow_hetero_gpu.errors.ConfigError` line naming the file and the dotted key.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, ValidationError, model_validator

from airflow_hetero_gpu.core.cardtype import card_type_matches
from airflow_hetero_gpu.errors import ConfigError



def _number(value: Any) -> Any:
    # YAML gives int or float; a string or a boolean is a mistake, not a number to coerce.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"input should be a number, got {value!r}")
    return value


Number = Annotated[float, BeforeValidator(_number)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Weights(_Strict):
    """The evaluation weights: the seed's w1, w2, w3 and w4 for the free-blocks term.

    Fragmentation is bad, so its weight is negative. The defaults differ from SPEC §3's
    (0.3, -0.2, 0.5) in w1 and add w4; docs/concepts.md and docs/simulation.md say why.
    """

    load_balance: Number = 0.1
    fragmentation: Number = -0.2
    topology: Number = 0.5
    free_blocks: Number = 0.2


class Thresholds(_Strict):
    busy_utilization: Number = Field(0.10, ge=0, le=1)
    full_utilization: Number = Field(0.90, ge=0, le=1)
    # The load assumed for a GPU whose utilization nvidia-smi cannot tell ([N/A]): 1 (busy),
    # so an unknown GPU is never taken for an idle one (docs/concepts.md).
    unknown_utilization: Number = Field(1.0, ge=0, le=1)
    max_temperature_c: Number = 90
    # SPEC §8: an evicted GPU comes back after this many consecutive healthy checks.
    readmit_after_healthy_checks: StrictInt = Field(3, ge=1)
    # The health watch (docs/health.md): consecutive bad checks before a soft fault
    # (temperature, hw-slowdown) evicts, and before an unreachable host's GPUs are evicted.
    soft_fault_checks: StrictInt = Field(3, ge=1)
    unreachable_checks: StrictInt = Field(2, ge=1)
    # Optional rules on fields older drivers lack (they never fire where the field is absent).
    check_row_remap: StrictBool = True
    check_hw_slowdown: StrictBool = True
    # A capture directory read without a ledger: an Xid line counts when logged within this
    # many seconds of the capture (readers with a ledger take Xids from its evictions instead).
    xid_window_s: Number = Field(3600, ge=0)
    # A GPU holding a compute process the scheduler did not start: "block" keeps it out of
    # every placement and claim ("in use outside the scheduler"), "ignore" places as if the
    # process were not there (sites that share GPUs on purpose). docs/concepts.md.
    foreign_processes: Literal["block", "ignore"] = "block"

    @model_validator(mode="after")
    def _ordered(self) -> "Thresholds":
        if self.full_utilization < self.busy_utilization:
            raise ValueError(
                f"full_utilization ({self.full_utilization}) must not be below busy_utilization ({self.busy_utilization})"
            )
        return self


class TaskTypes(_Strict):
    hosts: dict[str, list[str]] = Field(default_factory=dict)
    models: dict[str, list[str]] = Field(default_factory=dict)


class ClusterConfig(_Strict):
    """The whole of cluster.yaml. Every key is optional; the defaults are SPEC §3's."""

    weights: Weights = Field(default_factory=Weights)
    thresholds: Thresholds = Field(default_factory=Thresholds)
    task_types: TaskTypes = Field(default_factory=TaskTypes)

    def task_types_for(self, host: str, card_type: str) -> tuple[str, ...]:
        """The training-task types a GPU supports: first matching host glob, then card-type rule,
        else exactly one task type, its card type (SPEC §3)."""
        for pattern, types in self.task_types.hosts.items():
            if fnmatch.fnmatchcase(host, pattern):
                return tuple(sorted(set(types)))
        for model, types in self.task_types.models.items():
            if card_type_matches(card_type, model):
                return tuple(sorted(set(types)))
        return (card_type,)

    def with_weights(self, weights: Mapping[str, float] | None) -> "ClusterConfig":
        """A copy with some evaluation weights overridden (validated like cluster.yaml)."""
        if not weights:
            return self
        merged = self.weights.model_dump() | dict(weights)
        return config_from_mapping({**self.model_dump(), "weights": merged}, source="weights")


def _format_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "(top level)"
    kind = first["type"]
    if kind == "extra_forbidden":
        msg = "unknown key"
    elif kind == "value_error":
        msg = str(first.get("ctx", {}).get("error", first["msg"]))
    else:
        msg = f"{first['msg'].lower()}, got {first.get('input')!r}"
    more = len(err.errors()) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{source}: {key}: {msg}{tail}"


def config_from_mapping(data: Any, source: str = "cluster.yaml") -> ClusterConfig:
    """Validate a mapping (parsed YAML, operator arguments) into a :class:`ClusterConfig`."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of keys at the top level, got {type(data).__name__}")
    try:
        return ClusterConfig.model_validate(dict(data))
    except ValidationError as err:
        raise ConfigError(_format_error(err, source)) from None


def load_config(path: str | Path | None) -> ClusterConfig:
    """Read and validate cluster.yaml; ``None`` gives the defaults."""
    if path is None:
        return ClusterConfig()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read: {err}") from None
    return config_from_text(text, str(path))


def config_from_text(text: str, source: str = "cluster.yaml") -> ClusterConfig:
    """Parse and validate the text of a cluster.yaml; ``source`` names it in errors."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise ConfigError(f"{source}{where}: {problem}") from None
    return config_from_mapping(data, source=source)
