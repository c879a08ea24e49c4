"""The queue's admission rule, pure: who of the waiting jobs starts now, and which GPUs are held
for the heads (docs/queue.md).

    result = admit(cluster, entries, now=time.time(), reserved=..., evicted=...)
    for a in result.admitted: ...        # start a.job_id on a.gpus (a.decision is plan()'s)
    for w in result.waiting: ...         # w.position, w.state, w.reason, w.claim (heads)

Plain data in, plain data out: the ledger calls it inside the transaction that read the rows.
The names below are imported when first used (:mod:`airflow_hetero_gpu.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_hetero_gpu.lazy import exports

if TYPE_CHECKING:
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
    from airflow_hetero_gpu.core.admission.rules.team_quota import QuotaInput
    from airflow_hetero_gpu.core.admission.preemption import (
        DEFAULT_MIN_RUNTIME_S, DEFAULT_PREEMPTION_DELAY_S, DEFAULT_PREEMPTION_GRACE_S, Preemption, PreemptionRules,
        RunningJob,
    )

_WHERE = {
    **dict.fromkeys(("Admission", "admit"), "rule"),
    **dict.fromkeys(("STATES", "AdmissionResult", "Admitted", "Claim", "QueueEntry", "Waiting", "describe_gpus"),
                    "model"),
    **dict.fromkeys(("DEFAULT_AGING_INTERVAL_S", "effective_priority", "ordered", "passing_window_s", "rank_key"),
                    "order"),
    **dict.fromkeys(("Placement", "Placer", "PlannerPlacer"), "placer"),
    **dict.fromkeys(("BucketStanding", "QuotaBook"), "quota"),
    **dict.fromkeys(("DEFAULT_TEAM", "DEFAULT_USAGE_HALF_LIFE_S", "TeamQuota", "Teams", "TeamsError",
                     "teams_from_mapping", "teams_from_text"), "teams"),
    "QuotaInput": "rules.team_quota",
    **dict.fromkeys(("DEFAULT_MIN_RUNTIME_S", "DEFAULT_PREEMPTION_DELAY_S", "DEFAULT_PREEMPTION_GRACE_S", "Preemption",
                     "PreemptionRules", "RunningJob"), "preemption"),
}

__all__ = sorted(_WHERE)
__getattr__, __dir__ = exports(__name__, _WHERE)
