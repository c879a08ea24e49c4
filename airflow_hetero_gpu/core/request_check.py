"""A request the fleet can never satisfy is a mistake, not a shortage of capacity.

A card type no GPU of the fleet has (matched as SPEC §4 says, :mod:`.cardtype`), a training-task
type no pool supports, one the requested card types never support, or more GPUs than every
matching pool has at all, healthy or not (a MIG pool holds 1-GPU jobs only): no wait and no
retry can help, so the callers (the ``hetero-gpu plan`` command: exit 2; the operator: a failure
without retries, also with ``wait_for_capacity``) say so in one line with what the fleet does
have, instead of planning and reporting "no pool can host the job". A request that exceeds only
the *healthy* GPUs of its pools (hosts or GPUs lost) is not a mistake: it may fit once they are
back, so it waits (or fails "now", retryable) as any shortage does.

A fleet with a host whose collection failed may hold the missing card on that host: then nothing
is said here and the planner's reasons (which name the failed host) stand.
"""

from __future__ import annotations

from airflow_hetero_gpu.core.cardtype import card_type_matches
from airflow_hetero_gpu.core.cluster import Cluster, Pool
from airflow_hetero_gpu.core.model import PlanRequest


def never_satisfiable(cluster: Cluster, request: PlanRequest) -> str | None:
    """Why ``request`` can never be placed on ``cluster``'s GPUs, in one line, or None."""
    if cluster.host_errors or not cluster.pools:
        return None
    card_types = sorted({p.card_type for p in cluster.pools})
    wanted = request.gpu_types
    pools = [p for p in cluster.pools if not wanted or any(card_type_matches(p.card_type, w) for w in wanted)]
    if not pools:
        asked = " or ".join(repr(w) for w in wanted)
        return f"gpu_type {asked}: the fleet has no GPU of that card type; its card types: {', '.join(card_types)}"
    task = request.task_type
    if task is not None and not any(task in p.task_types for p in pools):
        supported = sorted({t for p in pools for t in p.task_types})
        if wanted:
            asked = " or ".join(repr(w) for w in wanted)
            return (f"task_type {task!r}: no GPU of card type {asked} supports it; those support: "
                    f"{', '.join(supported)}")
        return f"task_type {task!r}: no pool of the fleet supports it; the fleet's task types: {', '.join(supported)}"
    return too_large(cluster, request, [p for p in pools if task is None or task in p.task_types])


def pool_capacity(cluster: Cluster, pool: Pool) -> int:
    """The most GPUs one job can ever get from ``pool``: all of them, healthy or not (1 when MIG)."""
    return 1 if pool.mig else len(pool.positions)


def too_large(cluster: Cluster, request: PlanRequest, pools: list[Pool], listed: int = 4) -> str | None:
    """Why ``request`` wants more GPUs than any of ``pools`` has at all, or None."""
    if not pools or request.gpus <= max(pool_capacity(cluster, p) for p in pools):
        return None
    if all(p.mig for p in pools):  # the planner's own line says why (NCCL cannot span MIG instances)
        return None
    by_size = sorted(pools, key=lambda p: (-pool_capacity(cluster, p), p.id))
    sizes = [f"{p.id} has {pool_capacity(cluster, p)}" + (" (MIG: 1-GPU jobs only)" if p.mig else "")
             for p in by_size[:listed]]
    more = f"; +{len(by_size) - listed} more pools" if len(by_size) > listed else ""
    return (f"gpu_count {request.gpus}: more GPUs than any matching pool has at all, healthy or not, so it can "
            f"never start: {'; '.join(sizes)}{more}")
