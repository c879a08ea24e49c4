"""The cluster page's FastAPI app, mounted by the api-server at ``/hetero-gpu``.

Read-only. Every route sits behind Airflow's own authentication and authorization (a plugin's
app gets none by itself): the app-wide dependency ``requires_access_view(AccessView.PLUGINS)``
refuses an anonymous request with 401 and a user without access with 403. Reservations and
waiting jobs of DAGs the user may not read keep their job id and GPUs but lose their DAG run. Every response carries
the security headers of :mod:`.security`.

Routes (query parameters of the cluster page: :mod:`.tables`):

* ``/``: the cluster page; ``/hosts/{host}``: a host; ``/jobs/{job_id}``: a job;
  ``/history``: the pools' history (``?hours=``, ``?pool=``);
* ``/api/cluster``, ``/api/hosts/{host}``: the same facts as JSON;
* ``/topology.svg``: the whole wiring picture (``?host=`` repeated: those hosts only).

Where the facts come from: :mod:`.sources`. A missing capture directory or ledger is said on
the page, not raised. The routes are plain (sync) functions: reading captures and the ledger
blocks, so FastAPI runs them in its thread pool.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_view

from airflow_hetero_gpu.plugins import charts, model as page_model, render, sources, tables, topology_svg
from airflow_hetero_gpu.plugins.paths import URL_PREFIX
from airflow_hetero_gpu.plugins.security import security_headers

log = logging.getLogger(__name__)

ACCESS_VIEW = AccessView.PLUGINS
DEFAULT_HOURS = 6


def snapshot(user: Any, settings: sources.PageSettings | None = None, **kwargs: Any) -> page_model.PageModel:
    """The page's model for one request (:func:`.sources.read_inputs`, then :func:`.model.build`)."""
    inputs = sources.read_inputs(user, settings, **kwargs)
    return page_model.build(
        inputs.cluster, inputs.reservations, inputs.evictions, queue=inputs.queue, preemptions=inputs.preemptions,
        samples=inputs.samples,
        events=inputs.events, sources=inputs.sources, visible_dag_ids=inputs.visible_dag_ids, now=inputs.now,
        teams=inputs.teams, team_samples=inputs.team_samples,
        drains=inputs.drains,
    )


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _ui_base(request: Request) -> str:
    root = _root(request)
    return root[: -len(URL_PREFIX)] if root.endswith(URL_PREFIX) else ""


def _hours(raw: str | None) -> float:
    try:
        value = float(raw) if raw else DEFAULT_HOURS
    except ValueError:
        return DEFAULT_HOURS
    return value if value in charts.WINDOWS else DEFAULT_HOURS


def _theme(request: Request) -> str | None:
    value = request.query_params.get("theme")
    return value if value in render.THEMES else None


def create_app() -> FastAPI:
    app = FastAPI(
        title="GPU cluster",
        description="Read-only view of the heterogeneous GPU cluster: pools, GPUs, reservations, evictions.",
        # no unauthenticated extras: the app-wide dependency guards every route there is
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        dependencies=[Depends(requires_access_view(ACCESS_VIEW))],
    )

    @app.middleware("http")
    async def add_security_headers(request: Request, call_next):
        response = await call_next(request)
        for name, value in security_headers().items():
            response.headers.setdefault(name, value)
        return response

    def page_kwargs(request: Request, settings: sources.PageSettings) -> dict[str, Any]:
        return {"base": _root(request), "ui_base": _ui_base(request), "refresh_seconds": settings.refresh_seconds,
                "theme": _theme(request)}

    @app.get("/", response_class=HTMLResponse)
    def page(request: Request, user: GetUserDep) -> HTMLResponse:
        settings = sources.PageSettings.from_airflow_config()
        m = snapshot(user, settings)
        q = tables.Query.parse(request.query_params)
        html = render.render_page(m, q, api_path=f"{_root(request)}/api/cluster", **page_kwargs(request, settings))
        return HTMLResponse(html)

    @app.get("/hosts/{host}", response_class=HTMLResponse)
    def host_page(request: Request, host: str, user: GetUserDep) -> HTMLResponse:
        settings = sources.PageSettings.from_airflow_config()
        hours = _hours(request.query_params.get("hours"))
        m = snapshot(user, settings, history_hours=hours, history_hosts=[host])
        html = render.render_host(m, host, hours=hours, **page_kwargs(request, settings))
        return HTMLResponse(html, status_code=200 if m.host(host) is not None or m.cluster is None else 404)

    @app.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job_page(request: Request, job_id: str, user: GetUserDep) -> HTMLResponse:
        settings = sources.PageSettings.from_airflow_config()
        m = snapshot(user, settings, history_hours=max(charts.WINDOWS), history_hosts=[])
        html = render.render_job(m, job_id, job_hosts=sources.read_job_hosts(settings, job_id),
                                 **page_kwargs(request, settings))
        return HTMLResponse(html)

    @app.get("/history", response_class=HTMLResponse)
    def history_page(request: Request, user: GetUserDep) -> HTMLResponse:
        settings = sources.PageSettings.from_airflow_config()
        hours = _hours(request.query_params.get("hours"))
        m = snapshot(user, settings, history_hours=hours)
        pool = request.query_params.get("pool") or None
        html = render.render_history(m, hours=hours, pool=pool, **page_kwargs(request, settings))
        return HTMLResponse(html)

    @app.get("/api/cluster")
    def cluster_json(user: GetUserDep) -> JSONResponse:
        return JSONResponse(snapshot(user).to_json())

    @app.get("/api/hosts/{host}")
    def host_json(request: Request, host: str, user: GetUserDep) -> JSONResponse:
        hours = _hours(request.query_params.get("hours"))
        m = snapshot(user, history_hours=hours, history_hosts=[host])
        view = m.host(host)
        if view is None:
            return JSONResponse({"error": f"no host {host!r} in the inventory"}, status_code=404)
        return JSONResponse({
            "host": view.to_json(), "gpus": view.gpus,
            "samples": [s.to_json() for s in m.samples if s.host == host],
            "events": [e.to_json() for e in m.events if e.host == host],
        })

    @app.get("/topology.svg")
    def topology(user: GetUserDep, host: list[str] = Query(default=[])) -> Response:
        m = snapshot(user)
        if m.cluster is None:
            msg = m.sources["captures"].get("message") or "no inventory"
            return Response(msg, status_code=404, media_type="text/plain")
        graph = m.cluster.graph
        if host:
            graph = topology_svg.host_subgraph(graph, host)
        return Response(topology_svg.topology_svg(graph, m.statuses), media_type="image/svg+xml")

    return app
