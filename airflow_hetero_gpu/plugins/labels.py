"""Short texts the page shows: job labels that tell jobs apart, times, numbers, card names.

Pure functions; the templates use them as Jinja2 filters (:mod:`.render`).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Iterable

from airflow_hetero_gpu import durations

_SEP = re.compile(r"([._\-:/@+]+)")
ELLIPSIS = "\u2026"


def _tokens(job_id: str) -> list[str]:
    return [t for t in _SEP.split(job_id) if t]


def _middle(text: str, width: int, tail: int) -> str:
    """``text`` cut to ``width`` characters with an ellipsis in the middle, ``tail`` kept at the end."""
    if len(text) <= width:
        return text
    tail = max(1, min(tail, width - 2))
    return text[: width - 1 - tail] + ELLIPSIS + text[-tail:]


def job_labels(job_ids: Iterable[str], width: int = 11) -> dict[str, str]:
    """A label of at most ``width`` characters per job id that tells the jobs apart.

    Job ids of one deployment tend to share a long beginning (``default_job_id`` writes
    ``<dag>.<task>.<hash of the run>``, people write ``retrain-2025-06-01-a``), so cutting the
    id's end off gives every job the same label. The label keeps what differs: the tokens
    (split at ``. _ - : / @ +``) that all ids start with are dropped, then a label still too long
    is cut in the middle, keeping as much of its end as it takes for the labels to differ.
    A single job keeps its own id (cut in the middle when long).
    """
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    toks = {j: _tokens(j) for j in ids}
    common = 0
    if len(ids) > 1:
        shortest = min(len(t) for t in toks.values())
        while common < shortest - 1 and len({tuple(t[: common + 1]) for t in toks.values()}) == 1:
            common += 1
        while common and _SEP.fullmatch(toks[ids[0]][common - 1]) is None:  # cut after a separator
            common -= 1
    rest = {j: "".join(toks[j][common:]).lstrip("._-:/@+") or j for j in ids}
    for tail in range(max(1, width // 2 - 1), width - 1):
        labels = {j: _middle(r, width, tail) for j, r in rest.items()}
        if len(set(labels.values())) == len(labels):
            return labels
    return {j: _middle(r, width, width - 2) for j, r in rest.items()}


def clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + ELLIPSIS


def short_card(name: str) -> str:
    """``NVIDIA A100-SXM4-80GB`` -> ``A100-SXM4-80GB`` (the vendor's prefix says little)."""
    for prefix in ("NVIDIA ", "Tesla ", "GeForce "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name


def short_pool(pool_id: str) -> str:
    """A pool id without the vendor prefix of its card type (``cv+finetune@RTX 4090``)."""
    if "@" in pool_id:
        tasks, card = pool_id.rsplit("@", 1)
        return f"{tasks}@{short_card(card)}"
    return short_card(pool_id)


def parse_time(value: str | datetime | None) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        t = value
    else:
        try:
            t = datetime.fromisoformat(value)
        except ValueError:
            return None
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``6h00m``, ``3d04h``: the one format of :mod:`airflow_hetero_gpu.durations`."""
    return durations.duration(seconds)


def hours(h: float) -> str:
    """A window length: ``1 h``, ``6 h``, ``24 h``, ``3 d``, ``7 d``."""
    return f"{h / 24:g} d" if h > 24 and h % 24 == 0 else f"{h:g} h"


def ago(iso: str | datetime | None, now: datetime) -> str:
    """``3 min ago`` / ``in 4 min`` relative to ``now``."""
    t = parse_time(iso)
    if t is None:
        return ""
    s = (now - t).total_seconds()
    return f"in {duration(s)}" if s < 0 else f"{duration(s)} ago"


def stamp(iso: str | datetime | None) -> str:
    """``2025-06-01 11:00:00`` (UTC as stored)."""
    t = parse_time(iso)
    return "" if t is None else t.isoformat().replace("T", " ")[:19]


def pct(x: float | None) -> str:
    return "" if x is None else f"{x:.0%}"


def num(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 or abs(x) >= 100 else f"{x:.1f}"


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"
