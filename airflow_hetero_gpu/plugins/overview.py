"""The fleet overview: every host a small tile, grouped by the network tree or by pool.

A tile is the host's name and one small cell per GPU coloured by its state (available, busy,
drained, reserved, evicted or unhealthy; every cell of a host whose last collection failed shows
unreachable). Tiles wrap to the width of the page, so a thousand hosts fill rows instead of one
row a hundred thousand pixels wide, and the labels keep their size.

* **network**: the switch tree of ``topology.conf`` (``Cluster.net``): top-tier switches hold
  the switches below them, tier-1 switches (leaves) hold hosts; hosts under no switch form a
  group of their own; without ``topology.conf`` one group holds every host; the hosts of one
  multi-node NVLink domain (the trays of an NVL72 rack) form a group of their own where its first
  host hangs;
* **pool**: one group per candidate pool, a tile per host showing that pool's GPUs only.

The query's filters narrow the overview as they narrow the tables: a host or pool filter keeps
the matching tiles, a state or job filter dims the cells that do not match.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from airflow_hetero_gpu.plugins.labels import pct, plural
from airflow_hetero_gpu.plugins.model import TILE_STATES, TILE_TEXT, HostView, PageModel
from airflow_hetero_gpu.plugins.tables import Query

@dataclass(frozen=True)
class Cell:
    index: int
    state: str
    job: str | None
    title: str
    dim: bool


@dataclass
class Tile:
    host: str
    error: str | None
    cells: list[Cell]
    drain: str | None = None  # "drained: why (since …; running jobs end in …)"

    @property
    def title(self) -> str:
        counts: dict[str, int] = {}
        for c in self.cells:
            counts[c.state] = counts.get(c.state, 0) + 1
        text = ", ".join(f"{counts[s]} {TILE_TEXT[s]}" for s in TILE_STATES if counts.get(s) and s != "unreachable")
        head = f"{self.host}: {plural(len(self.cells), 'GPU')}" + (f" ({text})" if text else "")
        if self.drain:
            head += f" \u00b7 {self.drain}"
        return head + (f" \u00b7 collection failed: {self.error}" if self.error else "")


@dataclass
class Group:
    name: str
    tier: int | None  # the switch's tier; None for a pool or a group of unswitched hosts
    children: list["Group"] = field(default_factory=list)
    tiles: list[Tile] = field(default_factory=list)

    def walk_tiles(self) -> Iterable[Tile]:
        yield from self.tiles
        for c in self.children:
            yield from c.walk_tiles()

    @property
    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in TILE_STATES}
        for t in self.walk_tiles():
            for c in t.cells:
                out[c.state] += 1
        return out

    @property
    def n_hosts(self) -> int:
        return sum(1 for _ in self.walk_tiles())

    @property
    def summary(self) -> str:
        counts = self.counts
        gpus = sum(counts.values())
        return (f"{plural(self.n_hosts, 'host')}, {counts['available']}/{gpus} GPUs available"
                + (f" ({pct(counts['available'] / gpus)})" if gpus else ""))


def _cell_title(host: str, g: Mapping[str, Any], down: bool) -> str:
    title = f"{host} GPU{g['unit']} {'(host unreachable) ' if down else ''}{g['state']}"
    if g["held"]:
        title += f" ({', '.join(g['held'])})"
    if g["reserved_by"]:
        title += f" \u00b7 job {g['reserved_by']}"
    if g["utilization"] is not None:
        title += f" \u00b7 utilization {g['utilization']:.0%}"
    if g["reasons"] or g["evicted"]:
        title += " \u00b7 " + ", ".join(dict.fromkeys([*g["reasons"], *(g["evicted"] or ())]))
    return title


def _tile(h: HostView, q: Query, pool: str | None = None) -> Tile | None:
    """The host's tile (its GPUs of ``pool`` only, when given), or None when filtered out."""
    if not q.host_matches(h.host):
        return None
    if q.pool and pool is None and not any(g["pool"] == q.pool for g in h.gpus):
        return None
    narrowing = bool(q.state or q.job or q.pool)
    down = bool(h.error)
    cells = []
    for g, state in zip(h.gpus, h.tile_states):
        if pool is not None and g["pool"] != pool:
            continue
        dim = narrowing and not (q.state_matches(g, down) and q.job_matches(g["reserved_by"])
                                 and (not q.pool or g["pool"] == q.pool))
        cells.append(Cell(g["index"], state, g["reserved_by"], _cell_title(h.host, g, down), dim))
    if (q.state or q.job) and not any(not c.dim for c in cells) and not (q.state == "unreachable" and down):
        return None  # nothing of this host matches (an unreachable host without GPUs still shows)
    if pool is not None and not cells:
        return None
    return Tile(h.host, h.error, cells, h.drain)


def network_groups(model: PageModel, q: Query) -> list[Group]:
    """The switch tree with host tiles under the leaves (see the module docstring)."""
    tiles = {}
    for h in model.hosts:
        t = _tile(h, q)
        if t is not None:
            tiles[h.host] = t
    # the hosts of one multi-node NVLink domain (an NVL72 rack's trays) form a group of their own,
    # under the switch its first host hangs under
    domain_of = {h.host: h.nvlink_domain for h in model.hosts if h.nvlink_domain and h.host in tiles}
    domains: dict[str, Group] = {}
    for h in model.hosts:
        if h.host in domain_of:
            d = domain_of[h.host]
            domains.setdefault(d, Group(f"NVLink domain {d}", None)).tiles.append(tiles[h.host])
    by_name = {s["switch"]: Group(s["switch"], s["tier"]) for s in model.switches}
    roots: list[Group] = []
    placed: set[str] = set()
    placed_domains: set[str] = set()

    def place(host: str, into: list[Group], tiles_of: list[Tile]) -> None:
        placed.add(host)
        d = domain_of.get(host)
        if d is None:
            tiles_of.append(tiles[host])
        elif d not in placed_domains:
            placed_domains.add(d)
            into.append(domains[d])

    for s in sorted(model.switches, key=lambda s: (-(s["tier"] or 0), s["switch"])):
        g = by_name[s["switch"]]
        for host in s["hosts"]:
            if host in tiles and host not in placed:
                place(host, g.children, g.tiles)
        parent = by_name.get(s["parent"]) if s["parent"] else None
        (parent.children if parent is not None else roots).append(g)
    for g in by_name.values():
        g.children.sort(key=lambda c: c.name)
    rest: list[Tile] = []
    for host in tiles:
        if host not in placed:
            place(host, roots, rest)
    if rest:
        roots.append(Group("(under no switch)", None, tiles=rest))
    return _prune(roots)


def _prune(groups: list[Group]) -> list[Group]:
    out = []
    for g in groups:
        g.children = _prune(g.children)
        if g.tiles or g.children:
            out.append(g)
    return out


def pool_groups(model: PageModel, q: Query) -> list[Group]:
    out = []
    for p in model.pools:
        if q.pool and p.pool != q.pool:
            continue
        g = Group(p.pool, None)
        members = set(p.hosts)
        for h in model.hosts:
            if h.host in members:
                t = _tile(h, q, pool=p.pool)
                if t is not None:
                    g.tiles.append(t)
        if g.tiles:
            out.append(g)
    return out


def groups(model: PageModel, q: Query) -> list[Group]:
    """The overview's groups for the query's grouping and filters."""
    return pool_groups(model, q) if q.group == "pool" else network_groups(model, q)
