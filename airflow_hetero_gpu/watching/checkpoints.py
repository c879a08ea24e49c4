"""The newest checkpoint a running job reported, told to the ledger at its lease renewals (a
preemption's record says which checkpoint the job kept; docs/preemption.md)."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

#: what a training script prints when it saved a checkpoint (the example scripts do)
CHECKPOINT_LINE = re.compile(r"\bcheckpoint of epoch (\d+) (?:saved|kept)\b")


class CheckpointSeen:
    """The newest checkpoint the job reported (``checkpoint of epoch N saved``, printed by its
    rank 0, on whichever host the rendezvous put it)."""

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.at: datetime | None = None
        self.host: str | None = None
        self.noted: datetime | None = None  # the last one written to the ledger

    def line(self, host: str, text: str) -> None:
        m = CHECKPOINT_LINE.search(text)
        if m:
            self.epoch, self.at, self.host = int(m.group(1)), datetime.now(timezone.utc), host

    def note(self, ledger: Any, job_id: str) -> None:
        """Tell the ledger of a checkpoint it has not heard of yet (at a lease renewal)."""
        if self.at is not None and self.at != self.noted:
            ledger.note_checkpoint(job_id, self.at)
            self.noted = self.at
