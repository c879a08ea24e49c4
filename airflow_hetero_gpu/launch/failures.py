"""How a launch fails, in one line each: a host that could not start, a host whose process
failed, a job that was killed, and the summary of a failed host's last output lines."""

from __future__ import annotations

import re
from typing import Sequence

_ROOT_CAUSE = "Root Cause (first observed failure):"
# the line a program prints when it fails: ``ValueError: …``, ``prog: error: …``, ``python: can't
# open file '…': [Errno 2] No such file or directory``; not a traceback's indented frames
_ERROR_LINE = re.compile(r"^(?=\S).*?(?:\b[A-Za-z_][\w.]*(?:Error|Exception)\b|\berror\b|\bfatal\b|can't open file"
                         r"|No such file or directory|Permission denied)", re.IGNORECASE)


def looks_like_error(line: str) -> bool:
    """Whether a line of a worker's stderr reads like the error it failed with."""
    return bool(_ERROR_LINE.match(line)) and not line.startswith("Traceback (most recent call last)")
_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(-?\d+)")


def summarize_tail(tail: Sequence[str]) -> str | None:
    """One line that says why a host failed: torchrun's root cause when its failure report is
    in the tail (``torchrun root cause: rank 3 exitcode 3``), else the last line with text."""
    for start in range(len(tail) - 1, -1, -1):
        if tail[start].strip() == _ROOT_CAUSE:
            found: dict[str, str] = {}
            for line in tail[start + 1:start + 12]:
                match = _FIELD.match(line)
                if match:
                    found.setdefault(match.group(1), match.group(2))
            if found:
                return "torchrun root cause: " + " ".join(f"{k} {v}" for k, v in sorted(found.items(), reverse=True))
            break
    return next((line.strip() for line in reversed(tail) if any(c.isalnum() for c in line)), None)


class JobStartError(RuntimeError):
    """The job could not be started on ``host``; nothing of it is left running."""

    def __init__(self, host: str, reason: str):
        reason = " ".join(reason.split())
        super().__init__(f"cannot start on {host}: {reason}")
        self.host = host
        self.reason = reason


class JobFailure(RuntimeError):
    """A host's process exited non-zero (or vanished): the job failed there.

    ``str()`` is one line; ``tail`` holds the host's last output lines.
    """

    def __init__(self, host: str, rank: int, exit_code: int | None, tail: Sequence[str],
                 reason: str | None = None):
        status = f"exited with status {exit_code}" if exit_code is not None else (reason or "ended without an exit status")
        summary = summarize_tail(tail)
        super().__init__(f"worker on {host} (node rank {rank}) {status}" + (f"; {summary}" if summary else ""))
        self.host = host
        self.rank = rank
        self.exit_code = exit_code
        self.tail = list(tail)
        self.summary = summary


class JobKilled(RuntimeError):
    """The job was stopped by :meth:`RemoteJob.kill` before it finished."""


__all__ = ["JobFailure", "JobKilled", "JobStartError", "failure_message", "looks_like_error", "summarize_tail"]


def failure_message(job_id: str, res) -> str:
    """One line: the first host that failed with the first error line its workers printed, every
    other host that failed with torchrun's root cause (the crash may have started there: a dying
    peer makes the others fail too). The hosts' output is in the task log above it."""
    f = res.failure
    others = [
        f"{r.host} exited with {r.exit_code}" + (f" ({summarize_tail(r.tail)})" if summarize_tail(r.tail) else "")
        for r in res.hosts if r.host != f.host and r.exit_code not in (0, None)
    ]
    first_error = next((r.first_error for r in res.hosts if r.host == f.host and r.first_error), None) \
        or next((r.first_error for r in res.hosts if r.first_error), None)
    head = f"job {job_id}: worker on {f.host} (node rank {f.rank}) exited with {f.exit_code} first"
    if first_error:
        head += f": {first_error}"
    if f.summary:
        head += f" ({f.summary})"
    if others:
        head += "; also failed: " + "; ".join(others)
    return f"{head}. The other hosts were stopped; their output is in the task log above."
