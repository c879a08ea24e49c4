"""``topology-only``: the placement with the smallest mean distance d(S) (SPEC §5), nothing else.

Like NVIDIA's gpuallocator (the device plugin's "best effort" allocation): among every allowed
host that can hold the job, the k free GPUs with the smallest pair-distance sum; the smallest
wins, ties to the first host by name (no best fit: whole hosts are not kept free on purpose).
A job that no host can hold spans hosts of the card type whose spanning set has the smallest
d(S), chosen by the planner's own spanning rule (fewest hosts, lowest common switch, hosts with
most free GPUs first).
"""

from __future__ import annotations

import numpy as np

from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.core.selection import EPS, HostAvail, best_subset, select_gpus
from airflow_hetero_gpu.sim.policies.base import BasePolicy
from airflow_hetero_gpu.sim.state import ClusterView
from airflow_hetero_gpu.sim.trace import Job


def free_codes(view: ClusterView) -> np.ndarray:
    """Per host, its free GPUs as a bit mask over the host's GPUs (bit i: its i-th GPU)."""
    local = np.arange(len(view.free)) - view.host_start[view.host_of]
    if int(view.host_capacity.max(initial=0)) > 62:
        raise ValueError("hosts of more than 62 GPUs are not supported by the bit-mask view")
    bits = np.where(view.free, np.left_shift(np.int64(1), local), 0)
    return np.add.reduceat(bits, view.host_start[:-1]) if len(bits) else np.zeros(0, dtype=np.int64)


class TopologyOnly(BasePolicy):
    name = "topology-only"

    def place(self, view: ClusterView, job: Job) -> list[GpuKey] | None:
        k = job.gpus
        hosts = self.single_host_candidates(view, job)
        if len(hosts):
            if k == 1:
                return self.keys(view, view.free_positions(int(hosts[0]))[:1])
            return self._best_host(view, hosts, k)
        return self._span(view, job)

    def _best_host(self, view: ClusterView, hosts: np.ndarray, k: int) -> list[GpuKey]:
        c = view.cluster
        codes = free_codes(view)[hosts]
        mids = np.asarray(c.host_matrix_ids)[hosts]
        best = None
        seen: dict[tuple[int, int], int] = {}
        for h, mid, code in zip(hosts.tolist(), mids.tolist(), codes.tolist()):
            if (mid, code) in seen:  # same wiring, same free GPUs as an earlier host: not better
                continue
            free = view.free_positions(h)
            rows = tuple(c.row_of[free].tolist())
            pair_sum, chosen = best_subset(mid, c.matrices[mid], rows, k)
            seen[(mid, code)] = pair_sum
            if best is None or pair_sum < best[0]:
                best = (pair_sum, h, chosen)
        _, h, chosen = best
        free = view.free_positions(h)
        by_row = dict(zip(c.row_of[free].tolist(), free.tolist()))
        return self.keys(view, sorted(by_row[r] for r in chosen))

    def _span(self, view: ClusterView, job: Job) -> list[GpuKey] | None:
        c = view.cluster
        best = None
        for m in self.feasible_models(view, job).tolist():
            avail = []
            for h in np.flatnonzero((view.host_model_id == m) & (view.host_free > 0)).tolist():
                free = view.free_positions(h)
                avail.append(HostAvail.of_indices(c.hosts[h], c.index_of[free].tolist(),
                                       tuple(c.row_of[free].tolist()), c.host_matrix_ids[h]))
            sel = select_gpus(avail, job.gpus, c.matrices, c.net)
            if sel is not None and (best is None or sel.mean_distance < best.mean_distance - EPS):
                best = sel
        return None if best is None else [GpuKey(*key) for key in best.keys]
