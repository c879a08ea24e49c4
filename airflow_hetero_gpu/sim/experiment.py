"""Running several policies (and a weight sweep of ``seed``) over one trace and one cluster.

Every run gets the same cluster, the same jobs and the same simulator settings; runs are
independent, so they go to worker processes (``workers``) and come back in the order asked.
A run is deterministic: the same :class:`Setup` and :class:`RunSpec` give the same numbers
(except the measured decision times).
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from airflow_hetero_gpu.core.admission.order import DEFAULT_AGING_INTERVAL_S
from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.sim.engine import simulate
from airflow_hetero_gpu.sim.fleet import Node, SimCluster, build_fleet
from airflow_hetero_gpu.sim.metrics import allocation_series, summarize
from airflow_hetero_gpu.sim.policies import make_policy
from airflow_hetero_gpu.sim.trace import Job

WEIGHT_NAMES = ("load_balance", "fragmentation", "topology", "free_blocks")
WEIGHT_ALIASES = {"w1": "load_balance", "w2": "fragmentation", "w3": "topology", "w4": "free_blocks"}
DEFAULT_GRID = {
    "load_balance": (0.0, 0.1, 0.3),
    "fragmentation": (-0.2,),
    "topology": (0.5, 1.0),
    "free_blocks": (0.0, 0.1, 0.2, 0.4),
}


@dataclass(frozen=True)
class Setup:
    """What every run shares: the cluster (as its node list), the jobs, the simulator settings."""

    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...]
    hosts_per_leaf: int = 16
    leaves_per_spine: int = 16
    queue: str = "admission"
    aging_interval_s: float | None = DEFAULT_AGING_INTERVAL_S
    backfill: int = 0
    comm_cost: float = 0.05
    span: str = "as-needed"
    seed: int = 0
    series_since: float | None = None  # plot window (None: the whole run)
    series_until: float | None = None
    teams: Any = None  # core.admission.Teams: the quotas the admission queue applies (docs/teams.md)
    preemption: Any = None  # sim.preempt.SimPreemption, None: off
    keep_records: bool = False  # RunOutcome.records and .events (for --jobs-out, --events-out)


@dataclass(frozen=True)
class RunSpec:
    policy: str
    weights: Mapping[str, float] | None = None
    label: str | None = None

    @property
    def name(self) -> str:
        return self.label or self.policy


@dataclass
class RunOutcome:
    spec: RunSpec
    metrics: dict[str, Any]
    series: dict[str, list[float]] = field(default_factory=dict)
    waits: list[float] = field(default_factory=list)
    distances: list[float] = field(default_factory=list)  # d(S) of multi-GPU jobs
    rejected: list[tuple[str, str]] = field(default_factory=list)
    records: list = field(default_factory=list)  # engine.JobRecord, with Setup.keep_records
    events: list = field(default_factory=list)


_FLEET: dict[int, SimCluster] = {}


def _fleet(setup: Setup) -> SimCluster:
    key = hash((setup.nodes, setup.hosts_per_leaf, setup.leaves_per_spine))
    if key not in _FLEET:
        _FLEET.clear()
        _FLEET[key] = build_fleet(setup.nodes, hosts_per_leaf=setup.hosts_per_leaf,
                                  leaves_per_spine=setup.leaves_per_spine)
    return _FLEET[key]


def run_one(setup: Setup, spec: RunSpec) -> RunOutcome:
    """One policy over the setup's jobs."""
    fleet = _fleet(setup)
    policy = make_policy(spec.policy, seed=setup.seed, weights=spec.weights)
    result = simulate(fleet.cluster, setup.jobs, policy, queue=setup.queue, backfill=setup.backfill,
                      aging_interval_s=setup.aging_interval_s, comm_cost=setup.comm_cost, span=setup.span,
                      teams=setup.teams, preemption=setup.preemption)
    result.policy = spec.name
    return RunOutcome(
        spec=spec,
        metrics=summarize(result),
        series=allocation_series(result, until=setup.series_until, since=setup.series_since),
        waits=[r.wait for r in result.records],
        distances=[r.distance for r in result.records if r.gpus > 1],
        rejected=result.rejected,
        records=result.records if setup.keep_records else [],
        events=result.events if setup.keep_records else [],
    )


