"""The wiring picture: a cluster graph (``Cluster.graph``, networkx) drawn as inline SVG.

Switch tiers above hosts, hosts as boxes in one row, the GPUs of a host on a ring inside it,
coloured by state, labelled with their utilization as collected and the short label of the job
holding them; NVLink and PCIe links drawn apart. Every element carries classes and ``data-``
attributes naming what it is (``data-host``, ``data-gpu``, ``data-state``, ``data-job``,
``data-link``, ``data-switch``, ``data-tier``), which the tests and scripts read.

The page draws one host at a time (its host page, the job view, the small-fleet wiring grid);
``/hetero-gpu/topology.svg`` draws the whole graph. Colours are CSS custom properties with the
light theme as fallback, so the picture follows the page's theme inline and stays readable as a
standalone file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any, Collection, Iterable, Mapping

from airflow_hetero_gpu.plugins.labels import clip as _clip
from airflow_hetero_gpu.plugins.labels import short_card as _short_card
from airflow_hetero_gpu.plugins.model import STATE_TEXT
from airflow_hetero_gpu.plugins.svg_legend import LEGEND_H, LEGEND_ROW, LEGEND_W, MARGIN
from airflow_hetero_gpu.plugins.svg_legend import legend as _legend

if TYPE_CHECKING:
    import networkx as nx

    from airflow_hetero_gpu.plugins.model import GpuStatus

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



# --- the topology picture -------------------------------------------------------------------
GPU_W, GPU_H = 72, 46
HOST_PAD, HOST_HEAD = 12, 40
HOST_GAP = 20
SWITCH_H, LEVEL_GAP = 26, 58

SVG_STYLE = """
.hg-topology text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;fill:var(--hg-fg,#1f2933)}
.hg-host rect.hg-box{fill:var(--hg-panel,#f6f7f9);stroke:var(--hg-border-strong,#9aa0a6);stroke-width:1.2}
.hg-host.hg-host-error rect.hg-box{stroke:var(--hg-bad,#c0262d);stroke-dasharray:6 4;fill:var(--hg-bad-bg,#fff5f5)}
.hg-host .hg-host-name{font-size:13px;font-weight:600}
.hg-host .hg-host-sub{font-size:11px;fill:var(--hg-muted,#52606d)}
.hg-host .hg-host-err{font-size:11px;fill:var(--hg-bad,#c0262d)}
.hg-switch rect{fill:var(--hg-switch,#e8edf3);stroke:var(--hg-switch-stroke,#4a5568);stroke-width:1}
.hg-switch text{font-size:11px}
.hg-uplink{stroke:var(--hg-uplink,#9ca3af);stroke-width:1.4;fill:none}
.hg-link{fill:none;stroke-linecap:round}
.hg-link.hg-nvlink{stroke:var(--hg-nvlink,#2f855a);stroke-opacity:.6}
.hg-link.hg-pcie-switch{stroke:var(--hg-pcie,#6b7280);stroke-width:1.6;stroke-dasharray:6 4}
.hg-link.hg-pcie-host-bridge{stroke:var(--hg-pcie,#6b7280);stroke-width:1.6;stroke-dasharray:2 4}
.hg-gpu rect.hg-node{stroke-width:1.6}
.hg-gpu text{font-size:10.5px;text-anchor:middle;fill:var(--hg-node-fg,#1f2933)}
.hg-gpu .hg-gpu-name{font-weight:600}
.hg-gpu .hg-gpu-job{fill:var(--hg-job,#1d4ed8);font-weight:600}
.hg-gpu .hg-gpu-why{fill:var(--hg-why,#9b1c1c)}
.hg-gpu rect.hg-load-bg{fill:var(--hg-bar-bg,#ffffff);stroke:none;opacity:.8}
.hg-gpu rect.hg-load{fill:var(--hg-bar,#374151);stroke:none}
.hg-state-available rect.hg-node{fill:var(--hg-available-bg,#d8f3dc);stroke:var(--hg-available,#2d6a4f)}
.hg-state-busy rect.hg-node{fill:var(--hg-busy-bg,#fff3bf);stroke:var(--hg-busy,#b08900)}
.hg-state-drained rect.hg-node{fill:var(--hg-drained-bg,#ede4ff);stroke:var(--hg-drained,#6d28d9);stroke-dasharray:2 2}
.hg-state-reserved rect.hg-node{fill:var(--hg-reserved-bg,#dbe7ff);stroke:var(--hg-reserved,#1d4ed8)}
.hg-state-evicted rect.hg-node{fill:var(--hg-evicted-bg,#ffe3cc);stroke:var(--hg-evicted,#c2410c);stroke-dasharray:4 2}
.hg-state-unhealthy rect.hg-node{fill:var(--hg-unhealthy-bg,#ffd6d6);stroke:var(--hg-unhealthy,#c0262d);stroke-width:2.4}
.hg-mark circle{fill:#c0262d;stroke:#fff;stroke-width:1}
.hg-gpu .hg-mark text{fill:#fff;font-size:9px;font-weight:700}
.hg-legend text{font-size:11px}
.hg-chosen-ring{fill:none;stroke:var(--hg-chosen,#7c3aed);stroke-width:3}
.hg-link.hg-chosen-link{stroke:var(--hg-chosen,#7c3aed);stroke-opacity:.85}
"""


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
                 highlight_label: str = "chosen GPUs", legend: bool = True) -> str:
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

    ``legend=False``: no legend (a page that draws several pictures shows one legend of its own).
    """
    statuses = statuses or {}
    chosen = {(str(h), int(i)) for h, i in highlight} if highlight is not None else None
    legend_h = (LEGEND_H + (LEGEND_ROW if chosen is not None else 0)) if legend else 0
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
    width = max(x - HOST_GAP + MARGIN, (LEGEND_W + 2 * MARGIN) if legend else 0)
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
    if legend:
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


def _gpu_title(key: tuple[str, int], attrs: Mapping[str, Any], st: GpuStatus | None) -> str:
    bits = [f"{key[0]} GPU{key[1]}", str(attrs.get("name", ""))]
    if attrs.get("pool"):
        bits.append(f"pool {attrs['pool']}")
    util = attrs.get("utilization")
    bits.append("utilization n/a" if util is None else f"utilization {util:.0%}")
    if st is not None:
        bits.append(f"planner load {st.load:.0%}")
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
        util = attrs.get("utilization")
        cx, cy = box.gpu_centre(i)
        x0, y0 = cx - GPU_W / 2, cy - GPU_H / 2
        job = st.job if st is not None else None
        picked = (key[0], key[1]) in chosen
        data = f' data-gpu="{escape(key[0])}:{key[1]}" data-state="{state}"'
        if util is not None:
            data += f' data-util="{util:.4g}"'
        if st is not None:
            data += f' data-load="{st.load:.4g}"'
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
        head = f"GPU{key[1]}" + (f" {util:.0%}" if util is not None else "")
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
            label = (st.label if st is not None else None) or _clip(job, 11)
            out.append(f'<text class="hg-gpu-job" x="{_num(cx)}" y="{_num(y0 + 37)}">{escape(label)}</text>')
        if util is not None:  # a bar of the utilization as collected
            fill = max(0.0, min(1.0, util))
            out.append(
                f'<rect class="hg-load-bg" x="{_num(x0 + 4)}" y="{_num(y0 + GPU_H - 6)}" width="{GPU_W - 8}" height="3"/>'
                f'<rect class="hg-load" x="{_num(x0 + 4)}" y="{_num(y0 + GPU_H - 6)}" '
                f'width="{_num((GPU_W - 8) * fill)}" height="3"/>'
            )
        out.append("</g>")
    out.append("</g>")
    return "".join(out)




def host_subgraph(graph: "nx.Graph", hosts: Iterable[str], *, switches: bool = True) -> "nx.Graph":
    """The part of ``graph`` that draws ``hosts``: their host nodes, GPUs and (``switches``) every
    switch above them, with the links and uplinks between those."""
    nodes: set = set()
    climb: list = []
    for h in set(hosts):
        node = ("host", h)
        if node not in graph:
            continue
        nodes.add(node)
        for o in graph.neighbors(node):
            kind = graph.nodes[o].get("kind")
            if kind == "gpu":
                nodes.add(o)
            elif kind == "switch" and switches:
                climb.append(o)
    while climb:
        sw = climb.pop()
        if sw in nodes:
            continue
        nodes.add(sw)
        tier = graph.nodes[sw].get("tier", 0)
        climb.extend(p for p in graph.neighbors(sw)
                     if graph.nodes[p].get("kind") == "switch" and graph.nodes[p].get("tier", 0) > tier)
    return graph.subgraph(nodes)


def legend_svg(highlight_label: str | None = None) -> str:
    """The picture's legend on its own, for a page that draws hosts with ``legend=False``."""
    h = LEGEND_H - MARGIN + (LEGEND_ROW if highlight_label is not None else 0)
    w = _num(LEGEND_W + 2 * MARGIN)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="hg-topology hg-legend-only" width="{w}" height="{h}" '
            f'viewBox="0 0 {w} {h}" role="img" aria-label="legend"><style>{SVG_STYLE}</style>'
            f"{_legend(highlight_label)}</svg>")
