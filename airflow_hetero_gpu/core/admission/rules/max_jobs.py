"""The ``max_jobs`` rule (docs/teams.md; Slurm's GrpJobs): a team that sets ``max_jobs`` runs at
most that many jobs at once; its next job waits (``waits: team intern runs its 4 of max_jobs 4``)
and claims nothing, whatever GPUs are free.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

import numpy as np

from airflow_hetero_gpu.core.admission.model import ReasonKind
from airflow_hetero_gpu.core.admission.records import Item, Reason, Verdict
from airflow_hetero_gpu.core.admission.rules.base import Rule


class MaxJobsRule(Rule):
    """``caps``: team -> its max_jobs (teams without one are absent); ``team_of``: running job ->
    team (every job holding GPUs)."""

    def __init__(self, caps: Mapping[str, int], team_of: Mapping[str, str]) -> None:
        self.caps = dict(caps)
        self.running = Counter(t for t in team_of.values() if t in self.caps)

    def refusal(self, team: str | None) -> Reason | None:
        """Why ``team`` may start no job now (None: it may)."""
        cap = self.caps.get(team)
        runs = self.running[team]
        if cap is None or runs < cap:
            return None
        return Reason(ReasonKind.MAX_JOBS, f"team {team} runs its {runs} of max_jobs {cap}")

    def verdict(self, walk, item: Item, shape) -> Verdict | None:
        why = self.refusal(item.team)
        return None if why is None else Verdict(np.zeros_like(shape.ok), refusal=why)

    def started(self, walk, item: Item, admitted, pool: int) -> None:
        if item.team in self.caps:
            self.running[item.team] += 1


def max_jobs_rule(teams, team_of: Mapping[str, str]) -> MaxJobsRule | None:
    """The rule for ``teams`` (None when no team sets max_jobs: the rule is absent)."""
    caps = {name: tq.max_jobs for name, tq in teams.teams.items() if getattr(tq, "max_jobs", None) is not None}
    return MaxJobsRule(caps, team_of) if caps else None