def _run_star(args: tuple[Setup, RunSpec]) -> RunOutcome:
    return run_one(*args)


def run_many(setup: Setup, specs: Sequence[RunSpec], workers: int | None = None) -> list[RunOutcome]:
    """Every spec over the same setup, in worker processes; results in the order of ``specs``."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(specs)))
    if workers == 1:
        return [run_one(setup, s) for s in specs]
    # the longest runs (seed) first so the pool finishes together
    order = sorted(range(len(specs)), key=lambda i: specs[i].policy != "seed")
    with ProcessPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(_run_star, [(setup, specs[i]) for i in order]))
    out: list[RunOutcome | None] = [None] * len(specs)
    for i, r in zip(order, done):
        out[i] = r
    return out  # type: ignore[return-value]


# --- the weight sweep --------------------------------------------------------------------------
def parse_grid(text: str | None) -> dict[str, tuple[float, ...]]:
    """``w1=0,0.3;w2=-0.2;w3=0.5,1;w4=0,0.2`` (or the weight names) -> the grid; empty text: the
    default. A weight the text does not name keeps the default grid's values."""
    if not text:
        return dict(DEFAULT_GRID)
    alias = WEIGHT_ALIASES
    grid = dict(DEFAULT_GRID)
    for part in text.split(";"):
        if not part.strip():
            continue
        name, _, values = part.partition("=")
        name = alias.get(name.strip(), name.strip())
        if name not in WEIGHT_NAMES or not values.strip():
            raise HeteroGpuError(f"--sweep: expected NAME=V1,V2,... with NAME one of w1, w2, w3, w4, got {part.strip()!r}")
        try:
            grid[name] = tuple(float(v) for v in values.split(","))
        except ValueError:
            raise HeteroGpuError(f"--sweep: {name}: expected numbers, got {values.strip()!r}") from None
    return grid


def grid_points(grid: Mapping[str, Sequence[float]]) -> list[dict[str, float]]:
    return [dict(zip(WEIGHT_NAMES, combo)) for combo in itertools.product(*(grid[n] for n in WEIGHT_NAMES))]


def direction(weights: Mapping[str, float]) -> tuple[float, ...]:
    """What decides a simulated seed run: (w1, w3, w4) scaled to a largest magnitude of 1.

    plan() only compares E values, so scaling all weights by a positive factor changes no
    decision; and in this simulator every GPU is idle (load 0) or held (load 1), so FR, which
    counts GPUs loaded strictly between the busy and full thresholds, is 0 in every pool and w2
    multiplies 0 (tests/test_sim_policies.py checks both). Points with one direction share a run.
    A weight left out counts as its default (``core.config.Weights``).
    """
    from airflow_hetero_gpu.core.config import Weights

    full = Weights().model_dump() | dict(weights)
    w = np.array([float(full["load_balance"]), float(full["topology"]), float(full["free_blocks"])])
    m = np.abs(w).max()
    return tuple(np.round(w / m, 12)) if m > 0 else (0.0, 0.0)


def sweep_specs(points: Sequence[Mapping[str, float]]) -> tuple[list[RunSpec], list[int]]:
    """One run per distinct :func:`direction`; ``index[i]`` is the run that answers ``points[i]``."""
    runs: list[RunSpec] = []
    seen: dict[tuple[float, ...], int] = {}
    index = []
    for p in points:
        d = direction(p)
        if d not in seen:
            seen[d] = len(runs)
            runs.append(RunSpec("seed", dict(p), label="seed " + weights_label(p)))
        index.append(seen[d])
    return runs, index


def weights_label(w: Mapping[str, float]) -> str:
    from airflow_hetero_gpu.core.config import Weights

    full = Weights().model_dump() | dict(w)
    return "w=({:g}, {:g}, {:g}, {:g})".format(*(full[n] for n in WEIGHT_NAMES))
