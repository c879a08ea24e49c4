"""Filtering, sorting and paging of the page's tables, from the request's query parameters.

Everything happens on the server, so the page needs no JavaScript to sort or filter a table of
8,000 GPUs: a filter is a plain GET form, a sortable header is a link. Parameters:

==========  ================================================================================
``host``    hosts whose name contains the text (case-insensitive)
``pool``    one pool id (exact)
``state``   one of :data:`~.model.FILTER_STATES`: the GPUs the pools table counts under that
            name (``reserved`` includes a sick reserved GPU, ``evicted`` an unhealthy evicted
            one), or ``unreachable``: the GPUs of hosts whose last collection failed
``job``     jobs whose id contains the text (case-insensitive)
``sort``    the GPUs table's column; ``-col`` sorts descending
``rsort``   the reservations table's column; ``-col`` sorts descending
``page``    the GPUs table's page (``per_page`` rows each)
``group``   the overview's grouping: ``network`` (the switch tree, default) or ``pool``
==========  ================================================================================

A value that makes no sense is ignored and said on the page (:attr:`Query.problems`), never an
error page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import urlencode

from airflow_hetero_gpu.plugins.model import FILTER_STATES, STATES, PageModel

PER_PAGE = 100
GROUPINGS = ("network", "pool")
_STATE_RANK = {s: i for i, s in enumerate(STATES)}


def _none_last(value: Any) -> tuple[int, Any]:
    return (1, 0) if value is None else (0, value)


def _mem(g: Mapping[str, Any]) -> float | None:
    total, used = g.get("memory_total_mib"), g.get("memory_used_mib")
    return None if not total or used is None else used / total


GPU_SORTS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "host": lambda g: (g["host"], g["index"]),
    "state": lambda g: (_STATE_RANK.get(g["state"], 9), g["host"], g["index"]),
    "job": lambda g: _none_last(g.get("reserved_by")),
    "util": lambda g: _none_last(g.get("utilization")),
    "mem": lambda g: _none_last(_mem(g)),
    "temp": lambda g: _none_last(g.get("temperature_c")),
    "power": lambda g: _none_last(g.get("power_w")),
    "pool": lambda g: (g["pool"], g["host"], g["index"]),
    "card": lambda g: (g["name"], g["host"], g["index"]),
}
RES_SORTS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "job": lambda r: r["job_id"],
    "lease": lambda r: r.get("expires_at") or "",
    "created": lambda r: r.get("created_at") or "",
    "renewed": lambda r: r.get("renewed_at") or "",
    "pool": lambda r: (r["pool"], r["job_id"]),
    "gpus": lambda r: len(r.get("gpus") or ()),
}


@dataclass(frozen=True)
class Query:
    """The page's query parameters, checked."""

    host: str = ""
    pool: str = ""
    state: str = ""
    job: str = ""
    sort: str = "host"
    desc: bool = False
    rsort: str = "lease"
    rdesc: bool = False
    page: int = 1
    per_page: int = PER_PAGE
    group: str = "network"
    problems: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> "Query":
        problems: list[str] = []

        def text(name: str) -> str:
            value = (params.get(name) or "").strip()
            if len(value) > 200:
                problems.append(f"{name}: longer than 200 characters, ignored")
                return ""
            return value

        state = text("state").lower()
        if state and state not in FILTER_STATES:
            problems.append(f"state={state!r} is not one of {', '.join(FILTER_STATES)}; ignored")
            state = ""

        def order(name: str, table: Mapping[str, Any], default: str) -> tuple[str, bool]:
            raw = text(name)
            desc = raw.startswith("-")
            col = raw.lstrip("-")
            if not col:
                return default, False
            if col not in table:
                problems.append(f"{name}={raw!r}: no such column (one of {', '.join(table)}); ignored")
                return default, False
            return col, desc

        sort, desc = order("sort", GPU_SORTS, "host")
        rsort, rdesc = order("rsort", RES_SORTS, "lease")
        page = 1
        raw_page = text("page")
        if raw_page:
            try:
                page = int(raw_page)
                if page < 1:
                    raise ValueError
            except ValueError:
                problems.append(f"page={raw_page!r} is not a positive integer; showing page 1")
                page = 1
        group = text("group").lower() or "network"
        if group not in GROUPINGS:
            problems.append(f"group={group!r} is not one of {', '.join(GROUPINGS)}; grouping by network")
            group = "network"
        return cls(text("host"), text("pool"), state, text("job"), sort, desc, rsort, rdesc, page,
                   PER_PAGE, group, tuple(problems))

    @property
    def filtered(self) -> bool:
        return bool(self.host or self.pool or self.state or self.job)

    def params(self, **changes: Any) -> dict[str, str]:
        q = replace(self, **changes)
        out = {"host": q.host, "pool": q.pool, "state": q.state, "job": q.job,
               "sort": ("-" if q.desc else "") + q.sort if (q.sort, q.desc) != ("host", False) else "",
               "rsort": ("-" if q.rdesc else "") + q.rsort if (q.rsort, q.rdesc) != ("lease", False) else "",
               "page": str(q.page) if q.page != 1 else "",
               "group": q.group if q.group != "network" else ""}
        return {k: v for k, v in out.items() if v}

    def link(self, **changes: Any) -> str:
        """``?…`` for this query with ``changes`` (a filter change goes back to page 1)."""
        if any(k in changes for k in ("host", "pool", "state", "job", "sort", "desc")):
            changes.setdefault("page", 1)
        params = self.params(**changes)
        return "?" + urlencode(params) if params else "?"

    def sort_link(self, col: str, *, table: str = "gpus") -> str:
        if table == "gpus":
            return self.link(sort=col, desc=(not self.desc) if self.sort == col else False)
        return self.link(rsort=col, rdesc=(not self.rdesc) if self.rsort == col else False)

    def sort_mark(self, col: str, *, table: str = "gpus") -> str:
        current, desc = (self.sort, self.desc) if table == "gpus" else (self.rsort, self.rdesc)
        if col != current:
            return ""
        return "\u25bc" if desc else "\u25b2"

    # --- matching ---------------------------------------------------------------------------
    def host_matches(self, host: str) -> bool:
        return not self.host or self.host.lower() in host.lower()

    def job_matches(self, job: str | None) -> bool:
        return not self.job or (job is not None and self.job.lower() in job.lower())

    def state_matches(self, g: Mapping[str, Any], host_down: bool = False) -> bool:
        s = self.state
        if not s:
            return True
        if s == "unreachable":
            return host_down
        if s == "available":
            return bool(g.get("available"))
        if s == "reserved":
            return g.get("reserved_by") is not None
        if s == "evicted":
            return g.get("evicted") is not None
        if s == "unhealthy":
            return not g.get("healthy", True)
        return g["state"] == s

    def gpu_matches(self, g: Mapping[str, Any], host_down: bool = False) -> bool:
        if not self.host_matches(g["host"]) or (self.pool and g["pool"] != self.pool):
            return False
        return self.state_matches(g, host_down) and (self.job_matches(g.get("reserved_by")) if self.job else True)

    def reservation_matches(self, r: Mapping[str, Any]) -> bool:
        if self.pool and r["pool"] != self.pool:
            return False
        if self.host and not any(self.host_matches(g["host"]) for g in r.get("gpus") or ()):
            return False
        return self.job_matches(r["job_id"])


@dataclass(frozen=True)
class TableView:
    rows: Sequence[Mapping[str, Any]]
    total: int  # rows that match the filters
    page: int
    pages: int

    @property
    def first(self) -> int:
        return 0 if not self.total else (self.page - 1) * PER_PAGE + 1

    @property
    def last(self) -> int:
        return self.first + len(self.rows) - 1 if self.rows else 0


def gpu_table(model: PageModel, q: Query) -> TableView:
    down = {h.host for h in model.hosts if h.error}
    rows = [g for g in model.gpus if q.gpu_matches(g, g["host"] in down)]
    if q.sort != "host" or q.desc:
        rows.sort(key=GPU_SORTS[q.sort], reverse=q.desc)
    pages = max(1, math.ceil(len(rows) / q.per_page))
    page = min(q.page, pages)
    start = (page - 1) * q.per_page
    return TableView(rows[start:start + q.per_page], len(rows), page, pages)


def reservation_table(model: PageModel, q: Query) -> TableView:
    rows = [r for r in model.reservations if q.reservation_matches(r)]
    rows.sort(key=RES_SORTS[q.rsort], reverse=q.rdesc)
    return TableView(rows, len(rows), 1, 1)
