"""The Teams section: the chart of GPUs each team held over time (borrowed ones included), from
the ledger's ``team_samples`` (one row per team whenever its GPUs in use changed; docs/teams.md),
and the card types each team's ``(no quota)`` row stands for.

Coordinates only, as :mod:`~airflow_hetero_gpu.plugins.charts` computes them; the page's chart
macro draws it. The time axis is fitted to the history there is: the last ``hours`` when the
samples go back that far, else from the first sample to now (a few minutes of history fill the
chart). A team the teams file does not name (``default``: the jobs run without a team) is drawn
only while it holds GPUs.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Collection, Iterable, Mapping, Sequence

from airflow_hetero_gpu.durations import duration
from airflow_hetero_gpu.plugins.charts import Axis, Chart, Line, _step_path

HOURS = 24
MIN_SPAN_S = 10.0  # the shortest axis (a sample taken just now still reads as a line)


def _at(value: Any) -> datetime:
    t = datetime.fromisoformat(value) if isinstance(value, str) else value
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def team_chart(samples: Iterable[Mapping[str, Any]], now: datetime, hours: float = HOURS, *,
               configured: Collection[str] | None = None) -> Chart:
    """Per team, a step line of its GPUs in use (each sample holds until the team's next one; the
    last one until now), over the last ``hours`` or, with less history, since the first sample.

    ``configured``: the teams the teams file names (None: every team in the samples); another
    team is drawn only when its last sample holds GPUs."""
    by_team: dict[str, list[tuple[datetime, int]]] = {}
    for s in samples:
        by_team.setdefault(s["team"], []).append((_at(s["at"]), int(s["in_use"])))
    for rows in by_team.values():
        rows.sort(key=lambda r: r[0])
    if configured is not None:
        by_team = {t: rows for t, rows in by_team.items() if t in configured or rows[-1][1] > 0}
    window = now - timedelta(hours=hours)
    first = min((rows[0][0] for rows in by_team.values()), default=window)
    since = max(window, min(first, now - timedelta(seconds=MIN_SPAN_S)))
    axis = Axis(since, now)
    title = "GPUs in use per team (borrowed included), " + (
        f"the last {duration((now - since).total_seconds())}: all the history there is" if since > window
        else f"last {hours:g} h")
    chart = Chart("hg-teams-use", title, "GPUs", axis, 1)
    if not by_team:
        return chart
    chart.y_max = max(1, max(v for rows in by_team.values() for _, v in rows))
    end = axis.x(now)
    for i, team in enumerate(sorted(by_team)):
        rows = by_team[team]
        before = [v for t, v in rows if t < axis.since]
        points = ([(axis.x(axis.since), chart.y(before[-1]))] if before else []) + \
            [(axis.x(t), chart.y(v)) for t, v in rows if t >= axis.since]
        if not points:
            continue
        chart.lines.append(Line(team, f"hg-s-gpu hg-s-gpu{i % 8}", _step_path(points, end), f"{rows[-1][1]}"))
    return chart


def no_quota_cards(teams: Mapping[str, Any], card_types: Sequence[str]) -> dict[str, Any]:
    """``teams`` (``Ledger.team_standing()``) with each ``(no quota)`` row's ``cards``: the card
    types of the fleet none of its team's patterns match (what the row counts)."""
    from airflow_hetero_gpu.core.admission.teams import matches

    patterns: dict[str, list[str]] = {}
    for r in teams.get("rows", ()):
        if r.get("pattern"):
            patterns.setdefault(r["team"], []).append(r["pattern"])
    rows = []
    for r in teams.get("rows", ()):
        if not r.get("pattern"):
            mine = patterns.get(r["team"], [])
            r = {**r, "cards": [c for c in card_types if not any(matches(c, p) for p in mine)]}
        rows.append(r)
    return {**teams, "rows": rows}
