"""The planner: one function from (cluster, request, reservations, evictions) to a decision.

Steps S3-S8 of the seed and §7.1 of the spec. The CLI, the operator, the sensor (replacements),
the ledger (reserve = plan + claim) and the simulator all call :func:`plan`; there is no second
implementation of the algorithm anywhere.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from airflow_hetero_gpu.core import filters, scorers
from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.config import ClusterConfig
from airflow_hetero_gpu.core.model import Decision, GpuKey, PlanRequest, PlanResult, PoolReport, Score
from airflow_hetero_gpu.core.selection import EPS, HostAvail, choose_replacement, select_gpus
from airflow_hetero_gpu.core.view import ClusterState, PoolView


def _mask(cluster: Cluster, keys) -> np.ndarray:
    m = np.zeros(len(cluster.gpus), dtype=bool)
    pos = [cluster.position[k] for k in (GpuKey(*k) for k in keys) if k in cluster.position]
    if pos:
        m[pos] = True
    return m


def cluster_state(
    cluster: Cluster,
    request: PlanRequest,
    reserved: Mapping[GpuKey, str] | None = None,
    evicted: Mapping[GpuKey, Sequence[str]] | None = None,
    config: ClusterConfig | None = None,
    *,
    reserved_mask: np.ndarray | None = None,
) -> ClusterState:
    """Apply reservations (load 1) and evictions (unavailable) to the cluster for one request.

    ``reserved_mask``: optional fast path for callers that keep the reservations as a boolean
    mask over ``cluster.gpus`` (the simulator); it must mark exactly the GPUs of ``reserved``,
    whose ``GpuKey`` keys are then used as given, only to name holders in reasons.
    """
    cfg = config or cluster.config
    th = cfg.thresholds
    if reserved_mask is None:
        reserved = {GpuKey(*k): v for k, v in (reserved or {}).items()}
        reserved_mask = _mask(cluster, reserved)
    else:
        reserved = reserved if reserved is not None else {}
        reserved_mask = np.asarray(reserved_mask, dtype=bool)
        if reserved_mask.shape != (len(cluster.gpus),):
            raise ValueError(f"reserved_mask: expected {len(cluster.gpus)} entries, got {reserved_mask.shape}")
    evicted = {GpuKey(*k): tuple(v) for k, v in (evicted or {}).items()}
    evicted_mask = _mask(cluster, evicted)
    healthy = cluster.healthy & ~evicted_mask
    load = cluster.base_load.copy()
    load[reserved_mask] = 1.0
    busy = load > th.busy_utilization
    if request.gpu_memory_mib:
        with np.errstate(invalid="ignore"):
            memory_ok = cluster.memory_free >= request.gpu_memory_mib  # unknown (nan) is not enough
    else:
        memory_ok = np.ones(len(cluster.gpus), dtype=bool)
    available = healthy & ~reserved_mask & ~busy & memory_ok
    return ClusterState(cluster, request, th, reserved, evicted, reserved_mask, healthy, load, busy,
                        memory_ok, available)


def _host_avail(view: PoolView, k: int) -> list[HostAvail]:
    """The pool's available GPUs grouped by host, in host-name order.

    When some host can hold all k GPUs, only such hosts are returned (§7.1 looks no further);
    otherwise every host with an available GPU is (the job will span hosts).
    """
    c = view.state.cluster
    pos = view.positions_where("available")  # sorted by host name, then index
    if len(pos) == 0:
        return []
    hid = c.host_of[pos]
    cuts = np.flatnonzero(np.diff(hid)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(pos)]))
    counts = ends - starts
    keep = np.flatnonzero(counts >= k) if counts.max() >= k else np.arange(len(starts))
    hid_l, idx_l, row_l = hid.tolist(), c.index_of[pos].tolist(), c.row_of[pos].tolist()
    out = []
    for s, e in zip(starts[keep].tolist(), ends[keep].tolist()):
        h = hid_l[s]
        out.append(HostAvail(c.hosts[h], tuple(idx_l[s:e]), tuple(row_l[s:e]), c.host_matrix_ids[h]))
    return out


def evaluate(view: PoolView, weights: Mapping[str, float]) -> Score:
    """E = sum of weight × term over the scorer registry (SPEC §7)."""
    terms = {name: float(fn(view)) for name, fn in scorers.SCORERS.items()}
    total = sum(weights[name] * value for name, value in terms.items())
    return Score(terms, float(total))


def plan(
    cluster: Cluster,
    request: PlanRequest,
    *,
    reserved: Mapping[GpuKey, str] | None = None,
    evicted: Mapping[GpuKey, Sequence[str]] | None = None,
    config: ClusterConfig | None = None,
    weights: Mapping[str, float] | None = None,
    reserved_mask: np.ndarray | None = None,
) -> PlanResult:
    """Place ``request`` on ``cluster``.

    ``reserved`` maps GPUs held by live reservations to their job id (they count as load 1);
    ``evicted`` maps GPUs evicted in the ledger to their reasons (unavailable, not healthy).
    ``config``/``weights`` override the cluster's configuration for this call.
    ``reserved_mask`` (optional) is the same reservations as a boolean mask over
    ``cluster.gpus``, for callers that keep one; see :func:`cluster_state`.
    """
    cfg = (config or cluster.config).with_weights(weights)
    state = cluster_state(cluster, request, reserved, evicted, cfg, reserved_mask=reserved_mask)
    w = cfg.weights.model_dump()
    reports: list[PoolReport] = []
    best: PoolReport | None = None
    for pool in cluster.pools:
        view = PoolView(pool, state)
        rep = PoolReport(pool.id, pool.card_type, pool.task_types, view.gpu_count, view.healthy_count,
                         view.available_count)
        reports.append(rep)
        rep.reason = _first_failure(filters.PRIMARY, view)
        if rep.reason is not None:
            rep.stage = "rejected"
            continue
        rep.reason = _first_failure(filters.PRESELECT, view)
        if rep.reason is not None:
            rep.stage = "primary"
            continue
        view.selection = select_gpus(_host_avail(view, request.gpus), request.gpus, cluster.matrices, cluster.net)
        if view.selection is None:  # cannot happen when enough are available; kept as a guard
            rep.stage, rep.reason = "primary", "no set of available GPUs found"
            continue
        rep.stage = "preselected"
        rep.selection = tuple(GpuKey(*k) for k in view.selection.keys)
        rep.mean_distance = view.selection.mean_distance
        rep.score = evaluate(view, w)
        if best is None or _better(rep, best):
            best = rep
    decision = None
    if best is not None:
        best.stage = "scheduling"
        for rep in reports:
            if rep.stage == "preselected":
                rep.reason = _lost_because(rep, best)
        decision = Decision(best.pool, [cluster.gpu(k) for k in best.selection], best.score, best.mean_distance)
    unhealthy = [_with_eviction(cluster.gpus[int(p)], state.evicted) for p in np.flatnonzero(~state.healthy)]
    return PlanResult(request, decision, reports, unhealthy, dict(cluster.host_errors))


def _first_failure(chain, view: PoolView) -> str | None:
    for f in chain:
        reason = f(view)
        if reason is not None:
            return reason
    return None


def _better(a: PoolReport, b: PoolReport) -> bool:
    """Highest E (compared at 1e-9), then fewer hosts spanned, then the smaller pool id."""
    if a.score.total > b.score.total + EPS:
        return True
    if a.score.total < b.score.total - EPS:
        return False
    return (a.hosts_spanned, a.pool) < (b.hosts_spanned, b.pool)


def _lost_because(rep: PoolReport, best: PoolReport) -> str:
    """Why a preselected pool is not the scheduling pool (SPEC §7's order of comparison)."""
    if rep.score.total < best.score.total - EPS:
        return f"evaluation {rep.score.total:.6g} below {best.pool}'s {best.score.total:.6g}"
    if rep.hosts_spanned != best.hosts_spanned:
        return (f"evaluation ties with {best.pool}'s ({best.score.total:.6g}); its GPUs span {rep.hosts_spanned} "
                f"hosts, {best.pool}'s {best.hosts_spanned}")
    return f"evaluation ties with {best.pool}'s ({best.score.total:.6g}) on as many hosts; {best.pool} sorts first"


def _with_eviction(g, evicted):
    if g.key in evicted and not g.reasons:
        return replace(g, healthy=False, reasons=tuple(f"evicted:{r}" for r in evicted[g.key]) or ("evicted",))
    return g


def replacement(
    cluster: Cluster,
    holding: Sequence[tuple[str, int]],
    bad: tuple[str, int],
    *,
    reserved: Mapping[GpuKey, str] | None = None,
    evicted: Mapping[GpuKey, Sequence[str]] | None = None,
    config: ClusterConfig | None = None,
    gpu_memory_mib: float | None = None,
) -> GpuKey | None:
    """S12: the healthy available GPU of ``bad``'s pool that best replaces it (SPEC §8), or None."""
    pool = cluster.pool_of_gpu(bad)
    req = PlanRequest(gpus=1, gpu_memory_mib=gpu_memory_mib)
    state = cluster_state(cluster, req, reserved, evicted, config)
    pos = pool.positions[state.available[pool.positions]]
    candidates = [cluster.gpus[int(p)].key for p in pos]
    found = choose_replacement(holding, bad, candidates, cluster.mean_distance)
    return GpuKey(*found) if found else None
