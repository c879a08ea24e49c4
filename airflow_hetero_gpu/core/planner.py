"""The planner: one function from (cluster, request, reservations, evictions) to a decision.

Steps S3-S8 of the seed and §7.1 of the spec. The CLI, the operator, the sensor (replacements),
the ledger (reserve = plan + claim) and the simulator all call :func:`plan`; there is no second
implementation of the algorithm anywhere.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Mapping, Sequence

import numpy as np

from airflow_hetero_gpu.core import filters, scorers
from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.config import ClusterConfig
from airflow_hetero_gpu.core.drain import drained_mask
from airflow_hetero_gpu.core.cardtype import card_type_matches, is_mig_card_type
from airflow_hetero_gpu.core.model import Decision, GpuKey, PlanRequest, PlanResult, PoolReport, Score, as_key
from airflow_hetero_gpu.core.candidates import host_candidates
from airflow_hetero_gpu.core.selection import EPS, choose_replacement, select_gpus
from airflow_hetero_gpu.core.view import ClusterState, PoolView
from airflow_hetero_gpu.errors import RequestError


def _mask(cluster: Cluster, keys) -> np.ndarray:
    """The units ``keys`` name, and what they share a GPU with: a whole-GPU key also marks the
    GPU's MIG instances, an instance key also marks its GPU (a reservation or eviction of one
    never lets the other be handed out)."""
    m = np.zeros(len(cluster.gpus), dtype=bool)
    pos = []
    for key in map(as_key, keys):
        if key in cluster.position:
            pos.append(cluster.position[key])
        if key.instance is None:
            pos.extend(cluster.position[i] for i in cluster.instances_of.get(key, ()))
        elif key.gpu in cluster.position:
            pos.append(cluster.position[key.gpu])
    if pos:
        m[pos] = True
    return m


def _holders(cluster: Cluster, reserved: Mapping[GpuKey, str]) -> dict[GpuKey, str]:
    """Reservation holders by unit, spread like :func:`_mask` (to name them in reasons)."""
    out = dict(reserved)
    for key, job in reserved.items():
        for other in (cluster.instances_of.get(key, ()) if key.instance is None else (key.gpu,)):
            out.setdefault(other, job)
    return out


def cluster_state(
    cluster: Cluster,
    request: PlanRequest,
    reserved: Mapping[GpuKey, str] | None = None,
    evicted: Mapping[GpuKey, Sequence[str]] | None = None,
    config: ClusterConfig | None = None,
    *,
    reserved_mask: np.ndarray | None = None,
    drained: Mapping[str, str] | None = None,
) -> ClusterState:
    """Apply reservations (load 1), evictions (unavailable, not healthy) and drained hosts
    (unavailable: ``drained`` maps a host to its drain reason) to the cluster for one request.

    ``reserved_mask``: optional fast path for callers that keep the reservations as a boolean
    mask over ``cluster.gpus`` (the simulator); it must mark exactly the GPUs of ``reserved``,
    whose ``GpuKey`` keys are then used as given, only to name holders in reasons.
    """
    cfg = config or cluster.config
    th = cfg.thresholds
    if reserved_mask is None:
        reserved = {as_key(k): v for k, v in (reserved or {}).items()}
        reserved_mask = _mask(cluster, reserved)
        reserved = _holders(cluster, reserved)
    else:
        reserved = reserved if reserved is not None else {}
        reserved_mask = np.asarray(reserved_mask, dtype=bool)
        if reserved_mask.shape != (len(cluster.gpus),):
            raise ValueError(f"reserved_mask: expected {len(cluster.gpus)} entries, got {reserved_mask.shape}")
    evicted = {as_key(k): tuple(v) for k, v in (evicted or {}).items()}
    evicted_mask = _mask(cluster, evicted)
    for key, why in list(evicted.items()):  # an evicted GPU's instances carry its reasons
        for inst in cluster.instances_of.get(key, ()) if key.instance is None else ():
            evicted.setdefault(inst, why)
    healthy = cluster.healthy & ~evicted_mask
    load = cluster.base_load.copy()
    load[reserved_mask] = 1.0
    busy = load > th.busy_utilization
    if request.gpu_memory_mib:
        with np.errstate(invalid="ignore"):
            memory_ok = cluster.memory_free >= request.gpu_memory_mib  # unknown (nan) is not enough
    else:
        memory_ok = np.ones(len(cluster.gpus), dtype=bool)
    outside = cluster.has_processes & ~reserved_mask if th.foreign_processes == "block" \
        else np.zeros(len(cluster.gpus), dtype=bool)
    drained = dict(drained or {})
    on_drained = drained_mask(cluster, drained)
    available = healthy & cluster.schedulable & ~reserved_mask & ~busy & memory_ok & ~outside & ~on_drained
    return ClusterState(cluster, request, th, reserved, evicted, reserved_mask, healthy, load, busy,
                        memory_ok, available, outside, drained, on_drained)


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
    explain: bool = True,
    drained: Mapping[str, str] | None = None,
) -> PlanResult:
    """Place ``request`` on ``cluster``.

    ``reserved`` maps GPUs held by live reservations to their job id (they count as load 1);
    ``evicted`` maps GPUs evicted in the ledger to their reasons (unavailable, not healthy).
    ``config``/``weights`` override the cluster's configuration for this call.
    ``reserved_mask`` (optional) is the same reservations as a boolean mask over
    ``cluster.gpus``, for callers that keep one; see :func:`cluster_state`.
    ``explain=False``: a pool without enough available GPUs gets no ``reason`` but a
    ``PoolReport.explain`` that writes it on demand (``reason_text()``); listing the holders of
    thousands of reserved GPUs per pool was most of an admission pass's time.
    ``drained`` maps drained hosts to their reasons (:mod:`.drain`): none of their GPUs is placed on.
    """
    cfg = (config or cluster.config).with_weights(weights)
    check_mig_request(cluster, request)
    state = cluster_state(cluster, request, reserved, evicted, cfg, reserved_mask=reserved_mask, drained=drained)
    w = cfg.weights.model_dump()
    reports = [pool_report(pool, state, w, explain) for pool in cluster.pools]
    return conclude(cluster, request, reports, unhealthy_gpus(cluster, state))


def pool_report(pool, state: ClusterState, w: Mapping[str, float], explain: bool = True,
                view: PoolView | None = None) -> PoolReport:
    """One pool's report for ``state``'s request (S4-S7): it reads only that pool's GPUs (and
    their hosts' GPUs of the same pool), so a caller may keep it while those do not change.
    ``view``: the pool's view of ``state``, when the caller has one (with slices filled in)."""
    request = state.request
    if view is None:
        view = PoolView(pool, state)
    rep = PoolReport(pool.id, pool.card_type, pool.task_types, view.gpu_count, view.healthy_count,
                     view.available_count)
    rep.reason = first_failure(filters.PRIMARY, view)
    if rep.reason is not None:
        rep.stage = "rejected"
        return rep
    if not explain and view.available_count < request.gpus:
        rep.stage = "primary"
        rep.explain = partial(first_failure, filters.PRESELECT, view)
        return rep
    rep.reason = first_failure(filters.PRESELECT, view)
    if rep.reason is not None:
        rep.stage = "primary"
        return rep
    cluster = state.cluster
    view.selection = select_gpus(host_candidates(view, request.gpus), request.gpus, cluster.matrices, cluster.net)
    if view.selection is None:  # cannot happen when enough are available; kept as a guard
        rep.stage, rep.reason = "primary", "no set of available GPUs found"
        return rep
    rep.stage = "preselected"
    rep.selection = tuple(GpuKey(*k) for k in view.selection.keys)
    rep.mean_distance = view.selection.mean_distance
    rep.score = evaluate(view, w)
    return rep


