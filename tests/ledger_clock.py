"""A clock a test moves by hand, for a ledger built with ``clock=``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

START = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


class Clock:
    def __init__(self, now: datetime = START):
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
