"""What a health watch was asked to do (``WatchSpec``), JSON-able so it can travel to the triggerer."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from airflow_hetero_gpu.core.config import ClusterConfig, config_from_mapping
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.errors import HeteroGpuError

MODE_KINDS = ("gate", "watch")

#: Why a check ended the sensor (the ``reason`` of the XCom value).
GATE_MET = "gate met"
WATCH_OVER = "watch period over"
IDLE = "no live reservation"


@dataclass
class WatchSpec:
    """The sensor's decision arguments, JSON-able (they travel to the triggerer)."""

    mode_kind: str = "watch"
    min_healthy: int = 1
    gpu_type: str | list[str] | None = None
    task_type: str | None = None
    gpu_memory_mib: float | None = None
    job_ids: list[str] | None = None
    watch_duration: float | None = None  # seconds
    stop_when_idle: bool = True
    thresholds: dict[str, Any] | None = None
    sweep_orphans: bool = False

    def validate(self) -> "WatchSpec":
        if self.mode_kind not in MODE_KINDS:
            raise HeteroGpuError(f"mode_kind: expected 'gate' or 'watch', got {self.mode_kind!r}")
        if self.mode_kind == "gate":
            self.request()  # PlanRequest checks min_healthy, gpu_type, task_type, memory
        if self.watch_duration is not None:
            if (isinstance(self.watch_duration, bool) or not isinstance(self.watch_duration, (int, float))
                    or not math.isfinite(self.watch_duration) or self.watch_duration < 0):
                raise HeteroGpuError(f"watch_duration: expected seconds >= 0, got {self.watch_duration!r}")
        if self.job_ids is not None and (isinstance(self.job_ids, str)
                                         or not all(isinstance(j, str) and j for j in self.job_ids)):
            raise HeteroGpuError(f"job_ids: expected a list of job ids, got {self.job_ids!r}")
        if not isinstance(self.sweep_orphans, bool):
            raise HeteroGpuError(f"sweep_orphans: expected True or False, got {self.sweep_orphans!r}")
        if self.thresholds is not None:
            if not isinstance(self.thresholds, Mapping):
                raise HeteroGpuError(f"thresholds: expected a mapping of threshold overrides, got {self.thresholds!r}")
            merged_config(ClusterConfig(), self.thresholds)
        return self

    def request(self) -> PlanRequest:
        try:
            return PlanRequest(gpus=self.min_healthy, gpu_type=self.gpu_type, task_type=self.task_type,
                               gpu_memory_mib=self.gpu_memory_mib)
        except HeteroGpuError as err:
            raise HeteroGpuError(str(err).replace("gpus:", "min_healthy:", 1)) from None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "WatchSpec":
        return cls(**dict(data)).validate()


def merged_config(config: ClusterConfig, thresholds: Mapping[str, Any] | None) -> ClusterConfig:
    """``config`` with some thresholds overridden (validated like cluster.yaml)."""
    if not thresholds:
        return config
    data = config.model_dump()
    data["thresholds"] = {**data["thresholds"], **dict(thresholds)}
    return config_from_mapping(data, source="thresholds")
