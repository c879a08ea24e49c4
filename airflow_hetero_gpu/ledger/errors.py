"""The ledger's error types: one line each, naming the value at fault."""

from __future__ import annotations

from airflow_hetero_gpu.errors import HeteroGpuError


class LedgerError(HeteroGpuError):
    """The ledger could not do what was asked (bad URL, unreachable database, bad argument...)."""


class LedgerUpgraded(LedgerError):
    """A newer release upgraded the ledger while this process ran: its writes are refused
    (nothing of them is written) until it is restarted with the new package (docs/operations.md)."""


class LedgerUrlError(LedgerError):
    """A ledger URL that is malformed or names a database the ledger does not support."""


class MissingLedger(LedgerError):
    """The URL names a SQLite file that does not exist (a reader, or a writer told not to create one)."""


class NoLiveReservation(LedgerError):
    """The job holds no live reservation: it was released, or its lease expired."""

    def __init__(self, job_id: str, action: str):
        self.job_id = job_id
        super().__init__(
            f"cannot {action} job {job_id!r}: it holds no live reservation (released, or its lease expired)"
        )


class ReservationConflict(LedgerError):
    """A live reservation under this job id exists for a different request."""


class QuotaRefused(LedgerError):
    """A direct reservation the team's quota does not allow now (docs/teams.md); not a mistake in
    the request: the CLI prints the quota's standing and exits 3, as for no capacity."""
