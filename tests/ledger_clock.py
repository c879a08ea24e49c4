"""A clock a test moves by hand, for a ledger built with ``clock=``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

START = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


class Clock:
    def __init__(self, now: datetime = START):
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    """A :class:`Clock` at :data:`START` (import it beside ``Clock`` to use it)."""
    return Clock()
