"""The fleet day's contended corner: a card type of which only a few hosts are open.

A fleet of hundreds of hosts has idle GPUs all day, so quotas and preemption never act on it. A
day with ``DayConfig.contended_hosts = N`` drains every RTX 4090 host but the first ``N`` that
are not half busy (``hetero-gpu drain``: "maintenance"), gives research a quota of that card
type only (8 GPUs: elsewhere it borrows what no quota covers) and prod 4 of it beside its ``"*"``
quota, and opens the stream with a scripted burst on it:

* at 0 s, two 8-GPU runs of ``research`` of 90 s (its quota: 8 of RTX 4090): the second
  borrows, and the card type is full (with ``N = 2``);
* at 3 s, and not before both of research's jobs hold their GPUs, a 4-GPU run of ``prod``
  within its RTX 4090 quota of 4: it cannot start, so once the borrowers have run
  ``preemption_min_runtime`` and it has waited ``preemption_delay`` it reclaims its quota by
  preempting one of research's jobs (a *reclaim*), which goes back to the queue and runs again
  later. Its trigger waits on that event (the ledger's reservations), not on the clock alone: on
  a loaded machine Airflow may start the three tasks in any order, and a prod job admitted first
  leaves research's second job waiting with nothing to reclaim.

Only prod waits there, so the preemption is a reclaim whatever the order in which Airflow starts
the tasks (an urgent job of research waiting beside it could free the GPUs first by preempting
its own team's job, and prod would then start without a reclaim).

Faults are never injected on the contended hosts (a GPU evicted there could not be replaced).
"""

from __future__ import annotations

from typing import Any, Sequence

#: The contended card type (the ``--gpu-type`` matching rules: without the ``GeForce`` prefix)
CARD = "RTX 4090"

TEAMS_YAML = f"""\
teams:
  research: {{quota: {{"{CARD}": 8}}, weight: 2}}
  prod:     {{quota: {{"*": 16, "{CARD}": 4}}}}
  intern:   {{quota: {{"*": 8}}, borrowing_limit: {{"*": 8}}}}
"""

#: (seconds after the stream's start, priority, conf, the earlier entries of the burst whose
#: jobs must hold their GPUs before this one is triggered) of the opening burst
OPENING: tuple[tuple[float, int, dict[str, Any], tuple[int, ...]], ...] = (
    (0.0, 0, {"gpus": 8, "team": "research", "seconds": 90, "gpu_type": CARD}, ()),
    (0.0, 0, {"gpus": 8, "team": "research", "seconds": 90, "gpu_type": CARD}, ()),
    (3.0, 0, {"gpus": 4, "team": "prod", "seconds": 30, "gpu_type": CARD}, (0, 1)),
)


def split_hosts(specs: Sequence[Any], open_count: int) -> tuple[list[str], list[str]]:
    """(open, drained) host names of the contended card type: the first ``open_count`` hosts
    with no GPU already loaded stay open, every other host of that card is drained."""
    ours = [s for s in specs if CARD in s.gpus[0].name]
    idle = [s.name for s in ours if not any(g.utilization_gpu for g in s.gpus)]
    if len(idle) < open_count:
        raise ValueError(f"the fleet has {len(idle)} idle {CARD} hosts, fewer than the {open_count} asked to stay open")
    opened = idle[:open_count]
    return opened, [s.name for s in ours if s.name not in opened]


def opening_plan(train_dags: dict[int, str]) -> list[tuple[float, str, dict[str, Any], tuple[int, ...]]]:
    """The burst as the stream's (seconds, DAG, conf, entries to wait for) entries; it opens the
    stream, so an entry's index is the index of its run among the day's runs."""
    return [(at, train_dags[priority], dict(conf), after) for at, priority, conf, after in OPENING]


__all__ = ["CARD", "OPENING", "TEAMS_YAML", "opening_plan", "split_hosts"]
