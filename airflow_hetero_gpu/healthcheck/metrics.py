"""The health watch's metrics through Airflow's Stats (and a silent stand-in outside Airflow)."""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

METRIC_PREFIX = "hetero_gpu"

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _stat_part(text: str) -> str:
    """A pool id or reason as one part of a StatsD name (dots and unsafe characters -> ``_``)."""
    return _UNSAFE.sub("_", text.replace(".", "_")).strip("_")[:120] or "unknown"


def job_tags(team: str | None) -> dict[str, str]:
    """The tags of an event of a running job (a replacement): its reservation's team, the fleet
    team, as both ``team_name`` and ``fleet_team`` (the watch does not know the task's Airflow
    team; docs/operations.md#metrics); none for a reservation without a team."""
    return {"team_name": team, "fleet_team": team} if team else {}


class Metrics:
    """Airflow's Stats: gauges per pool, counters of events. Each metric is emitted once with tags
    (``pool``, ``host``, ``reason``) for tagging backends, and once with the pool in its name
    (``hetero_gpu.pool.<pool>.healthy_gpus``) for plain StatsD."""

    def __init__(self, stats: Any = None):
        self._stats = stats

    @property
    def stats(self) -> Any:
        if self._stats is None:
            try:
                from airflow.sdk.observability import stats  # noqa: PLC0415
            except ImportError:  # pragma: no cover - older Airflow
                from airflow.stats import Stats as stats  # type: ignore[no-redef]  # noqa: PLC0415,N813
            self._stats = stats
        return self._stats

    def pools(self, counts: Sequence[Mapping[str, Any]]) -> None:
        for pool in counts:
            part = _stat_part(pool["pool"])
            for what in ("healthy", "evicted", "available"):
                value = float(pool[what])
                self.stats.gauge(f"{METRIC_PREFIX}.pool.{what}_gpus", value, tags={"pool": pool["pool"]})
                self.stats.gauge(f"{METRIC_PREFIX}.pool.{part}.{what}_gpus", value)

    def event(self, name: str, pool: str, tags: Mapping[str, Any] | None = None) -> None:
        self.stats.incr(f"{METRIC_PREFIX}.gpu.{name}", tags={"pool": pool, **dict(tags or {})})
        self.stats.incr(f"{METRIC_PREFIX}.pool.{_stat_part(pool)}.{name}")

    def check(self, seconds: float) -> None:
        self.stats.incr(f"{METRIC_PREFIX}.health.checks")
        self.stats.timing(f"{METRIC_PREFIX}.health.check_duration", seconds * 1000.0)


class _Silent:
    """Stats that go nowhere (a check run from the command line, outside Airflow)."""

    def gauge(self, *args: Any, **kwargs: Any) -> None:
        pass

    def incr(self, *args: Any, **kwargs: Any) -> None:
        pass

    def timing(self, *args: Any, **kwargs: Any) -> None:
        pass


def silent_metrics() -> Metrics:
    return Metrics(_Silent())
