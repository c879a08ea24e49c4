"""The wiring picture's legend: what the GPU colours and the link styles mean.

The style sheet it relies on is the picture's own (:data:`.topology_svg.SVG_STYLE`).
"""

from __future__ import annotations

from html import escape

from airflow_hetero_gpu.plugins.model import STATE_TEXT, STATES

MARGIN = 16
LEGEND_H = 54
LEGEND_ROW = 22  # one more legend row (the highlight)
LINK_KINDS = ("nvlink", "pcie-switch", "pcie-host-bridge", "cpu")
LINK_TEXT = {
    "nvlink": "NVLink (NV#, width by bond count)",
    "pcie-switch": "PCIe switch (PIX, PXB)",
    "pcie-host-bridge": "PCIe host bridge (PHB)",
    "cpu": "CPU interconnect (NODE, SYS): not drawn",
}


LEGEND_W = max(
    sum(24 + len(STATE_TEXT[s]) * 6.0 for s in STATES),
    sum(44 + len(LINK_TEXT[k]) * 6.0 for k in LINK_KINDS),
)


def legend(highlight_label: str | None = None) -> str:
    """The legend group (state swatches, link kinds, the highlight row when labelled)."""
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
