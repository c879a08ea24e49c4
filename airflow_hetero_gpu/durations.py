"""Durations as every part of the package prints and reads them: ``45s``, ``3m05s``, ``6h00m``,
``3d04h`` (the queue, the page, drains' deadlines), and ``90s``, ``30m``, ``2h``, ``1d`` read back.

Standard library only."""

from __future__ import annotations

import math
import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: The longest duration read anywhere (a drain's deadline, a lease, the fair-share half-life): 365 days.
MAX_DURATION_S = 365 * 86400.0
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``6h00m``, ``3d04h`` (rounded down to the unit shown; the sign dropped)."""
    s = int(abs(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def parse_duration(text: str, max_s: float = MAX_DURATION_S) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``2h``, ``1d``, ``1h30m``; ValueError (one line naming
    the text) for anything else, zero, negative, or longer than ``max_s`` (365 days)."""
    spec = str(text).strip().lower()
    seconds: float | None = None
    try:
        seconds = float(spec)
    except ValueError:
        parts = _PART.findall(spec)
        if parts and "".join(n + u for n, u in parts) == spec:
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"expected a positive duration such as 90s, 30m, 2h or 1d, got {text!r}")
    return check_seconds(seconds, text, max_s)


def check_seconds(seconds: float, text: object = None, max_s: float = MAX_DURATION_S) -> float:
    """``seconds`` when it is finite and at most ``max_s``, else ValueError naming the value."""
    if not math.isfinite(seconds) or seconds > max_s:
        most = f"{max_s / 86400:g} days" if max_s >= 86400 else f"{max_s:g} s"
        raise ValueError(f"expected a duration of at most {most}, "
                         f"got {seconds if text is None else text!r}")
    return seconds


__all__ = ["MAX_DURATION_S", "check_seconds", "duration", "parse_duration"]
