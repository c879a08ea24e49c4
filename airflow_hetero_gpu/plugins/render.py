"""The cluster page's facts, its topology picture (SVG) and its HTML; pure functions, no Airflow.

Three steps, each testable on its own:

* :func:`gpu_statuses` / :func:`cluster_facts`: the inventory plus the ledger's reservations
  and evictions as one JSON-ready dict (what ``/hetero-gpu/api/cluster`` returns);
* :func:`topology_svg`: the cluster's networkx graph drawn as inline SVG (switch tiers above
  hosts, hosts as boxes, GPUs inside coloured by state, NVLink and PCIe links drawn apart);
* :func:`render_page`: the HTML page around both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape
from typing import TYPE_CHECKING, Any, Collection, Iterable, Mapping, Sequence
from urllib.parse import quote

if TYPE_CHECKING:
    import networkx as nx

    from airflow_hetero_gpu.core.cluster import Cluster
    from airflow_hetero_gpu.ledger.records import Eviction, Reservation

# GPU states, in the order they win when several hold (a sick GPU that is reserved is shown sick,
# and still labelled with its job).
STATES = ("unhealthy", "evicted", "reserved", "busy", "available")
STATE_TEXT = {
    "unhealthy": "unhealthy (capture)",
    "evicted": "evicted (ledger)",
    "reserved": "reserved",
    "busy": "busy (load above threshold)",
    "available": "available",
}
LINK_KINDS = ("nvlink", "pcie-switch", "pcie-host-bridge", "cpu")
LINK_TEXT = {
    "nvlink": "NVLink (NV#, width by bond count)",
    "pcie-switch": "PCIe switch (PIX, PXB)",
    "pcie-host-bridge": "PCIe host bridge (PHB)",
    "cpu": "CPU interconnect (NODE, SYS): not drawn",
}


def link_kind(label: str) -> str:
    """How a ``topo -m`` label is drawn: ``nvlink``, ``pcie-switch``, ``pcie-host-bridge`` or ``cpu``."""
    text = (label or "").strip().upper()
    if text.startswith("NV"):
        return "nvlink"
    if text in ("PIX", "PXB"):
        return "pcie-switch"
    if text == "PHB":
        return "pcie-host-bridge"
    return "cpu"


def nvlink_bonds(label: str) -> int:
    digits = "".join(ch for ch in label[2:] if ch.isdigit())
    return int(digits) if digits else 1


# --- facts ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuStatus:
    """What the page shows of one GPU: its state, load, holder and why it is out."""

    state: str
    load: float
    job: str | None = None
    reasons: tuple[str, ...] = ()  # unhealthy reasons from the capture
    evicted: tuple[str, ...] | None = None  # eviction reasons from the ledger; None: not evicted
    available: bool = False


def gpu_statuses(
    cluster: "Cluster",
    reserved: Mapping[tuple[str, int], str] | None = None,
    evicted: Mapping[tuple[str, int], Sequence[str]] | None = None,
) -> dict[tuple[str, int], GpuStatus]:
    """Every GPU's status with the ledger applied (the planner's own availability rules)."""
    from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
    from airflow_hetero_gpu.core.planner import cluster_state

    reserved = {GpuKey(*k): v for k, v in (reserved or {}).items()}
    evicted = {GpuKey(*k): tuple(v) for k, v in (evicted or {}).items()}
    state = cluster_state(cluster, PlanRequest(1), reserved, evicted)
    out: dict[tuple[str, int], GpuStatus] = {}
    for i, gpu in enumerate(cluster.gpus):
        key = gpu.key
        if not gpu.healthy:
            name = "unhealthy"
        elif key in evicted:
            name = "evicted"
        elif key in reserved:
            name = "reserved"
        elif bool(state.busy[i]):
            name = "busy"
        else:
            name = "available"
        out[key] = GpuStatus(
            state=name,
            load=float(state.load[i]),
            job=reserved.get(key),
            reasons=tuple(gpu.reasons),
            evicted=evicted.get(key),
            available=bool(state.available[i]),
        )
    return out


def run_path(dag_id: str, run_id: str) -> str:
    """The Airflow UI path of a DAG run (relative to the UI's base URL)."""
    return f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def task_path(dag_id: str, run_id: str, task_id: str, map_index: int | None = None) -> str:
    path = f"{run_path(dag_id, run_id)}/tasks/{quote(task_id, safe='')}"
    if map_index is not None and map_index >= 0:
        path += f"/mapped/{map_index}"
    return path


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.isoformat()


def reservation_facts(res: "Reservation", *, show_identity: bool = True) -> dict:
    """A live reservation as the page and the JSON show it, with links to its DAG run."""
    out = res.to_json()
    ident = res.identity
    out["identity_hidden"] = False
    out["run_path"] = out["task_path"] = None
    if ident is not None and not show_identity:
        out["identity"] = None
        out["identity_hidden"] = True
    elif ident is not None and ident.dag_id and ident.run_id:
        out["run_path"] = run_path(ident.dag_id, ident.run_id)
        if ident.task_id:
            out["task_path"] = task_path(ident.dag_id, ident.run_id, ident.task_id, ident.map_index)
    return out


def cluster_facts(
    cluster: "Cluster | None",
    reservations: Iterable["Reservation"] = (),
    evictions: Iterable["Eviction"] = (),
    *,
    sources: Mapping[str, Any] | None = None,
    visible_dag_ids: set[str] | None = None,
    now: datetime | None = None,
) -> dict:
    """Everything the page shows, as one JSON-ready dict.

    ``cluster`` is None when there is no inventory yet (the pools, hosts and GPUs are empty);
    ``sources`` says where the facts came from and what went wrong reading them;
    ``visible_dag_ids``: the DAGs the viewer may read (None: all). A reservation of another
    DAG keeps its job id and GPUs but not its DAG run.
    """
    now = now or datetime.now(timezone.utc)
    reservations = list(reservations)
    evictions = list(evictions)
    reserved = {g.key: r.job_id for r in reservations for g in r.gpus}
    evicted = {e.key: tuple(e.reasons) for e in evictions}
    facts: dict[str, Any] = {
        "generated_at": _iso(now),
        "sources": dict(sources or {}),
        "thresholds": None,
        "switches": [],
        "hosts": [],
        "pools": [],
        "gpus": [],
        "reservations": [
            reservation_facts(
                r,
                show_identity=(
                    visible_dag_ids is None or r.identity is None or (r.identity.dag_id in visible_dag_ids)
                ),
            )
            for r in reservations
        ],
        "evictions": [e.to_json() for e in evictions],
    }
    if cluster is None:
        return facts
    statuses = gpu_statuses(cluster, reserved, evicted)
    th = cluster.config.thresholds
    facts["thresholds"] = {"busy_utilization": th.busy_utilization, "full_utilization": th.full_utilization,
                           "max_temperature_c": th.max_temperature_c}
    pool_of = {g.key: cluster.pool_of_gpu(g.key).id for g in cluster.gpus}
    for gpu in cluster.gpus:
        st = statuses[gpu.key]
        facts["gpus"].append({
            **gpu.to_json(),
            "pool": pool_of[gpu.key],
            "load": round(st.load, 4),
            "state": st.state,
            "available": st.available,
            "reserved_by": st.job,
            "evicted": list(st.evicted) if st.evicted is not None else None,
        })
    for pool in cluster.pools:
        keys = [cluster.gpus[int(i)].key for i in pool.positions]
        sts = [statuses[k] for k in keys]
        facts["pools"].append({
            "pool": pool.id,
            "card_type": pool.card_type,
            "task_types": list(pool.task_types),
            "hosts": sorted({k[0] for k in keys}),
            "gpus": len(keys),
            "healthy": sum(1 for s in sts if s.state not in ("unhealthy", "evicted")),
            "available": sum(1 for s in sts if s.available),
            "reserved": sum(1 for s in sts if s.job is not None),
            "evicted": sum(1 for s in sts if s.evicted is not None),
            "unhealthy": sum(1 for s in sts if s.reasons),
        })
    by_host: dict[str, list] = {}
    for gpu in cluster.gpus:
        by_host.setdefault(gpu.host, []).append(gpu)
    for host in cluster.hosts:
        gpus = by_host.get(host, [])
        wiring = cluster.wiring.get(host)
        present = {g.index for g in gpus}
        links = []
        if wiring is not None:
            idx = [i for i in wiring.indices if i in present]
            links = [{"a": a, "b": b, "link": wiring.label(a, b)} for n, a in enumerate(idx) for b in idx[n + 1:]]
        facts["hosts"].append({
            "host": host,
            "error": cluster.host_errors.get(host),
            "notes": list(cluster.host_notes.get(host, [])),
            "gpus": len(gpus),
            "card_types": sorted({g.name for g in gpus}),
            "switches": cluster.net.groups_of(host),
            "links": links,
        })
    graph = cluster.graph
    for node, attrs in graph.nodes(data=True):
        if attrs.get("kind") != "switch":
            continue
        parent = next(
            (o[1] for o in graph.neighbors(node)
             if isinstance(o, tuple) and o[0] == "switch" and graph.nodes[o].get("tier", 0) > attrs.get("tier", 0)),
            None,
        )
        hosts = sorted(o[1] for o in graph.neighbors(node) if isinstance(o, tuple) and o[0] == "host")
        facts["switches"].append({"switch": node[1], "tier": attrs.get("tier"), "parent": parent, "hosts": hosts})
    facts["switches"].sort(key=lambda s: (-(s["tier"] or 0), s["switch"]))
    return facts


# --- the topology picture -------------------------------------------------------------------
GPU_W, GPU_H = 72, 46
HOST_PAD, HOST_HEAD = 12, 40
HOST_GAP = 20
SWITCH_H, LEVEL_GAP = 26, 58
MARGIN = 16
LEGEND_H = 54
LEGEND_ROW = 22  # one more legend row (the highlight)

SVG_STYLE = """
.hg-topology text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;fill:#1f2933}
.hg-host rect.hg-box{fill:#f6f7f9;stroke:#9aa0a6;stroke-width:1.2}
.hg-host.hg-host-error rect.hg-box{stroke:#c0262d;stroke-dasharray:6 4;fill:#fff5f5}
.hg-host .hg-host-name{font-size:13px;font-weight:600}
.hg-host .hg-host-sub{font-size:11px;fill:#52606d}
.hg-host .hg-host-err{font-size:11px;fill:#c0262d}
.hg-switch rect{fill:#e8edf3;stroke:#4a5568;stroke-width:1}
.hg-switch text{font-size:11px}
.hg-uplink{stroke:#9ca3af;stroke-width:1.4;fill:none}
.hg-link{fill:none;stroke-linecap:round}
.hg-link.hg-nvlink{stroke:#2f855a;stroke-opacity:.6}
.hg-link.hg-pcie-switch{stroke:#6b7280;stroke-width:1.6;stroke-dasharray:6 4}
.hg-link.hg-pcie-host-bridge{stroke:#6b7280;stroke-width:1.6;stroke-dasharray:2 4}
.hg-gpu rect.hg-node{stroke-width:1.6}
.hg-gpu text{font-size:10.5px;text-anchor:middle}
.hg-gpu .hg-gpu-name{font-weight:600}
.hg-gpu .hg-gpu-job{fill:#1d4ed8;font-weight:600}
.hg-gpu .hg-gpu-why{fill:#9b1c1c}
.hg-gpu rect.hg-load-bg{fill:#ffffff;stroke:none;opacity:.8}
.hg-gpu rect.hg-load{fill:#374151;stroke:none}
.hg-state-available rect.hg-node{fill:#d8f3dc;stroke:#2d6a4f}
.hg-state-busy rect.hg-node{fill:#fff3bf;stroke:#b08900}
.hg-state-reserved rect.hg-node{fill:#dbe7ff;stroke:#1d4ed8}
.hg-state-evicted rect.hg-node{fill:#ffe3cc;stroke:#c2410c;stroke-dasharray:4 2}
.hg-state-unhealthy rect.hg-node{fill:#ffd6d6;stroke:#c0262d;stroke-width:2.4}
.hg-mark circle{fill:#c0262d;stroke:#fff;stroke-width:1}
.hg-gpu .hg-mark text{fill:#fff;font-size:9px;font-weight:700}
.hg-legend text{font-size:11px}
.hg-chosen-ring{fill:none;stroke:#7c3aed;stroke-width:3}
.hg-link.hg-chosen-link{stroke:#7c3aed;stroke-opacity:.85}
"""


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def _num(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _ring(n: int) -> tuple[float, list[tuple[float, float]]]:
    """Radius and node centres (relative to the ring's centre) of n GPUs on a ring."""
    if n <= 0:
        return 0.0, []
    if n == 1:
        return 0.0, [(0.0, 0.0)]
    chord = max(GPU_W + 12, (GPU_H + 10) * math.sqrt(2))
    radius = chord / 2 if n == 2 else chord / (2 * math.sin(math.pi / n))
    start = math.pi if n == 2 else -math.pi / 2 - math.pi / n
    return radius, [
        (radius * math.cos(start + 2 * math.pi * i / n), radius * math.sin(start + 2 * math.pi * i / n))
        for i in range(n)
    ]


def _short_card(name: str) -> str:
    for prefix in ("NVIDIA ", "Tesla ", "GeForce "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name


@dataclass
class _HostBox:
    name: str
    error: str | None
    gpus: list[tuple[tuple[str, int], dict]]
    width: float = 0.0
    height: float = 0.0
    x: float = 0.0
    y: float = 0.0
    radius: float = 0.0
    centres: list[tuple[float, float]] | None = None
    subtitle: str = ""
    _mid_x: float = 0.0
    _top_y: float = 0.0

    @property
    def error_line(self) -> str:
        return _clip(f"unreachable: {self.error}", 48) if self.error else ""

    def measure(self) -> None:
        n = len(self.gpus)
        self.radius, self.centres = _ring(n)
        cards: dict[str, int] = {}
        for _, attrs in self.gpus:
            card = _short_card(str(attrs.get("name", "")))
            cards[card] = cards.get(card, 0) + 1
        self.subtitle = ", ".join(f"{c} \u00d7 {name}" for name, c in cards.items()) or "no GPUs"
        xs = [x for x, _ in self.centres] or [0.0]
        ys = [y for _, y in self.centres] or [0.0]
        self._mid_x = (min(xs) + max(xs)) / 2
        self._top_y = min(ys)
        ring_w = max(xs) - min(xs) + GPU_W if n else 0
        ring_h = max(ys) - min(ys) + GPU_H if n else 0
        text_w = max(len(self.name) * 8.0, len(self.subtitle) * 6.2, len(self.error_line) * 6.2, 150)
        self.width = max(ring_w, text_w) + 2 * HOST_PAD
        self.height = HOST_HEAD + (ring_h + HOST_PAD if n else 4) + HOST_PAD + (16 if self.error else 0)

    @property
    def centre_x(self) -> float:
        return self.x + self.width / 2

    def gpu_centre(self, i: int) -> tuple[float, float]:
        dx, dy = self.centres[i]
        top = self.y + HOST_HEAD + HOST_PAD + GPU_H / 2
        return self.centre_x + dx - self._mid_x, top + dy - self._top_y


def _host_order(graph: "nx.Graph", hosts: list[str]) -> list[str]:
    """Hosts in the order a depth-first walk of the switch tree meets them (neighbours adjacent)."""
    switches = {n: a for n, a in graph.nodes(data=True) if a.get("kind") == "switch"}

    def children(sw):
        tier = switches[sw].get("tier", 0)
        subs = sorted(o for o in graph.neighbors(sw) if o in switches and switches[o].get("tier", 0) < tier)
        hs = sorted(o[1] for o in graph.neighbors(sw) if isinstance(o, tuple) and o[0] == "host")
        return subs, hs

    def is_root(sw):
        tier = switches[sw].get("tier", 0)
        return not any(o in switches and switches[o].get("tier", 0) > tier for o in graph.neighbors(sw))

    order: list[str] = []
    seen: set[str] = set()

    def walk(sw):
        subs, hs = children(sw)
        for s in subs:
            walk(s)
        for h in hs:
            if h not in seen:
                seen.add(h)
                order.append(h)

    for sw in sorted((s for s in switches if is_root(s)), key=lambda s: (-switches[s].get("tier", 0), s[1])):
        walk(sw)
    order.extend(h for h in hosts if h not in seen)
    return [h for h in order if h in set(hosts)]


def topology_svg(graph: "nx.Graph", statuses: Mapping[tuple[str, int], GpuStatus] | None = None,
                 *, title: str | None = None, highlight: Iterable[tuple[str, int]] | None = None,
                 highlight_label: str = "chosen GPUs") -> str:
    """Draw the cluster graph (:attr:`Cluster.graph`) as a standalone SVG document fragment.

    Hosts are boxes in one row, the GPUs inside on a ring, coloured by state (``statuses``;
    without it by health alone); NVLink pairs are solid green lines whose width grows with the
    bond count, PCIe switch pairs dashed and host-bridge pairs dotted; pairs that only meet
    across the CPU interconnect (NODE, SYS) are not drawn. Switch tiers sit above the hosts,
    tier 1 lowest. Every element carries classes and ``data-`` attributes naming what it is.

    ``highlight``: GPUs (``(host, index)``, e.g. a decision's) ringed in purple (class
    ``hg-chosen``, ``data-chosen="true"``), the drawn links between two of them recoloured
    (``hg-chosen-link``), and a legend row saying ``highlight_label``. Keys not in the graph are
    ignored.
    """
    statuses = statuses or {}
    chosen = {(str(h), int(i)) for h, i in highlight} if highlight is not None else None
    legend_h = LEGEND_H + (LEGEND_ROW if chosen is not None else 0)
    host_nodes = {n[1]: a for n, a in graph.nodes(data=True) if a.get("kind") == "host"}
    gpus_by_host: dict[str, list] = {h: [] for h in host_nodes}
    for n, a in graph.nodes(data=True):
        if a.get("kind") == "gpu":
            gpus_by_host.setdefault(n[0], []).append((tuple(n), a))
    for lst in gpus_by_host.values():
        lst.sort(key=lambda item: item[0][1])
    order = _host_order(graph, sorted(gpus_by_host))
    switches = {n: a for n, a in graph.nodes(data=True) if a.get("kind") == "switch"}
    top_tier = max((a.get("tier", 1) for a in switches.values()), default=0)

    boxes: dict[str, _HostBox] = {}
    x = MARGIN
    hosts_top = MARGIN + legend_h + (top_tier * LEVEL_GAP if top_tier else 0)
    for h in order:
        box = _HostBox(h, (host_nodes.get(h) or {}).get("error"), gpus_by_host.get(h, []))
        box.measure()
        box.x, box.y = x, hosts_top
        boxes[h] = box
        x += box.width + HOST_GAP
    width = max(x - HOST_GAP + MARGIN, LEGEND_W + 2 * MARGIN)
    height = hosts_top + max((b.height for b in boxes.values()), default=40) + MARGIN

    # switch positions: tier t at a fixed row, centred over what hangs below it
    sw_pos: dict[Any, tuple[float, float, float]] = {}  # node -> (centre x, top y, width)

    def sw_y(tier: int) -> float:
        return MARGIN + legend_h + (top_tier - tier) * LEVEL_GAP

    def place(sw) -> float | None:
        if sw in sw_pos:
            return sw_pos[sw][0]
        tier = switches[sw].get("tier", 1)
        xs = []
        for o in graph.neighbors(sw):
            if o in switches and switches[o].get("tier", 0) < tier:
                c = place(o)
                if c is not None:
                    xs.append(c)
            elif isinstance(o, tuple) and o[0] == "host" and o[1] in boxes:
                xs.append(boxes[o[1]].centre_x)
        if not xs:
            return None
        cx = sum(xs) / len(xs)
        sw_pos[sw] = (cx, sw_y(tier), max(len(str(sw[1])) * 6.6 + 34, 70))
        return cx

    for sw in sorted(switches, key=lambda s: (switches[s].get("tier", 0), s[1])):
        place(sw)
    spare = width - MARGIN
    for sw in sorted(switches, key=lambda s: s[1]):  # switches with nothing below them: far right
        if sw not in sw_pos:
            w = max(len(str(sw[1])) * 6.6 + 34, 70)
            spare -= w
            sw_pos[sw] = (spare + w / 2, sw_y(switches[sw].get("tier", 1)), w)
            spare -= 10

    out: list[str] = []
    w_, h_ = _num(width), _num(height)
    out.append(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="hg-topology" width="{w_}" height="{h_}" '
        f'viewBox="0 0 {w_} {h_}" role="img" aria-label="{escape(title or "GPU cluster topology")}">'
    )
    out.append(f"<title>{escape(title or 'GPU cluster topology')}</title>")
    out.append(f"<style>{SVG_STYLE}</style>")
    out.append(_legend(highlight_label if chosen is not None else None))

    # uplinks first, under everything
    out.append('<g class="hg-uplinks">')
    for a, b, attrs in graph.edges(data=True):
        if attrs.get("kind") != "uplink":
            continue
        ends = []
        for node in (a, b):
            if node in sw_pos:
                cx, top, _w = sw_pos[node]
                ends.append(("switch", node, cx, top, top + SWITCH_H))
            elif isinstance(node, tuple) and node[0] == "host" and node[1] in boxes:
                box = boxes[node[1]]
                ends.append(("host", node, box.centre_x, box.y, box.y + box.height))
            else:
                ends.append(None)
        if None in ends:
            continue
        lower, upper = sorted(ends, key=lambda e: -e[3])  # the one drawn lower hangs below
        out.append(
            f'<line class="hg-uplink" data-from="{escape(str(lower[1][1]))}" data-to="{escape(str(upper[1][1]))}" '
            f'x1="{_num(lower[2])}" y1="{_num(lower[3])}" x2="{_num(upper[2])}" y2="{_num(upper[4])}"/>'
        )
    out.append("</g>")

    for sw, (cx, top, w) in sorted(sw_pos.items(), key=lambda kv: (kv[1][1], kv[1][0])):
        tier = switches[sw].get("tier", 1)
        name = str(sw[1])
        out.append(
            f'<g class="hg-switch" data-switch="{escape(name)}" data-tier="{tier}">'
            f"<title>switch {escape(name)}, tier {tier}</title>"
            f'<rect x="{_num(cx - w / 2)}" y="{_num(top)}" width="{_num(w)}" height="{SWITCH_H}" rx="5"/>'
            f'<text x="{_num(cx)}" y="{_num(top + 17)}" text-anchor="middle">'
            f"T{tier} \u00b7 {escape(_clip(name, 32))}</text></g>"
        )

    for h in order:
        out.append(_host_svg(graph, boxes[h], statuses, chosen or ()))
    out.append("</svg>")
    return "".join(out)


LEGEND_W = max(
    sum(24 + len(STATE_TEXT[s]) * 6.0 for s in STATES),
    sum(44 + len(LINK_TEXT[k]) * 6.0 for k in LINK_KINDS),
)


def _legend(highlight_label: str | None = None) -> str:
    parts = ['<g class="hg-legend" transform="translate(%d,%d)">' % (MARGIN, MARGIN)]
    x = 0
    for state in STATES:
        parts.append(
            f'<g class="hg-gpu hg-state-{state}"><rect class="hg-node" x="{x}" y="0" width="14" height="12" rx="2"/></g>'
            f'<text x="{x + 19}" y="10">{escape(STATE_TEXT[state])}</text>'
        )
        x += 24 + len(STATE_TEXT[state]) * 6.0
    x = 0
    for kind in LINK_KINDS:
        y = 30
        if kind == "nvlink":
            parts.append(f'<line class="hg-link hg-nvlink" x1="{x}" y1="{y}" x2="{x + 26}" y2="{y}" stroke-width="3.5"/>')
        elif kind != "cpu":
            parts.append(f'<line class="hg-link hg-{kind}" x1="{x}" y1="{y}" x2="{x + 26}" y2="{y}"/>')
        parts.append(f'<text x="{x + (32 if kind != "cpu" else 0)}" y="{y + 4}">{escape(LINK_TEXT[kind])}</text>')
        x += 44 + len(LINK_TEXT[kind]) * 6.0
    if highlight_label is not None:
        y = 30 + LEGEND_ROW
        parts.append(f'<rect class="hg-chosen-ring" x="1" y="{y - 7}" width="14" height="12" rx="3"/>'
                     f'<line class="hg-link hg-chosen-link" x1="20" y1="{y - 1}" x2="40" y2="{y - 1}" stroke-width="3"/>'
                     f'<text x="46" y="{y + 3}">{escape(highlight_label)}</text>')
    parts.append("</g>")
    return "".join(parts)


def _gpu_title(key: tuple[str, int], attrs: Mapping[str, Any], st: GpuStatus | None) -> str:
    bits = [f"{key[0]} GPU{key[1]}", str(attrs.get("name", ""))]
    if attrs.get("pool"):
        bits.append(f"pool {attrs['pool']}")
    if st is not None:
        bits.append(f"load {st.load:.0%}")
        bits.append(STATE_TEXT.get(st.state, st.state))
        if st.job:
            bits.append(f"reserved by {st.job}")
        if st.evicted is not None:
            bits.append("evicted: " + (", ".join(st.evicted) or "no reason recorded"))
    reasons = list(attrs.get("reasons") or ())
    if reasons:
        bits.append("unhealthy: " + ", ".join(reasons))
    return " \u00b7 ".join(b for b in bits if b)


def _host_svg(graph: "nx.Graph", box: _HostBox, statuses: Mapping[tuple[str, int], GpuStatus],
              chosen: Collection[tuple[str, int]] = ()) -> str:
    cls = "hg-host" + (" hg-host-error" if box.error else "")
    out = [f'<g class="{cls}" data-host="{escape(box.name)}">']
    tip = f"host {box.name}: {box.subtitle}" + (f" \u00b7 collection failed: {box.error}" if box.error else "")
    out.append(f"<title>{escape(tip)}</title>")
    out.append(
        f'<rect class="hg-box" x="{_num(box.x)}" y="{_num(box.y)}" width="{_num(box.width)}" '
        f'height="{_num(box.height)}" rx="8"/>'
    )
    out.append(f'<text class="hg-host-name" x="{_num(box.x + HOST_PAD)}" y="{_num(box.y + 18)}">{escape(box.name)}</text>')
    out.append(f'<text class="hg-host-sub" x="{_num(box.x + HOST_PAD)}" y="{_num(box.y + 33)}">{escape(box.subtitle)}</text>')
    if box.error:  # on the last line of the box, below any GPUs
        y = box.y + box.height - HOST_PAD
        out.append(
            f'<text class="hg-host-err" x="{_num(box.x + HOST_PAD)}" y="{_num(y)}">'
            f"{escape(box.error_line)}</text>"
        )
    index_of = {key: i for i, (key, _) in enumerate(box.gpus)}
    # links under the GPUs; NVLink last so it lies on top of PCIe
    links = []
    for key, _ in box.gpus:
        for other, attrs in graph[key].items():
            if attrs.get("kind") != "link" or other not in index_of or index_of[other] <= index_of[key]:
                continue
            label = str(attrs.get("link", ""))
            kind = link_kind(label)
            if kind == "cpu":
                continue
            links.append((0 if kind != "nvlink" else 1, key, other, label, kind))
    links.sort(key=lambda t: (t[0], t[1][1], t[2][1]))
    for _, a, b, label, kind in links:
        (x1, y1), (x2, y2) = box.gpu_centre(index_of[a]), box.gpu_centre(index_of[b])
        extra = ""
        both = (a[0], a[1]) in chosen and (b[0], b[1]) in chosen
        if kind == "nvlink":
            extra = f' stroke-width="{_num(1.0 + 0.6 * math.sqrt(min(nvlink_bonds(label), 18)))}"'
        out.append(
            f'<line class="hg-link hg-{kind}{" hg-chosen-link" if both else ""}" data-link="{escape(label)}" '
            f'data-a="{a[1]}" data-b="{b[1]}"{extra} '
            f'x1="{_num(x1)}" y1="{_num(y1)}" x2="{_num(x2)}" y2="{_num(y2)}">'
            f"<title>{escape(box.name)} GPU{a[1]} \u2194 GPU{b[1]}: {escape(label)}</title></line>"
        )
    for i, (key, attrs) in enumerate(box.gpus):
        st = statuses.get(key)
        state = st.state if st is not None else ("available" if attrs.get("healthy", True) else "unhealthy")
        load = st.load if st is not None else None
        cx, cy = box.gpu_centre(i)
        x0, y0 = cx - GPU_W / 2, cy - GPU_H / 2
        job = st.job if st is not None else None
        picked = (key[0], key[1]) in chosen
        data = f' data-gpu="{escape(key[0])}:{key[1]}" data-state="{state}"'
        if job:
            data += f' data-job="{escape(job)}"'
        if picked:
            data += ' data-chosen="true"'
        out.append(f'<g class="hg-gpu hg-state-{state}{" hg-chosen" if picked else ""}"{data}>')
        out.append(f"<title>{escape(_gpu_title(key, attrs, st))}</title>")
        if picked:
            out.append(f'<rect class="hg-chosen-ring" x="{_num(x0 - 4)}" y="{_num(y0 - 4)}" '
                       f'width="{GPU_W + 8}" height="{GPU_H + 8}" rx="8"/>')
        out.append(f'<rect class="hg-node" x="{_num(x0)}" y="{_num(y0)}" width="{GPU_W}" height="{GPU_H}" rx="5"/>')
        head = f"GPU{key[1]}" + (f" {load:.0%}" if load is not None else "")
        out.append(f'<text class="hg-gpu-name" x="{_num(cx)}" y="{_num(y0 + 13)}">{escape(head)}</text>')
        why = list(attrs.get("reasons") or ()) or (list(st.evicted or ()) if st is not None and st.evicted is not None else [])
        if state in ("unhealthy", "evicted"):
            text = ",".join(why) or state
            out.append(f'<text class="hg-gpu-why" x="{_num(cx)}" y="{_num(y0 + 25)}">{escape(_clip(text, 11))}</text>')
        if state == "unhealthy":  # a badge on the node's top-right corner
            bx, by = x0 + GPU_W - 1, y0 + 1
            out.append(
                f'<g class="hg-mark"><circle cx="{_num(bx)}" cy="{_num(by)}" r="6.5"/>'
                f'<text x="{_num(bx)}" y="{_num(by + 3.5)}">\u2715</text></g>'
            )
        if job:
            out.append(f'<text class="hg-gpu-job" x="{_num(cx)}" y="{_num(y0 + 37)}">{escape(_clip(job, 11))}</text>')
        if load is not None:
            out.append(
                f'<rect class="hg-load-bg" x="{_num(x0 + 4)}" y="{_num(y0 + GPU_H - 6)}" width="{GPU_W - 8}" height="3"/>'
                f'<rect class="hg-load" x="{_num(x0 + 4)}" y="{_num(y0 + GPU_H - 6)}" '
                f'width="{_num((GPU_W - 8) * max(0.0, min(1.0, load)))}" height="3"/>'
            )
        out.append("</g>")
    out.append("</g>")
    return "".join(out)


# --- the HTML page -----------------------------------------------------------------------------
PAGE_STYLE = """
:root{color-scheme:light}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 20px;color:#1f2933;
background:#fff;font-size:14px}
h1{font-size:20px;margin:0 0 4px}
h2{font-size:16px;margin:22px 0 8px;border-bottom:1px solid #e4e7eb;padding-bottom:4px}
nav a{margin-right:12px}
a{color:#1d4ed8}
.hg-muted{color:#616e7c}
.hg-notice{border-left:4px solid #b08900;background:#fffbea;padding:8px 12px;margin:8px 0}
.hg-notice.hg-error{border-color:#c0262d;background:#fff5f5}
table{border-collapse:collapse;margin:4px 0 8px}
th,td{border-bottom:1px solid #e4e7eb;padding:4px 10px;text-align:left;vertical-align:top;white-space:nowrap}
td.hg-wrap{white-space:normal;min-width:12em}
.hg-table{overflow-x:auto}
th{background:#f5f7fa;font-weight:600;position:sticky;top:0}
td.hg-n,th.hg-n{text-align:right;font-variant-numeric:tabular-nums}
.hg-pill{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;border:1px solid}
.hg-pill.hg-state-available{background:#d8f3dc;border-color:#2d6a4f}
.hg-pill.hg-state-busy{background:#fff3bf;border-color:#b08900}
.hg-pill.hg-state-reserved{background:#dbe7ff;border-color:#1d4ed8}
.hg-pill.hg-state-evicted{background:#ffe3cc;border-color:#c2410c}
.hg-pill.hg-state-unhealthy{background:#ffd6d6;border-color:#c0262d}
.hg-bar{display:inline-block;width:60px;height:8px;background:#e4e7eb;border-radius:4px;vertical-align:middle;
margin-right:6px;overflow:hidden}
.hg-bar span{display:block;height:100%;background:#374151}
.hg-figure{overflow-x:auto;border:1px solid #e4e7eb;border-radius:6px;padding:4px}
.hg-figure svg{max-width:100%;height:auto}
code{font-size:12.5px}
"""


# Inside the Airflow UI the page runs in a sandboxed iframe (scripts and same origin allowed, top
# navigation not), so a target="_top" link to a DAG run is refused by the browser. The page's
# links to UI pages therefore follow themselves through a link in the parent document, which is
# the same origin. Standalone (not framed) or framed by another origin, links behave as written.
UI_LINK_SCRIPT = """
(function () {
  if (window.top === window) return;
  var topDoc;
  try { topDoc = window.top.document; } catch (e) { return; }
  document.addEventListener("click", function (ev) {
    var a = ev.target && ev.target.closest ? ev.target.closest("a[data-ui-link]") : null;
    if (!a || ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
    ev.preventDefault();
    var link = topDoc.createElement("a");
    link.href = a.href;
    link.style.display = "none";
    topDoc.body.appendChild(link);
    link.click();
    link.remove();
  });
})();
"""


def _ago(iso: str | None, now: datetime) -> str:
    if not iso:
        return ""
    try:
        t = datetime.fromisoformat(iso)
    except ValueError:
        return ""
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    s = (now - t).total_seconds()
    future = s < 0
    s = abs(s)
    if s < 90:
        text = f"{s:.0f} s"
    elif s < 5400:
        text = f"{s / 60:.0f} min"
    elif s < 172800:
        text = f"{s / 3600:.1f} h"
    else:
        text = f"{s / 86400:.1f} d"
    return f"in {text}" if future else f"{text} ago"


def _when(iso: str | None, now: datetime) -> str:
    if not iso:
        return '<span class="hg-muted">\u2013</span>'
    short = iso.replace("T", " ")[:19]
    return f'<span title="{escape(iso)}">{escape(short)}</span> <span class="hg-muted">({escape(_ago(iso, now))})</span>'


def _pill(state: str) -> str:
    return f'<span class="hg-pill hg-state-{escape(state)}">{escape(state)}</span>'


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: Iterable[int] = (),
           cls: str = "") -> str:
    numeric = set(numeric)
    head = "".join(f'<th{" class=hg-n" if i in numeric else ""}>{escape(h)}</th>' for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f'<td{" class=hg-n" if i in numeric else ""}>{c}</td>' for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f'<div class="hg-table"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _sources_html(sources: Mapping[str, Any], now: datetime) -> str:
    out = []
    cap = sources.get("captures") or {}
    led = sources.get("ledger") or {}
    items = []
    if cap.get("path"):
        line = f"Inventory: <code>{escape(str(cap['path']))}</code>"
        if cap.get("collected_at"):
            line += f", newest capture {_when(cap['collected_at'], now)}"
        items.append(line)
    if led.get("url") or led.get("conn_id"):
        what = f"connection <code>{escape(led['conn_id'])}</code>" if led.get("conn_id") else ""
        if led.get("url"):
            what += (" \u2192 " if what else "") + f"<code>{escape(str(led['url']))}</code>"
        items.append(f"Ledger: {what}")
    if items:
        out.append('<p class="hg-muted">' + " \u00b7 ".join(items) + "</p>")
    for src in (cap, led):
        if src.get("message"):
            cls = "hg-notice" + (" hg-error" if src.get("status") == "error" else "")
            out.append(f'<div class="{cls}">{escape(str(src["message"]))}</div>')
    return "".join(out)


def render_page(facts: Mapping[str, Any], svg: str | None, *, ui_base: str = "", refresh_seconds: int = 0,
                api_path: str = "api/cluster") -> str:
    """The cluster page: sources, pools, topology, reservations, evictions and every GPU."""
    now = datetime.fromisoformat(facts["generated_at"]) if facts.get("generated_at") else datetime.now(timezone.utc)
    ui_base = ui_base.rstrip("/")
    parts: list[str] = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                        '<meta name="viewport" content="width=device-width, initial-scale=1">',
                        "<title>GPU cluster</title>"]
    if refresh_seconds and refresh_seconds > 0:
        parts.append(f'<meta http-equiv="refresh" content="{int(refresh_seconds)}">')
    parts.append(f"<style>{PAGE_STYLE}</style></head><body>")
    gpus = facts.get("gpus") or []
    n_res = len(facts.get("reservations") or [])
    n_ev = len(facts.get("evictions") or [])
    counts = {s: sum(1 for g in gpus if g.get("state") == s) for s in STATES}
    parts.append("<h1>GPU cluster</h1>")
    summary = (
        f"{len(facts.get('hosts') or [])} hosts, {len(gpus)} GPUs in {len(facts.get('pools') or [])} pools: "
        + ", ".join(f"{counts[s]} {s}" for s in STATES)
        + f"; {n_res} live reservation{'s' if n_res != 1 else ''}, {n_ev} eviction{'s' if n_ev != 1 else ''}."
    )
    parts.append(f"<p>{escape(summary)} <span class=\"hg-muted\">As of {_when(facts.get('generated_at'), now)}."
                 f" <a href=\"{escape(api_path)}\">JSON</a></span></p>")
    parts.append('<nav><a href="#pools">Pools</a><a href="#topology">Topology</a>'
                 '<a href="#reservations">Reservations</a><a href="#evictions">Evictions</a>'
                 '<a href="#gpus">GPUs</a></nav>')
    parts.append(_sources_html(facts.get("sources") or {}, now))

    # pools
    parts.append('<h2 id="pools">Pools</h2>')
    pools = facts.get("pools") or []
    if pools:
        parts.append(_table(
            ["Pool", "Card type", "Task types", "Hosts", "GPUs", "Healthy", "Available", "Reserved", "Evicted"],
            [[f"<code>{escape(p['pool'])}</code>", escape(p["card_type"]), escape(", ".join(p["task_types"])),
              escape(", ".join(p["hosts"])), str(p["gpus"]), str(p["healthy"]), str(p["available"]),
              str(p["reserved"]), str(p["evicted"])] for p in pools],
            numeric=range(4, 9), cls="hg-pools",
        ))
        parts.append('<p class="hg-muted">Healthy: not unhealthy in the last capture and not evicted. '
                     "Available: healthy, not reserved and loaded at most "
                     f"{escape(_pct((facts.get('thresholds') or {}).get('busy_utilization')))}.</p>")
    else:
        parts.append('<p class="hg-muted">No inventory, so no pools.</p>')
    errors = [h for h in facts.get("hosts") or [] if h.get("error")]
    if errors:
        parts.append("<p><strong>Hosts whose collection failed:</strong></p>")
        parts.append(_table(["Host", "Reason"], [[escape(h["host"]), escape(h["error"])] for h in errors],
                            cls="hg-host-errors"))

    # topology
    parts.append('<h2 id="topology">Topology</h2>')
    if svg:
        parts.append(f'<div class="hg-figure">{svg}</div>')
    else:
        parts.append('<p class="hg-muted">No inventory to draw.</p>')

    # reservations
    parts.append('<h2 id="reservations">Live reservations</h2>')
    res = facts.get("reservations") or []
    if res:
        rows = []
        for r in res:
            ident = r.get("identity") or {}
            if r.get("identity_hidden"):
                dag = run = task = '<span class="hg-muted">hidden (no access to the DAG)</span>'
                try_ = ""
            else:
                dag = escape(ident.get("dag_id") or "") or '<span class="hg-muted">\u2013</span>'
                run = escape(ident.get("run_id") or "")
                if r.get("run_path"):
                    run = f'<a target="_top" data-ui-link href="{escape(ui_base + r["run_path"])}">{run}</a>'
                task = escape(ident.get("task_id") or "")
                if ident.get("map_index") is not None and ident.get("map_index") >= 0:
                    task += f" [{ident['map_index']}]"
                if r.get("task_path"):
                    task = f'<a target="_top" data-ui-link href="{escape(ui_base + r["task_path"])}">{task}</a>'
                try_ = "" if ident.get("try_number") is None else str(ident["try_number"])
            gpus_txt = ", ".join(f"{g['host']}:{g['index']}" for g in r.get("gpus") or [])
            rows.append([f"<code>{escape(r['job_id'])}</code>", f"<code>{escape(r['pool'])}</code>",
                         escape(gpus_txt), dag, run, task, try_,
                         _when(r.get("created_at"), now), _when(r.get("renewed_at"), now),
                         _when(r.get("expires_at"), now)])
        parts.append(_table(["Job", "Pool", "GPUs", "DAG", "Run", "Task", "Try", "Created", "Renewed",
                             "Lease expires"], rows, numeric=[6], cls="hg-reservations"))
    else:
        parts.append('<p class="hg-muted">No live reservations.</p>')

    # evictions
    parts.append('<h2 id="evictions">Evictions</h2>')
    evs = facts.get("evictions") or []
    if evs:
        parts.append(_table(
            ["GPU", "UUID", "Reasons", "Evicted", "Last check", "Healthy checks since"],
            [[escape(f"{e['host']}:{e['index']}"), f"<code>{escape(e.get('uuid') or '')}</code>",
              escape(", ".join(e.get("reasons") or [])), _when(e.get("evicted_at"), now),
              _when(e.get("checked_at"), now), str(e.get("healthy_checks", 0))] for e in evs],
            numeric=[5], cls="hg-evictions",
        ))
    else:
        parts.append('<p class="hg-muted">No GPU is evicted.</p>')

    # GPUs
    parts.append('<h2 id="gpus">GPUs</h2>')
    if gpus:
        rows = []
        for g in gpus:
            load = g.get("load") or 0.0
            bar = f'<span class="hg-bar"><span style="width:{load * 100:.0f}%"></span></span>{load:.0%}'
            health = "yes" if g.get("healthy") else f"<strong>no</strong>: {escape(', '.join(g.get('reasons') or []))}"
            if g.get("evicted") is not None:
                health += f"; evicted: {escape(', '.join(g['evicted']) or 'no reason recorded')}"
            mem = ""
            if g.get("memory_total_mib") is not None:
                mem = f"{_n(g.get('memory_used_mib'))} / {_n(g['memory_total_mib'])}"
            rows.append([escape(g["host"]), str(g["index"]), escape(g["name"]), f"<code>{escape(g['pool'])}</code>",
                         bar, _pct(g.get("utilization")), mem, _n(g.get("temperature_c")), _n(g.get("power_w")),
                         health, _pill(g["state"]),
                         f"<code>{escape(g['reserved_by'])}</code>" if g.get("reserved_by") else ""])
        parts.append(_table(["Host", "GPU", "Card type", "Pool", "Load", "Util", "Memory MiB", "Temp \u00b0C",
                             "Power W", "Healthy", "State", "Reserved by"], rows, numeric=[1, 5, 6, 7, 8],
                            cls="hg-gpus"))
    else:
        parts.append('<p class="hg-muted">No inventory yet.</p>')
    parts.append(f"<script>{UI_LINK_SCRIPT}</script>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:.0%}"


def _n(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 or abs(x) >= 100 else f"{x:.1f}"
