"""Metrics of one simulated run (one policy over one trace).

=============================  =================================================================
``jobs``                       jobs that ran (``rejected``: could never fit, not counted)
``wait_mean_s``, ``wait_p95_s``  queueing delay, start - arrival, over all jobs that ran
``wait_max_s``                 the longest queueing delay
``wait_by_gpus``               per job size (GPUs): jobs, mean, p95 and max queueing delay
``makespan_s``                 last end - first arrival
``allocation_mean``            time-weighted share of GPUs held from the 1st-percentile to the
                               last arrival (the busy window every policy shares; the run goes
                               on until the last, often very long, job ends)
``unallocated_while_waiting``  time-weighted share of GPUs *not* held while at least one job
                               waits (FGD's metric: capacity that exists but cannot serve the
                               queue); 0 when no job ever waits
``waiting_time_share``         share of the run's time during which at least one job waits
``multi_gpu_jobs``             jobs of 2 or more GPUs
``distance_mean``              mean d(S) (SPEC §5) over the multi-GPU jobs
``one_host_share``             of the multi-GPU jobs that one allowed host could have held when
                               they started, the share placed on one host
``spanning_jobs``              multi-GPU jobs spread over 2 or more hosts
``run_time_overhead``          GPU-seconds added by the distance slowdown over the trace's
                               GPU-seconds (0 with ``comm_cost = 0``)
``decision_ms_mean``, ``decision_ms_p95``  wall time of one ``policy.place`` call
``distance_by_gpus``           mean d(S) per job size (GPUs)
``jobs_by_card_type``          share of jobs, and of 1-GPU jobs, placed on each card type
``by_team``                    (with teams: ``--teams`` or a ``team`` column) per team: jobs,
                               GPU-seconds held in the busy window (``allocation_mean``'s),
                               share of the GPU-seconds used there, wait mean / p95 / max
``preemptions``                times a running job was preempted (docs/preemption.md)
``lost_gpu_s``                 GPU-seconds of work lost to them (time since each victim's last
                               checkpoint at the signal × its GPUs)
=============================  =================================================================
"""

from __future__ import annotations

from typing import Any

import numpy as np

from airflow_hetero_gpu.sim.engine import SimResult

METRIC_KEYS = (
    "jobs", "rejected", "wait_mean_s", "wait_p95_s", "wait_max_s", "makespan_s", "allocation_mean",
    "unallocated_while_waiting", "waiting_time_share", "multi_gpu_jobs", "distance_mean", "one_host_share",
    "spanning_jobs", "run_time_overhead", "decision_ms_mean", "decision_ms_p95", "decisions", "wall_s",
)


def _time_weighted(times: np.ndarray, values: np.ndarray, where: np.ndarray | None = None,
                   until: float | None = None) -> float | None:
    """Mean of a step function (``values[i]`` holds from ``times[i]`` to ``times[i+1]``),
    optionally only where ``where`` holds and only up to ``until``."""
    if len(times) < 2:
        return None
    ends = times[1:] if until is None else np.minimum(times[1:], until)
    dt = np.maximum(ends - times[:-1], 0.0)
    v = values[:-1]
    if where is not None:
        dt = dt * where[:-1]
    total = dt.sum()
    return float((v * dt).sum() / total) if total > 0 else None


