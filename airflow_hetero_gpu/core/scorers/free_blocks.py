"""Free blocks ``FB``: how much of the idle GPU blocks on the hosts it touches a placement keeps.

Whole-GPU jobs fragment a cluster by breaking blocks, not by loading GPUs partly (which is what
FR counts): one 1-GPU job on an idle 8-GPU host leaves no host that can take an 8-GPU gang,
while on a host with 3 idle GPUs it costs no gang anything. For a request of k GPUs and the set
S that the pool would give it (SPEC §7.1):

* block sizes ``B = {2, 4, 8, …}`` with ``k < b ≤ c_max``, c_max the most GPUs on one host of the
  cluster (sizes up to k are what the job itself is made of; nothing larger fits on one host);
* for each host h of S, ``f_h`` idle GPUs of the pool on h (healthy, not reserved, load at most
  ``busy_utilization``) before the job and ``t_h`` taken by it; S *breaks* a b-block on h when
  ``⌊f_h / b⌋ > ⌊(f_h − t_h) / b⌋`` (h can then hold one b-GPU gang fewer);
* a b-block of h is worth ``b · q_h(b)``, where ``q_h(b) = 1 / d_min`` is the topology score
  (TS) the best b GPUs of h get when h is idle: 1 on an NVSwitch or NVLink-mesh block, 1/2 for
  a PCIe switch (PIX) quad, 0.318 for 8 PCIe GPUs behind two PIX switches, 1/4 for a PHB pair;

``FB = 1 − Σ_h Σ_b b · q_h(b) · [S breaks a b-block on h] / (H · Σ_b b)``, H the hosts of S.

Range [0, 1]; 1 when S breaks no block (a job that fits the idle GPUs left over on a partly
used host, or fills a host exactly), or when B is empty (k is at least the largest block).
Breaking an idle 8-GPU NVSwitch host for one GPU gives 0, an idle 8-GPU PCIe host 0.604, an
idle 2-GPU PHB box 0.964. With a positive weight the evaluation sends a small job to a partly
used host or to a pool whose blocks are worth less, and keeps large well-connected blocks free
for the gangs that need them. No workload mix is assumed: every block size counts by its size.
"""

from __future__ import annotations

import numpy as np

from airflow_hetero_gpu.core.selection import best_subset
from airflow_hetero_gpu.core.view import PoolView

# (matrix id, b) -> q: matrices are interned by content for the process, so ids are stable
_QUALITY: dict[tuple[int, int], float] = {}


def block_sizes(k: int, largest_host: int) -> list[int]:
    """The powers of two above ``k`` and at most ``largest_host``."""
    out, b = [], 2
    while b <= largest_host:
        if b > k:
            out.append(b)
        b *= 2
    return out


def block_quality(matrix_id: int, matrix: np.ndarray, b: int) -> float:
    """``1 / d`` of the best b GPUs of a host with this distance matrix (0 if it has fewer)."""
    key = (matrix_id, b)
    q = _QUALITY.get(key)
    if q is None:
        n = matrix.shape[0]
        if b > n:
            q = 0.0
        else:
            pair_sum, _ = best_subset(matrix_id, matrix, tuple(range(n)), b)
            q = (b * (b - 1) / 2) / pair_sum if pair_sum > 0 else 1.0
        _QUALITY[key] = q
    return q


def free_blocks(view: PoolView) -> float:
    sel = view.selection
    if sel is None or not sel.keys:
        return 1.0
    c = view.state.cluster
    sizes = block_sizes(len(sel.keys), c.max_host_gpus)
    if not sizes:
        return 1.0
    taken: dict[int, int] = {}
    first = None
    for key in sel.keys:
        pos = c.position[key]  # a GpuKey, or a plain (host, index) pair: equal
        if first is None:
            first = pos
        h = int(c.host_of[pos])
        taken[h] = taken.get(h, 0) + 1
    pool = c.pool_of[first]
    st = view.state
    lost = 0.0
    for h, t in taken.items():
        s, e = int(c.host_start[h]), int(c.host_start[h + 1])
        idle = st.healthy[s:e] & ~st.reserved[s:e] & ~st.busy[s:e] & (c.pool_of[s:e] == pool)
        f = int(idle.sum())
        mid = c.host_matrix_ids[h]
        for b in sizes:
            if f // b > (f - t) // b:
                lost += b * block_quality(mid, c.matrices[mid], b)
    return 1.0 - lost / (len(taken) * sum(sizes))
