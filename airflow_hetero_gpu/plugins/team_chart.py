"""The Teams section's chart: GPUs each team held over time (borrowed ones included), from the
ledger's ``team_samples`` (one row per team whenever its GPUs in use changed; docs/teams.md).

Coordinates only, as :mod:`~airflow_hetero_gpu.plugins.charts` computes them; the page's chart
macro draws it.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

from airflow_hetero_gpu.plugins.charts import Axis, Chart, Line, _step_path

HOURS = 24


def _at(value: Any) -> datetime:
    t = datetime.fromisoformat(value) if isinstance(value, str) else value
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def team_chart(samples: Iterable[dict], now: datetime, hours: float = HOURS) -> Chart:
    """Per team, a step line of its GPUs in use over the last ``hours`` (each sample holds until
    the team's next one; the last one until now)."""
    axis = Axis(now - timedelta(hours=hours), now)
    chart = Chart("hg-teams-use", f"GPUs in use per team, last {hours:g} h (borrowed included)", "GPUs", axis, 1)
    by_team: dict[str, list[tuple[datetime, int]]] = {}
    for s in samples:
        by_team.setdefault(s["team"], []).append((_at(s["at"]), int(s["in_use"])))
    if not by_team:
        return chart
    chart.y_max = max(1, max(v for rows in by_team.values() for _, v in rows))
    end = axis.x(now)
    for i, team in enumerate(sorted(by_team)):
        rows = sorted(by_team[team])
        before = [v for t, v in rows if t < axis.since]
        points = ([(axis.x(axis.since), chart.y(before[-1]))] if before else []) + \
            [(axis.x(t), chart.y(v)) for t, v in rows if t >= axis.since]
        if not points:
            continue
        chart.lines.append(Line(team, f"hg-s-gpu hg-s-gpu{i % 8}", _step_path(points, end), f"{rows[-1][1]}"))
    return chart
