"""The preemption rule (docs/preemption.md): a job that cannot start may stop running jobs of
lower priority (of its own team with teams), and, when within its team's quota, jobs of other
teams that run on borrowed quota (a reclaim), and claim the GPUs they free. The decisions are
:class:`~airflow_hetero_gpu.core.admission.preemption.PassPreemption`'s; this module is how the
walk consults it.
"""

from __future__ import annotations

from airflow_hetero_gpu.core.admission.preemption import PassPreemption
from airflow_hetero_gpu.core.admission.records import Item, Stage
from airflow_hetero_gpu.core.admission.rules.base import Rule


class PreemptionRule(Rule):
    def __init__(self, pre: PassPreemption) -> None:
        self.pre = pre

    def blocked(self, walk, item: Item, shape):
        return self.pre.claim(walk.p, item.entry, shape, reclaim=item.stage is Stage.WITHIN_QUOTA)

    def finish(self, walk, result):
        return self.pre.annotate(result)
