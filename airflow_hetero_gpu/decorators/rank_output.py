"""What the ranks of a ``@task.hetero_train`` job say back through their output: rank 0's
return value and the ranks' errors, from the marked lines of
:mod:`airflow_hetero_gpu.decorators.host_runner` that carry this try's nonce.

The operator's line handler passes every worker line through :meth:`RankOutput.take`: a marked
line is kept here and not logged (text a rank printed before the mark on the same line is given
back to be logged), any other line is logged as it is. Lines arrive from one reader thread per
host and stream, hence the lock.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
from dataclasses import dataclass
from typing import Any

from airflow_hetero_gpu.decorators.host_runner import ERROR_MARK, RESULT_MARK

_CHUNK = re.compile(r"(\d+)/(\d+):([A-Za-z0-9+/=]*)$")


@dataclass(frozen=True)
class RankError:
    """One rank's failure, as it reported it."""

    host: str
    rank: int | None
    phase: str
    error: str
    where: str | None = None
    missing_module: str | None = None
    python: str | None = None

    def place(self) -> str:
        return f"{self.host}, rank {self.rank}" if self.rank is not None else self.host


class ResultMissing(RuntimeError):
    """The job ended well, but rank 0's return value did not come back whole."""


class RankOutput:
    """The marked lines of one try (``nonce``) of a function's job."""

    def __init__(self, nonce: str):
        self.nonce = nonce
        self._result_mark = f"{RESULT_MARK}:{nonce}:"
        self._error_mark = f"{ERROR_MARK}:{nonce}:"
        self._lock = threading.Lock()
        self._chunks: dict[int, str] = {}
        self._total: int | None = None
        self.errors: list[RankError] = []

    def new_run(self) -> None:
        """A new launch of the workers (a restart on a new GPU set): forget the earlier one's."""
        with self._lock:
            self._chunks, self._total, self.errors = {}, None, []

    def take(self, host: str, line: str) -> tuple[str | None, RankError | None]:
        """(the part of ``line`` to log, or None; the error the line reported, or None)."""
        for mark in (self._result_mark, self._error_mark):
            at = line.find(mark)
            if at < 0:
                continue
            before = line[:at] if line[:at].strip() else None
            body = line[at + len(mark):]
            if mark is self._result_mark:
                self._take_chunk(body)
                return before, None
            error = self._take_error(host, body)
            return before, error
        return line, None

    def _take_chunk(self, body: str) -> None:
        match = _CHUNK.match(body)
        if not match:
            return
        index, total, data = int(match.group(1)), int(match.group(2)), match.group(3)
        with self._lock:
            if index == 0 or self._total != total:  # a new value starts (rank 0 writes in order)
                self._chunks, self._total = {}, total
            self._chunks[index] = data

    def _take_error(self, host: str, body: str) -> RankError:
        try:
            record = json.loads(body)
            rank = record.get("rank")
            error = RankError(host=str(record.get("host") or host), rank=rank if isinstance(rank, int) else None,
                              phase=str(record.get("phase") or "running"), error=str(record.get("error") or "?"),
                              where=record.get("where"), missing_module=record.get("missing_module"),
                              python=record.get("python"))
        except (ValueError, AttributeError):
            error = RankError(host=host, rank=None, phase="running", error=body[:500])
        with self._lock:
            self.errors.append(error)
        return error

    def result(self) -> Any:
        """Rank 0's return value (decoded JSON); :class:`ResultMissing` when it is not whole."""
        with self._lock:
            chunks, total = dict(self._chunks), self._total
        if total is None:
            raise ResultMissing("rank 0 ended without reporting its return value")
        if len(chunks) != total:
            raise ResultMissing(f"rank 0's return value came back in {len(chunks)} of {total} parts")
        try:
            text = base64.b64decode("".join(chunks[i] for i in range(total)), validate=True).decode("utf-8")
            return json.loads(text)
        except (binascii.Error, ValueError, KeyError) as err:
            raise ResultMissing(f"rank 0's return value came back damaged: {err}") from None

    def failure_message(self, function: str, job_id: str) -> str | None:
        """One paragraph about the first rank that failed, or None when no rank reported one."""
        with self._lock:
            errors = list(self.errors)
        if not errors:
            return None
        first = errors[0]
        text = f"job {job_id}: function {function!r} failed on {first.place()}"
        if first.phase != "running":
            text += f" while {first.phase}"
        text += f": {first.error}"
        if first.where:
            text += f" (at {first.where})"
        if first.missing_module:
            text += (f". The hosts' Python ({first.python or 'python'} on {first.host}) has no module "
                     f"{first.missing_module!r}: install it on every host of the pool")
        others = [e for e in errors[1:] if (e.host, e.rank) != (first.host, first.rank)]
        if others:
            same = [e.place() for e in others if e.error == first.error]
            different = [f"{e.place()}: {e.error}" for e in others if e.error != first.error]
            if same:
                text += f"; the same on {'; '.join(same[:8])}" + (" …" if len(same) > 8 else "")
            if different:
                text += f"; after it: {'; '.join(different[:4])}" + (" …" if len(different) > 4 else "")
        return text + ". The other hosts were stopped; the ranks' tracebacks are in the task log."


__all__ = ["RankError", "RankOutput", "ResultMissing"]
