"""What a finished job hands back: each host's outcome and the job's (JSON-able for XCom)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_hetero_gpu.launch.failures import JobFailure, JobKilled
from airflow_hetero_gpu.launch.orphans import SweepResult


@dataclass
class HostResult:
    """How one host's process ended. ``exit_code`` is None when no status came back (the
    connection was lost, or the process was killed by a signal before it could report)."""

    host: str
    rank: int
    exit_code: int | None
    seconds: float
    tail: list[str]
    pgid: int | None = None
    error: str | None = None
    first_error: str | None = None  # the first line of its stderr that reads like an error

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "rank": self.rank, "exit_code": self.exit_code,
                "seconds": round(self.seconds, 3), "tail": list(self.tail), "pgid": self.pgid,
                "error": self.error, "first_error": self.first_error}


@dataclass
class JobResult:
    """Every host's outcome; ``failure`` is the first host that failed on its own."""

    job_id: str
    hosts: list[HostResult]
    seconds: float
    failure: JobFailure | None = None
    killed: bool = False
    cleanup: dict[str, SweepResult] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None and not self.killed and all(h.exit_code == 0 for h in self.hosts)

    def __getitem__(self, host: str) -> HostResult:
        for result in self.hosts:
            if result.host == host:
                return result
        raise KeyError(host)

    def raise_for_failure(self) -> "JobResult":
        """Raise the :class:`JobFailure` (or :class:`JobKilled`) when the job did not succeed."""
        if self.failure is not None:
            raise self.failure
        if self.killed:
            raise JobKilled(f"job {self.job_id} was killed")
        for host in self.hosts:
            if host.exit_code != 0:
                raise JobFailure(host.host, host.rank, host.exit_code, host.tail, host.error)
        return self

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (for XCom)."""
        return {
            "job_id": self.job_id,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "killed": self.killed,
            "failure": None if self.failure is None else {
                "host": self.failure.host, "rank": self.failure.rank,
                "exit_code": self.failure.exit_code, "message": str(self.failure),
            },
            "hosts": [h.as_dict() for h in self.hosts],
        }


__all__ = ["HostResult", "JobResult"]
