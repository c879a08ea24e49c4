"""Plain text forms shared by the command line, the operator's task log and the simulator's
report: left-aligned tables, numbers, and the readable form of a plan."""

from __future__ import annotations

from typing import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], width: int | None = None) -> str:
    """A plain left-aligned text table. With ``width`` (the terminal's), the last column wraps onto
    lines of its own indented under it, so that no line is wider (at least 30 characters of it
    per line, however narrow the terminal)."""
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    if width is not None and headers:
        start = sum(max([len(h)] + [len(r[i]) for r in cells]) + 2 for i, h in enumerate(headers[:-1]))
        room = max(30, width - start)
        wrapped = []
        for r in cells:
            parts = [r[-1]] if len(r[-1]) <= room else _wrap(r[-1], room)
            wrapped.append(r[:-1] + parts[:1])
            wrapped.extend([""] * (len(r) - 1) + [p] for p in parts[1:])
        cells = wrapped
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(list(headers)), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _wrap(text: str, room: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, room, break_on_hyphens=False) or [""]


def terminal_width() -> int | None:
    """The terminal's width when standard output is one (or ``COLUMNS`` is set), else None: a
    pipe or a file gets whole lines."""
    import os
    import shutil
    import sys

    if "COLUMNS" not in os.environ and not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


def fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def render_plan(result) -> str:
    """The readable form of a plan: the decision, every pool with stage/reason/score, the sick."""
    req = result.request
    lines = [
        "request: {} GPU{}{}{}{}".format(
            req.gpus, "s" if req.gpus > 1 else "",
            f", card type {' or '.join(req.gpu_types)}" if req.gpu_types else "",
            f", task type {req.task_type}" if req.task_type else "",
            f", {req.gpu_memory_mib:g} MiB free each" if req.gpu_memory_mib else "",
        )
    ]
    d = result.decision
    if d is None:
        lines.append("decision: no pool can host the job now")
    else:
        by_host: dict[str, list[str]] = {}
        for g in d.gpus:
            by_host.setdefault(g.host, []).append(str(g.index) if g.instance is None else f"{g.index} MIG {g.instance} ({g.uuid})")
        where = "; ".join(f"{h} GPU {','.join(ix)}" for h, ix in by_host.items())
        s = d.score
        lines.append(f"decision: pool {d.pool!r} -> {where}")
        lines.append(
            f"          E = {s.total:.4f}  (load balance {s.load_balance:.4f}, fragmentation "
            f"{s.fragmentation:.4f}, topology {s.topology:.4f}, free blocks {fmt(s.free_blocks, 4)}; "
            f"mean distance {d.mean_distance:.4g})"
        )
    lines.append("")
    rows = []
    for p in result.pools:
        sc = p.score
        rows.append((p.pool, p.stage, p.gpus, p.healthy, p.available,
                     fmt(sc.load_balance if sc else None), fmt(sc.fragmentation if sc else None),
                     fmt(sc.topology if sc else None), fmt(sc.free_blocks if sc else None),
                     fmt(sc.total if sc else None), p.reason or ""))
    lines.append(table(["POOL", "STAGE", "GPUS", "HEALTHY", "AVAIL", "LB", "FR", "TS", "FB", "E", "REASON"], rows))
    if result.unhealthy:
        lines.append("")
        lines.append("unhealthy: " + ", ".join(f"{g.host} GPU{g.index} ({'+'.join(g.reasons)})" for g in result.unhealthy))
    for host, err in sorted(result.host_errors.items()):
        lines.append(f"host {host}: collection failed: {err}")
    return "\n".join(lines)
