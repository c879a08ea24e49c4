"""The queue's admission rule, pure: who of the waiting jobs starts now, and which GPUs are held
for the heads (docs/queue.md).

    result = admit(cluster, entries, now=time.time(), reserved=..., evicted=...)
    for a in result.admitted: ...        # start a.job_id on a.gpus (a.decision is plan()'s)
    for w in result.waiting: ...         # w.position, w.state, w.reason, w.claim (heads)

Plain data in, plain data out: the ledger calls it inside the transaction that read the rows.
"""

from airflow_hetero_gpu.core.admission.rule import Admission, admit
from airflow_hetero_gpu.core.admission.model import (
    STATES, AdmissionResult, Admitted, Claim, QueueEntry, Waiting, describe_gpus,
)
from airflow_hetero_gpu.core.admission.order import (
    DEFAULT_AGING_INTERVAL_S, effective_priority, ordered, passing_window_s, rank_key,
)
from airflow_hetero_gpu.core.admission.placer import Placement, Placer, PlannerPlacer
from airflow_hetero_gpu.core.admission.quota import BucketStanding, QuotaBook
from airflow_hetero_gpu.core.admission.teams import (
    DEFAULT_TEAM, DEFAULT_USAGE_HALF_LIFE_S, TeamQuota, Teams, TeamsError, teams_from_mapping, teams_from_text,
)
from airflow_hetero_gpu.core.admission.teampass import QuotaInput
from airflow_hetero_gpu.core.admission.preemption import (
    DEFAULT_MIN_RUNTIME_S, DEFAULT_PREEMPTION_DELAY_S, DEFAULT_PREEMPTION_GRACE_S, Preemption, PreemptionRules,
    RunningJob,
)

__all__ = [
    "Admission", "admit", "STATES", "AdmissionResult", "Admitted", "Claim", "QueueEntry", "Waiting",
    "describe_gpus", "DEFAULT_AGING_INTERVAL_S", "effective_priority", "ordered", "passing_window_s",
    "rank_key", "Placement", "Placer", "PlannerPlacer", "DEFAULT_TEAM", "DEFAULT_USAGE_HALF_LIFE_S",
    "BucketStanding", "QuotaBook", "QuotaInput", "TeamQuota", "Teams", "TeamsError", "teams_from_mapping", "teams_from_text",
    "DEFAULT_MIN_RUNTIME_S", "DEFAULT_PREEMPTION_DELAY_S",
    "DEFAULT_PREEMPTION_GRACE_S", "Preemption", "PreemptionRules", "RunningJob",
]