def conclude(cluster: Cluster, request: PlanRequest, reports: list[PoolReport], unhealthy: list) -> PlanResult:
    """S8: the scheduling pool among the preselected ``reports`` (in pool order), the others'
    reasons, the decision."""
    best: PoolReport | None = None
    for rep in reports:
        if rep.stage == "preselected" and (best is None or _better(rep, best)):
            best = rep
    decision = None
    if best is not None:
        best.stage = "scheduling"
        for rep in reports:
            if rep.stage == "preselected":
                rep.reason = _lost_because(rep, best)
        decision = Decision(best.pool, [cluster.gpu(k) for k in best.selection], best.score, best.mean_distance)
    return PlanResult(request, decision, reports, unhealthy, dict(cluster.host_errors))


def unhealthy_gpus(cluster: Cluster, state: ClusterState) -> list:
    """The GPUs not healthy (evicted ones with their eviction's reasons): a plan's ``unhealthy``."""
    sick = np.flatnonzero(~state.healthy & cluster.is_whole_gpu).tolist()  # an instance is sick when its GPU is
    gpus = cluster.gpus
    return [_with_eviction(gpus[p], state.evicted) for p in sick] if state.evicted else [gpus[p] for p in sick]


def check_mig_request(cluster: Cluster, request: PlanRequest) -> None:
    """k > 1 of a MIG instance type is a mistake, not a lack of capacity: NCCL cannot span MIG
    instances (one process sees one instance), so no pool could ever host it."""
    if request.gpus <= 1 or not request.gpu_types:
        return
    named = [t for t in request.gpu_types if is_mig_card_type(t)]
    matched = [p for p in cluster.pools if any(card_type_matches(p.card_type, t) for t in request.gpu_types)]
    if len(named) == len(request.gpu_types) or (matched and all(p.mig for p in matched)):
        which = " or ".join(repr(t) for t in request.gpu_types)
        raise RequestError(f"gpu_type {which} names MIG instances, which serve 1-GPU jobs only (NCCL cannot "
                           f"span MIG instances); ask for gpus=1, or for a whole-GPU card type for {request.gpus} GPUs")


def first_failure(chain, view: PoolView) -> str | None:
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
    holding: Sequence[tuple],
    bad: tuple,
    *,
    reserved: Mapping[GpuKey, str] | None = None,
    evicted: Mapping[GpuKey, Sequence[str]] | None = None,
    config: ClusterConfig | None = None,
    gpu_memory_mib: float | None = None,
    drained: Mapping[str, str] | None = None,
) -> GpuKey | None:
    """S12: the healthy available GPU of ``bad``'s pool that best replaces it (SPEC §8), or None
    (never one of a drained host)."""
    pool = cluster.pool_of_gpu(bad)
    req = PlanRequest(gpus=1, gpu_memory_mib=gpu_memory_mib)
    state = cluster_state(cluster, req, reserved, evicted, config, drained=drained)
    pos = pool.positions[state.available[pool.positions]]
    candidates = [cluster.gpus[int(p)].key for p in pos]
    found = choose_replacement(holding, bad, candidates, cluster.mean_distance)
    return as_key(found) if found else None
