"""History charts: the geometry of small time-series pictures, drawn as inline SVG by a template.

The ledger keeps a sample of every host's GPUs per stored collection when the previous one is
older than ``[hetero_gpu] history_interval`` or the host's health changed (``host_samples``), and
one event per eviction, readmission, uncordon and replacement (``gpu_events``). A sample holds
until the next one of its host, so counts are drawn as steps; utilization and temperature as
lines through the samples, broken where the host could not be collected.

This module computes coordinates only (no markup): :func:`host_charts` for one host,
:func:`pool_charts` for the pools of a fleet; ``templates/_charts.html`` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Collection, Iterable, Mapping, Sequence

from airflow_hetero_gpu.plugins.labels import stamp

WIDTH, HEIGHT = 900, 170
PAD_L, PAD_R, PAD_T, PAD_B = 46, 14, 12, 24
#: The windows the page offers, in hours (a window longer than the retention shows what is kept).
WINDOWS = (1, 6, 24, 72, 168)
MAX_MARKERS = 400
_STEPS = [10, 15, 30, 60, 120] + [60 * m for m in (5, 10, 15, 30)] + [3600 * h for h in (1, 2, 3, 6, 12)] + [86400 * d for d in (1, 2, 7)]
EVENT_TEXT = {"evicted": "evicted", "readmitted": "readmitted", "uncordoned": "uncordoned",
              "replaced": "replaced in its job"}


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class Axis:
    """Time on x: ``since`` at the left edge of the plot, ``until`` at its right edge."""

    since: datetime
    until: datetime
    x0: float = PAD_L
    x1: float = WIDTH - PAD_R

    def x(self, t: datetime) -> float:
        span = (self.until - self.since).total_seconds() or 1.0
        f = (_aware(t) - self.since).total_seconds() / span
        return round(self.x0 + (self.x1 - self.x0) * min(1.0, max(0.0, f)), 1)

    def ticks(self) -> list[tuple[float, str]]:
        span = (self.until - self.since).total_seconds()
        step = next((s for s in _STEPS if span / s <= 8), _STEPS[-1])
        epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
        first = int((self.since - epoch).total_seconds() // step + 1) * step
        out = []
        t = epoch + timedelta(seconds=first)
        while t <= self.until:
            label = t.strftime("%m-%d") if step >= 86400 else t.strftime("%H:%M" if step >= 60 else "%H:%M:%S")
            if step < 86400 and t.hour == 0 and t.minute == 0:
                label = t.strftime("%m-%d")
            out.append((self.x(t), label))
            t += timedelta(seconds=step)
        return out


@dataclass(frozen=True)
class Line:
    name: str
    cls: str  # CSS class: hg-s-available, hg-s-gpu3, ...
    d: str  # SVG path
    last: str  # the last value, for the legend


@dataclass(frozen=True)
class Marker:
    x: float
    kind: str
    at: str  # ISO time
    gpu: str  # host:index
    job: str | None
    title: str


@dataclass(frozen=True)
class Band:
    """An interval the host could not be collected."""

    x: float
    w: float
    title: str


@dataclass
class Chart:
    id: str
    title: str
    unit: str
    axis: Axis
    y_max: float
    lines: list[Line] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    width: int = WIDTH
    height: int = HEIGHT

    def y(self, v: float) -> float:
        top, bottom = PAD_T, self.height - PAD_B
        f = 0.0 if self.y_max <= 0 else min(1.0, max(0.0, v / self.y_max))
        return round(bottom - (bottom - top) * f, 1)

    @property
    def y_ticks(self) -> list[tuple[float, str]]:
        vals = [0.0, self.y_max / 2, self.y_max]
        fmt = (lambda v: f"{v:.0f}") if self.y_max >= 4 or self.y_max == 0 else (lambda v: f"{v:.1f}")
        return [(self.y(v), fmt(v)) for v in vals]

    @property
    def plot_bottom(self) -> float:
        return self.height - PAD_B

    @property
    def empty(self) -> bool:
        return not self.lines and not self.markers


def _step_path(points: Sequence[tuple[float, float | None]], end_x: float) -> str:
    """A step path through (x, y): each value held until the next x; None breaks the path."""
    parts: list[str] = []
    pen = False
    for i, (x, y) in enumerate(points):
        nxt = points[i + 1][0] if i + 1 < len(points) else end_x
        if y is None:
            pen = False
            continue
        parts.append(f"{'L' if pen else 'M'}{x:g} {y:g}H{nxt:g}")
        pen = True
    return "".join(parts)


def _line_path(points: Sequence[tuple[float, float | None]]) -> str:
    parts: list[str] = []
    pen = False
    for x, y in points:
        if y is None:
            pen = False
            continue
        parts.append(f"{'L' if pen else 'M'}{x:g} {y:g}")
        pen = True
    return "".join(parts)


def _gpu_flags(g: Mapping[str, Any], busy: float) -> tuple[bool, bool, bool]:
    """(healthy, reserved, available) of a GPU as one sample recorded it."""
    evicted = bool(g.get("evicted"))
    healthy = bool(g.get("healthy", True)) and not evicted
    reserved = bool(g.get("reserved"))
    util = g.get("utilization")
    mem_t, mem_u = g.get("memory_total_mib"), g.get("memory_used_mib")
    load = util or 0.0
    if mem_t and mem_u is not None and mem_t > 0:
        load = max(load, mem_u / mem_t)
    return healthy, reserved, healthy and not reserved and load <= busy


def _contribution(gpus: Iterable[Mapping[str, Any]], pool_at: Mapping[int, str], busy: float
                  ) -> dict[str, list[int]]:
    """Healthy, reserved and available GPUs of one sample, per pool (:func:`_gpu_flags`, inlined:
    a fleet's history is hundreds of thousands of GPU entries)."""
    out: dict[str, list[int]] = {}
    for g in gpus:
        p = pool_at.get(g.get("index"))
        if p is None:
            continue
        healthy = bool(g.get("healthy", True)) and not g.get("evicted")
        reserved = bool(g.get("reserved"))
        available = False
        if healthy and not reserved:
            u = g.get("utilization") or 0.0
            total, used = g.get("memory_total_mib"), g.get("memory_used_mib")
            if total and used is not None and total > 0 and used / total > u:
                u = used / total
            available = u <= busy
        c = out.get(p)
        if c is None:
            c = out[p] = [0, 0, 0]
        c[0] += healthy
        c[1] += reserved
        c[2] += available
    return out


def markers(events: Iterable[Any], axis: Axis, keys: Collection[tuple[str, int]] | None = None) -> list[Marker]:
    """Events inside the window (of ``keys`` when given) as markers on the time axis."""
    out = []
    for e in sorted(events, key=lambda e: _aware(e.at)):
        at = _aware(e.at)
        if at < axis.since or at > axis.until or (keys is not None and (e.host, e.index) not in keys):
            continue
        what = EVENT_TEXT.get(e.kind, e.kind)
        why = ", ".join(e.reasons or ())
        title = f"{stamp(at)} {e.host} GPU{e.index} {what}" + (f": {why}" if why else "")
        if e.job_id:
            title += f" (job {e.job_id})"
        out.append(Marker(axis.x(at), e.kind, at.isoformat(), f"{e.host}:{e.index}", e.job_id, title))
    return out[-MAX_MARKERS:]


def host_charts(host: str, samples: Iterable[Any], events: Iterable[Any], axis: Axis, *,
                busy_utilization: float, now: datetime | None = None) -> list[Chart]:
    """GPU counts, utilization and temperature of one host over ``axis``, its events marked."""
    rows = sorted((s for s in samples if s.host == host), key=lambda s: _aware(s.collected_at))
    end = axis.x(min(axis.until, _aware(now)) if now else axis.until)
    evs = markers(events, axis, keys=None)
    evs = [m for m in evs if m.gpu.rsplit(":", 1)[0] == host]
    counts = Chart("hg-h-counts", "GPUs: healthy, reserved, available", "GPUs", axis, 0)
    util = Chart("hg-h-util", "Utilization per GPU", "%", axis, 100)
    temp = Chart("hg-h-temp", "Temperature per GPU", "\u00b0C", axis, 100)
    for c in (counts, util, temp):
        c.markers = evs
    if not rows:
        return [counts, util, temp]
    xs = [axis.x(s.collected_at) for s in rows]
    n_max = max((len(s.gpus) for s in rows), default=0)
    counts.y_max = max(1, n_max)
    series: dict[str, list[tuple[float, float | None]]] = {"healthy": [], "reserved": [], "available": []}
    per_util: dict[int, list[tuple[float, float | None]]] = {}
    per_temp: dict[int, list[tuple[float, float | None]]] = {}
    indices = sorted({int(g.get("index", 0)) for s in rows for g in s.gpus})
    t_max = 100.0
    for x, s in zip(xs, rows):
        by_index = {int(g.get("index", 0)): g for g in s.gpus}
        if not s.ok:
            for name in series:
                series[name].append((x, None))
        else:
            flags = [_gpu_flags(g, busy_utilization) for g in s.gpus]
            series["healthy"].append((x, sum(f[0] for f in flags)))
            series["reserved"].append((x, sum(f[1] for f in flags)))
            series["available"].append((x, sum(f[2] for f in flags)))
        for i in indices:
            g = by_index.get(i)
            u = g.get("utilization") if (g and s.ok) else None
            t = g.get("temperature_c") if (g and s.ok) else None
            per_util.setdefault(i, []).append((x, None if u is None else 100.0 * u))
            per_temp.setdefault(i, []).append((x, t))
            if t is not None:
                t_max = max(t_max, float(t))
    temp.y_max = t_max
    for name in ("healthy", "reserved", "available"):
        pts = [(x, None if v is None else counts.y(v)) for x, v in series[name]]
        last = next((v for _, v in reversed(series[name]) if v is not None), None)
        counts.lines.append(Line(name, f"hg-s-{name}", _step_path(pts, end), "" if last is None else f"{last:g}"))
    for chart, per, fmt in ((util, per_util, "{:.0f}%"), (temp, per_temp, "{:.0f} \u00b0C")):
        for i in indices:
            raw = per.get(i, [])
            pts = [(x, None if v is None else chart.y(v)) for x, v in raw]
            last = next((v for _, v in reversed(raw) if v is not None), None)
            chart.lines.append(Line(f"GPU{i}", f"hg-s-gpu hg-s-gpu{i % 8}", _line_path(pts),
                                    "" if last is None else fmt.format(last)))
    bands = []
    for k, s in enumerate(rows):
        if not s.ok:
            nxt = xs[k + 1] if k + 1 < len(rows) else end
            bands.append(Band(xs[k], max(1.0, nxt - xs[k]), f"{stamp(s.collected_at)}: {host} not collected"))
    for c in (counts, util, temp):
        c.bands = bands
    return [counts, util, temp]


def pool_charts(pools: Mapping[str, Collection[tuple[str, int]]], samples: Iterable[Any], events: Iterable[Any],
                axis: Axis, *, busy_utilization: float, now: datetime | None = None) -> list[Chart]:
    """Per pool: healthy, reserved and available GPUs over ``axis`` (the fleet's samples summed,
    each host's sample held until its next), with the pool's events marked."""
    rows = sorted(((_aware(s.collected_at), s) for s in samples), key=lambda ts: ts[0])
    end = axis.x(min(axis.until, _aware(now)) if now else axis.until)
    pools_at: dict[str, dict[int, str]] = {}  # host -> GPU index -> pool
    for p, keys in pools.items():
        for host, index in keys:
            pools_at.setdefault(host, {})[index] = p
    # running totals per pool, and each host's current contribution to them
    totals = {p: [0, 0, 0] for p in pools}
    contrib: dict[str, dict[str, list[int]]] = {}
    points: dict[str, list[tuple[float, tuple[int, int, int]]]] = {p: [] for p in pools}
    seen: set[str] = set()  # pools with a sample so far
    started = False
    i, n_rows = 0, len(rows)
    while i < n_rows:
        t = rows[i][0]
        if not started and t >= axis.since:
            started = True  # where the lines start: what the samples before the window said
            for p in seen:
                points[p].append((axis.x0, tuple(totals[p])))
        touched: set[str] = set()
        while i < n_rows and rows[i][0] == t:
            s = rows[i][1]
            i += 1
            new = _contribution(s.gpus, pools_at.get(s.host, {}), busy_utilization) if s.ok else {}
            old = contrib.get(s.host, {})
            if new == old:
                continue
            for p in set(old) | set(new):
                o, n = old.get(p, (0, 0, 0)), new.get(p, (0, 0, 0))
                tp = totals[p]
                tp[0] += n[0] - o[0]
                tp[1] += n[1] - o[1]
                tp[2] += n[2] - o[2]
                touched.add(p)
            contrib[s.host] = new
        seen |= touched
        if started:
            x = axis.x(t)
            for p in touched:
                points[p].append((x, tuple(totals[p])))
    if not started:
        for p in seen:
            points[p].append((axis.x0, tuple(totals[p])))
    out = []
    for n, (p, keys) in enumerate(pools.items()):
        c = Chart(f"hg-p-{n}", p, "GPUs", axis, max(1, len(keys)))
        pts = points[p]
        for k, name in enumerate(("healthy", "reserved", "available")):
            series = [(x, c.y(v[k])) for x, v in pts]
            last = f"{pts[-1][1][k]}" if pts else ""
            c.lines.append(Line(name, f"hg-s-{name}", _step_path(series, end), last))
        c.markers = markers(events, axis, keys=set(keys))
        out.append(c)
    return out
