"""The page's HTML: Jinja2 templates (``plugins/templates``, autoescaped) over a :class:`~.model.PageModel`.

Four pages, each a function of the model and the request's query (no I/O here):

* :func:`render_page`: the cluster page (summary, fleet overview, pools, queue, reservations,
  evictions, GPUs);
* :func:`render_host`: one host (its wiring, GPUs with every column, history, events);
* :func:`render_job`: one job (its GPUs on the picture, DAG run, tries, replacements);
* :func:`render_history`: the pools' history over a window.

Every page has the same inline style sheet and script (``plugins/static``), which the
Content-Security-Policy of :mod:`.security` allows by hash.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import lru_cache
from typing import Sequence
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from airflow_hetero_gpu.plugins import charts, labels, overview, tables, topology_svg
from airflow_hetero_gpu.plugins.model import FILTER_STATES, TILE_TEXT, PageModel
from airflow_hetero_gpu.plugins.security import asset
from airflow_hetero_gpu.plugins.team_chart import team_chart

#: Up to this many hosts the cluster page draws every host's wiring under the overview.
WIRING_INLINE_HOSTS = 12
THEMES = ("light", "dark")


@lru_cache(maxsize=1)
def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("airflow_hetero_gpu.plugins", "templates"),
        autoescape=select_autoescape(["html", "svg"], default_for_string=True, default=True),
        trim_blocks=False,
        lstrip_blocks=False,
    )
    env.filters.update(
        q=lambda s: quote(str(s), safe=""),
        stamp=labels.stamp,
        ago=labels.ago,
        pct=labels.pct,
        num=labels.num,
        duration=labels.duration,
        hours=labels.hours,
        short_card=labels.short_card,
        short_pool=labels.short_pool,
    )
    return env


def _common(model: PageModel, *, base: str, ui_base: str, refresh_seconds: int, theme: str | None) -> dict:
    return {
        "model": model,
        "now": model.generated_at,
        "base": base.rstrip("/"),
        "ui_base": ui_base.rstrip("/"),
        "refresh_seconds": refresh_seconds,
        "theme": theme if theme in THEMES else None,
        "css": Markup(asset("page.css")),
        "js": Markup(asset("page.js")),
        "tile_text": TILE_TEXT,
        "filter_states": FILTER_STATES,
    }


def _wiring(model: PageModel, hosts: Sequence[str]) -> list[Markup]:
    graph = model.cluster.graph
    return [Markup(topology_svg.topology_svg(topology_svg.host_subgraph(graph, [h], switches=False),
                                             model.statuses, legend=False, title=f"wiring of {h}"))
            for h in hosts]


def render_page(model: PageModel, q: tables.Query | None = None, *, base: str = "", ui_base: str = "",
                refresh_seconds: int = 0, api_path: str = "api/cluster", theme: str | None = None) -> str:
    """The cluster page for ``q`` (filters, sorting, paging, grouping)."""
    q = q or tables.Query()
    ctx = _common(model, base=base, ui_base=ui_base, refresh_seconds=refresh_seconds, theme=theme)
    groups = overview.groups(model, q) if model.cluster is not None else []
    wiring: list[Markup] = []
    if model.cluster is not None and len(model.hosts) <= WIRING_INLINE_HOSTS:
        shown = [t.host for g in groups for t in g.walk_tiles()]
        wiring = _wiring(model, shown)
    known = {(g["host"], g["index"]) for g in model.gpus}
    extra = sum(1 for e in model.evictions if (e["host"], e["index"]) not in known) if model.cluster else 0
    ctx.update(
        q=q, api_path=api_path, groups=groups, wiring=wiring,
        wiring_legend=Markup(topology_svg.legend_svg()) if wiring else "",
        gpus=tables.gpu_table(model, q), reservations=tables.reservation_table(model, q),
        extra_evictions=extra,
        team_chart=team_chart(model.team_samples, model.generated_at, configured=model.teams.get("configured"))
        if model.teams is not None else None,
    )
    return environment().get_template("cluster.html").render(ctx)


def _window(now: datetime, hours: float) -> charts.Axis:
    return charts.Axis(now - timedelta(hours=hours), now)


def render_host(model: PageModel, host: str, *, hours: float, base: str = "", ui_base: str = "",
                refresh_seconds: int = 0, theme: str | None = None) -> str:
    """One host: its tile, wiring picture (with the switches above it), GPUs, history and events."""
    view = model.host(host)
    ctx = _common(model, base=base, ui_base=ui_base, refresh_seconds=refresh_seconds, theme=theme)
    axis = _window(model.generated_at, hours)
    busy = (model.thresholds or {}).get("busy_utilization", 0.1)
    svg = ""
    if view is not None and model.cluster is not None:
        svg = Markup(topology_svg.topology_svg(topology_svg.host_subgraph(model.cluster.graph, [host]),
                                               model.statuses, title=f"wiring of {host}"))
    events = sorted((e for e in model.events if e.host == host), key=lambda e: e.at, reverse=True)
    ctx.update(
        host=host, view=view, svg=svg, hours=hours, windows=charts.WINDOWS,
        charts=charts.host_charts(host, model.samples, model.events, axis, busy_utilization=busy,
                                  now=model.generated_at),
        events=events, q=tables.Query(),
        reservations=[r for r in model.reservations if any(g["host"] == host for g in r["gpus"])],
        evictions=[e for e in model.evictions if e["host"] == host],
    )
    return environment().get_template("host.html").render(ctx)


def render_job(model: PageModel, job_id: str, *, job_hosts: Sequence[str] = (), base: str = "",
               ui_base: str = "", refresh_seconds: int = 0, theme: str | None = None) -> str:
    """One job: its reservation, its GPUs ringed on the picture of its hosts, its replacements."""
    ctx = _common(model, base=base, ui_base=ui_base, refresh_seconds=refresh_seconds, theme=theme)
    res = next((r for r in model.reservations if r["job_id"] == job_id), None)
    queued = next((e for e in model.queue or () if e["job_id"] == job_id), None)
    events = sorted((e for e in model.events if e.job_id == job_id), key=lambda e: e.at)
    keys = [(g["host"], g["index"]) for g in res["gpus"]] if res else []
    svg = ""
    if keys and model.cluster is not None:
        hosts = sorted({h for h, _ in keys})
        svg = Markup(topology_svg.topology_svg(
            topology_svg.host_subgraph(model.cluster.graph, hosts), model.statuses, highlight=keys,
            highlight_label=f"GPUs of job {job_id}", title=f"GPUs of job {job_id}"))
    ctx.update(job_id=job_id, res=res, queued=queued, events=events, svg=svg, job_hosts=list(job_hosts),
               q=tables.Query())
    return environment().get_template("job.html").render(ctx)


def render_history(model: PageModel, *, hours: float, pool: str | None = None, base: str = "", ui_base: str = "",
                   refresh_seconds: int = 0, theme: str | None = None) -> str:
    """The pools' healthy, reserved and available GPUs over the last ``hours``, events marked."""
    ctx = _common(model, base=base, ui_base=ui_base, refresh_seconds=refresh_seconds, theme=theme)
    axis = _window(model.generated_at, hours)
    busy = (model.thresholds or {}).get("busy_utilization", 0.1)
    members: dict[str, list[tuple[str, int]]] = {}
    for g in model.gpus:
        if pool is None or g["pool"] == pool:
            members.setdefault(g["pool"], []).append((g["host"], g["index"]))
    ctx.update(
        hours=hours, windows=charts.WINDOWS, pool=pool, q=tables.Query(pool=pool or ""),
        charts=charts.pool_charts(members, model.samples, model.events, axis, busy_utilization=busy,
                                  now=model.generated_at),
        n_samples=len(model.samples), n_events=len(model.events),
    )
    return environment().get_template("history.html").render(ctx)
