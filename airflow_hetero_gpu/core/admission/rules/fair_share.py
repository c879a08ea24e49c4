"""The fair-share rule (docs/teams.md): with teams, the queue is walked in two stages.

1. **Within quota**: the queue in its order; the quota rule defers the jobs that fit no pool within
   their team's unused quota.
2. **Borrowing**: the deferred jobs team by team, the team with the lowest fair-share value first
   (asked again after every job that starts; ties to the job first in the queue, then the name).

So an in-quota job is never held behind a borrowing job's claim (borrowers claim after every
in-quota job of the pass).
"""

from __future__ import annotations

from typing import Callable, Sequence

from airflow_hetero_gpu.core.admission.model import QueueEntry
from airflow_hetero_gpu.core.admission.records import Item, Outcome, Stage


class FairShareOrder:
    """The two-stage walk; ``team_of(entry)`` names an entry's team, ``share(team)`` its current
    fair-share value (lower goes first)."""

    def __init__(self, team_of: Callable[[QueueEntry], str], share: Callable[[str], float]) -> None:
        self.team_of = team_of
        self.share = share

    def walk(self, walk, entries: Sequence[QueueEntry], visit: Callable[[Item], Outcome]) -> None:
        deferred: list[Item] = []
        for rank, entry in enumerate(entries, 1):
            item = Item(rank, entry, self.team_of(entry), Stage.WITHIN_QUOTA)
            if visit(item) is Outcome.DEFERRED:
                deferred.append(Item(item.rank, item.entry, item.team, Stage.BORROWING))
        self.borrowers(deferred, visit)

    def borrowers(self, deferred: Sequence[Item], visit: Callable[[Item], Outcome]) -> None:
        by_team: dict[str, list[Item]] = {}
        for item in deferred:
            by_team.setdefault(item.team, []).append(item)
        while by_team:
            team = min(by_team, key=lambda t: (self.share(t), by_team[t][0].rank, t))
            queue = by_team[team]
            while queue:
                if visit(queue.pop(0)) is Outcome.STARTED:
                    break
            if not queue:
                del by_team[team]