def summarize(result: SimResult) -> dict[str, Any]:
    """The metrics of :data:`METRIC_KEYS` as plain JSON values (None where undefined)."""
    recs = result.records
    n = result.total_gpus
    waits = np.array([r.wait for r in recs]) if recs else np.zeros(0)
    multi = [r for r in recs if r.gpus > 1]
    could = [r for r in multi if r.one_host_possible]
    waiting = result.queued > 0
    share = result.allocated / n if n else result.allocated * 0.0
    t = result.times
    dec = result.decision_s * 1e3
    first = min((r.arrival for r in recs), default=0.0)
    last = max((r.end for r in recs), default=0.0)
    arrivals = sorted(r.arrival for r in recs)
    last_arrival = arrivals[-1] if arrivals else 0.0
    busy_from = arrivals[round(0.01 * (len(arrivals) - 1))] if arrivals else 0.0
    base = sum(r.gpus * r.duration for r in recs)
    used = sum(r.gpus * (r.end - r.start) for r in recs)
    return {
        "jobs": len(recs),
        "rejected": len(result.rejected),
        "wait_mean_s": float(waits.mean()) if len(waits) else None,
        "wait_p95_s": float(np.quantile(waits, 0.95)) if len(waits) else None,
        "wait_max_s": float(waits.max()) if len(waits) else None,
        "makespan_s": float(last - first) if recs else None,
        "allocation_mean": _time_weighted(t, share, t >= busy_from, until=last_arrival) if last_arrival > busy_from else None,
        "unallocated_while_waiting": (lambda v: 0.0 if v is None else 1.0 - v)(_time_weighted(t, share, waiting)),
        "waiting_time_share": float((np.diff(t) * waiting[:-1]).sum() / (t[-1] - t[0])) if len(t) > 1 and t[-1] > t[0] else 0.0,
        "multi_gpu_jobs": len(multi),
        "distance_mean": float(np.mean([r.distance for r in multi])) if multi else None,
        "one_host_share": float(np.mean([r.hosts == 1 for r in could])) if could else None,
        "spanning_jobs": sum(1 for r in multi if r.hosts > 1),
        "run_time_overhead": float(used / base - 1.0) if base > 0 else 0.0,
        "decision_ms_mean": float(dec.mean()) if len(dec) else None,
        "decision_ms_p95": float(np.quantile(dec, 0.95)) if len(dec) else None,
        "decisions": int(len(dec)),
        "wall_s": round(result.wall_s, 3),
        "distance_by_gpus": {str(k): float(np.mean([r.distance for r in multi if r.gpus == k]))
                             for k in sorted({r.gpus for r in multi})},
        "jobs_by_card_type": _by_card_type(recs),
        "wait_by_gpus": _wait_by_gpus(recs),
        "preemptions": int(sum(r.preemptions for r in recs)),
        "lost_gpu_s": float(sum(r.lost_gpu_s for r in recs)),
        **({"by_team": by_team(recs, busy_from, last_arrival)}
           if result.extra.get("teams") or any(r.team for r in recs) else {}),
    }


def by_team(recs, since: float, until: float) -> dict[str, dict[str, float]]:
    """Per team: jobs, GPU-seconds held between ``since`` and ``until``, their share of all the
    GPU-seconds used there, and the wait mean / p95 / max (every job of the team)."""
    from airflow_hetero_gpu.core.admission.quota import DEFAULT_TEAM

    held: dict[str, float] = {}
    waits: dict[str, list[float]] = {}
    for r in recs:
        team = r.team or DEFAULT_TEAM
        held[team] = held.get(team, 0.0) + r.gpus * max(0.0, min(r.end, until) - max(r.start, since))
        waits.setdefault(team, []).append(r.wait)
    total = sum(held.values())
    out = {}
    for team in sorted(waits):
        w = np.array(waits[team])
        out[team] = {"jobs": int(len(w)), "gpu_s": round(held[team], 3),
                     "share": held[team] / total if total > 0 else 0.0, "wait_mean_s": float(w.mean()),
                     "wait_p95_s": float(np.quantile(w, 0.95)), "wait_max_s": float(w.max())}
    return out


def _wait_by_gpus(recs) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for k in sorted({r.gpus for r in recs}):
        w = np.array([r.wait for r in recs if r.gpus == k])
        out[str(k)] = {"jobs": int(len(w)), "mean_s": float(w.mean()), "p95_s": float(np.quantile(w, 0.95)),
                       "max_s": float(w.max())}
    return out


def _by_card_type(recs) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    singles = sum(1 for r in recs if r.gpus == 1) or 1
    for ct in sorted({r.card_type for r in recs}):
        mine = [r for r in recs if r.card_type == ct]
        out[ct] = {"jobs": len(mine) / len(recs), "one_gpu_jobs": sum(1 for r in mine if r.gpus == 1) / singles}
    return out


def allocation_series(result: SimResult, points: int = 400, until: float | None = None,
                      since: float | None = None) -> dict[str, list[float]]:
    """The allocation rate and queue length sampled on an even grid from ``since`` (default:
    the first event) to ``until`` (default: the last event), for plots and the JSON report."""
    if len(result.times) == 0:
        return {"t": [], "allocation": [], "queued": []}
    start = result.times[0] if since is None else max(result.times[0], since)
    end = result.times[-1] if until is None else max(start, until)
    grid = np.linspace(start, end, points)
    idx = np.clip(np.searchsorted(result.times, grid, side="right") - 1, 0, len(result.times) - 1)
    return {
        "t": grid.round(3).tolist(),
        "allocation": (result.allocated[idx] / result.total_gpus).round(5).tolist(),
        "queued": result.queued[idx].astype(int).tolist(),
    }
