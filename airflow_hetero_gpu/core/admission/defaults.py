"""The admission pass's default settings, apart from the code that uses them (no numpy here):
the command line builds its help from them without loading the pass."""

from __future__ import annotations

DEFAULT_AGING_INTERVAL_S = 3600.0  # one priority level per hour waited
DEFAULT_MIN_RUNTIME_S = 600.0
DEFAULT_PREEMPTION_DELAY_S = 60.0
DEFAULT_PREEMPTION_GRACE_S = 300.0
