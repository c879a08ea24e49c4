"""``fgd``: fragmentation gradient descent (Weng et al., USENIX ATC'23 "Beware of
Fragmentation"), simplified for whole-GPU gang jobs.

FGD measures a node's fragmentation *with respect to the workload*: for every task class m of
the target workload (here: a GPU count k and the allowed card types, with its share p_m of the
trace's jobs), the node's unallocated GPUs are fragments for m when m cannot use them. It places
each task where the expected fragmentation ``F_n = sum_m p_m F_n(m)`` grows least.

With whole GPUs there are no partial-GPU fragments, so for a host with ``f`` free GPUs out of
``c``::

    F(m) = f   if the host's card type is not allowed for m, or f < min(k_m, c)
    F(m) = 0   otherwise

``min(k_m, c)``: a gang larger than the host spans hosts, so a host whose GPUs are all free is
useful to it, a partly used small host is not. The job goes to the allowed host with room that
minimises ``F(f - k) - F(f)`` (ties by name), on its lowest free indices (FGD does not look at
topology). A job no host can hold spans hosts of one card type, taken greedily by the smallest
fragmentation growth per GPU taken; the card type whose greedy set grows fragmentation least
wins.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.sim.policies.base import BasePolicy
from airflow_hetero_gpu.sim.state import ClusterView
from airflow_hetero_gpu.sim.trace import Job


class Fgd(BasePolicy):
    name = "fgd"

    def __init__(self) -> None:
        self.classes: list[tuple[int, tuple[str, ...], float]] = []
        self.table = np.zeros((0, 1))
        self.host_type = np.zeros(0, dtype=np.int64)

    def prepare(self, view: ClusterView, jobs: Sequence[Job]) -> None:
        counts = Counter((j.gpus, tuple(j.gpu_types)) for j in jobs)
        total = sum(counts.values()) or 1
        self.classes = [(k, types, n / total) for (k, types), n in sorted(counts.items())]
        self._build_tables(view)

    def _build_tables(self, view: ClusterView) -> None:
        """F(f) for every (card type, capacity) of the cluster and every free count f."""
        kinds = sorted(set(zip(view.host_model_id.tolist(), view.host_capacity.tolist())))
        index = {kind: i for i, kind in enumerate(kinds)}
        self.host_type = np.array([index[kc] for kc in zip(view.host_model_id.tolist(),
                                                           view.host_capacity.tolist())], dtype=np.int64)
        width = int(view.host_capacity.max(initial=0)) + 1
        table = np.zeros((len(kinds), width))
        f = np.arange(width)
        for t, (model, cap) in enumerate(kinds):
            for k, types, p in self.classes:
                allowed = bool(view.allowed_models(types)[model])
                useless = (f < min(k, cap)) if allowed else np.ones(width, dtype=bool)
                table[t] += p * np.where(useless & (f <= cap), f, 0)
        self.table = table

    def growth(self, view: ClusterView, hosts: np.ndarray, take) -> np.ndarray:
        """Fragmentation growth of taking ``take`` GPUs from each of ``hosts``."""
        f = view.host_free[hosts]
        t = self.host_type[hosts]
        return self.table[t, f - take] - self.table[t, f]

    def place(self, view: ClusterView, job: Job) -> list[GpuKey] | None:
        if not self.classes:
            self.prepare(view, [job])
        k = job.gpus
        hosts = self.single_host_candidates(view, job)
        if len(hosts):
            h = int(hosts[np.argmin(self.growth(view, hosts, k))])  # first minimum: smallest name
            return self.keys(view, view.free_positions(h)[:k])
        best = None
        for m in self.feasible_models(view, job).tolist():
            hosts = np.flatnonzero((view.host_model_id == m) & (view.host_free > 0))
            chosen, total, left = [], 0.0, k
            while left > 0:
                take = np.minimum(view.host_free[hosts], left)
                g = self.growth(view, hosts, take)
                i = int(np.argmin(g / take))
                chosen.append((int(hosts[i]), int(take[i])))
                total += float(g[i])
                left -= int(take[i])
                hosts = np.delete(hosts, i)
            if best is None or total < best[0] - 1e-12:
                best = (total, chosen)
        if best is None:
            return None
        out: list[int] = []
        for h, n in best[1]:
            out.extend(view.free_positions(h)[:n].tolist())
        return self.keys(view, sorted(out))
