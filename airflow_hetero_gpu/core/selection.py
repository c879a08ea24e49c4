"""Which k GPUs inside a pool (SPEC §7.1), and which GPU replaces an abnormal one (SPEC §8).

* One host can hold the job: on each such host the k-subset with the smallest mean distance
  (exact search up to 16 available GPUs a host, greedy above), then the host with the smallest
  d, ties to the host with *fewer* available GPUs (best fit), then host name, then the lowest
  GPU indices.
* Else span hosts: as few hosts as possible, inside one multi-node NVLink domain or under the
  lowest common switch tier possible, hosts with the most available GPUs first, each host's
  share chosen as above.

All or nothing: the result has exactly k GPUs or is ``None``. The keys come in *rank order*: the
hosts along the network tree (:func:`rank_order`: the hosts of one NVLink domain, of one leaf
switch, of one spine, consecutive), each host's GPUs by index, so that the ring and tree
collectives that follow node ranks cross each switch as few times as possible.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from math import comb
from typing import Callable, Sequence

import numpy as np

from airflow_hetero_gpu.core.model import GpuKey
from airflow_hetero_gpu.core.topology import NetworkTiers, across_hosts

EXACT_SEARCH_MAX_GPUS = 16
EPS = 1e-9

# (matrix id, available rows, k) -> (pair-distance sum, chosen rows). Bounded; cleared when full.
_SUBSET_CACHE: dict[tuple[int, tuple[int, ...], int], tuple[int, tuple[int, ...]]] = {}
_SUBSET_CACHE_MAX = 500_000
_COMBOS: dict[tuple[int, int], np.ndarray] = {}


def _combos(n: int, k: int) -> np.ndarray:
    arr = _COMBOS.get((n, k))
    if arr is None:
        arr = np.array(list(combinations(range(n), k)), dtype=np.int64).reshape(-1, k)
        _COMBOS[(n, k)] = arr
    return arr


def best_subset(matrix_id: int, matrix: np.ndarray, rows: tuple[int, ...], k: int) -> tuple[int, tuple[int, ...]]:
    """The k of ``rows`` (indices into ``matrix``, ascending) with the smallest pair-distance sum.

    Returns (sum of pair distances, chosen rows). Ties go to the lexicographically smallest rows,
    i.e. the lowest GPU indices. Cached by (matrix content id, rows, k).
    """
    key = (matrix_id, rows, k)
    hit = _SUBSET_CACHE.get(key)
    if hit is not None:
        return hit
    n = len(rows)
    if k == n:
        r = list(rows)
        result = (int(matrix[np.ix_(r, r)].sum()) // 2, rows)
    elif k == 1:
        result = (0, rows[:1])
    elif n <= EXACT_SEARCH_MAX_GPUS and comb(n, k) <= 20_000:
        sub = matrix[np.ix_(rows, rows)]
        cmb = _combos(n, k)
        sums = np.zeros(len(cmb), dtype=np.int64)
        for i in range(k):
            for j in range(i + 1, k):
                sums += sub[cmb[:, i], cmb[:, j]]
        best = int(np.argmin(sums))  # first minimum = lexicographically smallest
        result = (int(sums[best]), tuple(rows[c] for c in cmb[best]))
    else:
        result = _greedy_subset(matrix, rows, k)
    if len(_SUBSET_CACHE) >= _SUBSET_CACHE_MAX:
        _SUBSET_CACHE.clear()
    _SUBSET_CACHE[key] = result
    return result


def _greedy_subset(matrix: np.ndarray, rows: tuple[int, ...], k: int) -> tuple[int, tuple[int, ...]]:
    """Above the exact-search size: start from the closest pair, add the GPU nearest to the set."""
    sub = matrix[np.ix_(rows, rows)].astype(np.int64)
    n = len(rows)
    masked = sub + np.eye(n, dtype=np.int64) * (1 << 40)
    i, j = np.unravel_index(int(np.argmin(masked)), masked.shape)
    chosen = [min(i, j), max(i, j)]
    acc = sub[chosen[0]] + sub[chosen[1]]
    total = int(sub[chosen[0], chosen[1]])
    while len(chosen) < k:
        cand = acc.copy()
        cand[chosen] = 1 << 40
        nxt = int(np.argmin(cand))
        total += int(acc[nxt])
        chosen.append(nxt)
        acc = acc + sub[nxt]
    chosen.sort()
    return total, tuple(rows[c] for c in chosen)


@dataclass(frozen=True)
class HostAvail:
    """One host's available units in a pool: whole GPUs, or MIG instances (several share the
    row of their GPU in the distance matrix)."""

    host: str
    keys: tuple[GpuKey, ...]  # ascending (index, instance)
    rows: tuple[int, ...]  # the same units as rows of the host's distance matrix
    matrix_id: int

    @classmethod
    def of_indices(cls, host: str, indices, rows, matrix_id: int) -> "HostAvail":
        """Whole GPUs given by nvidia-smi index."""
        return cls(host, tuple(GpuKey(host, int(i)) for i in indices), tuple(rows), matrix_id)

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class Selection:
    keys: tuple[GpuKey, ...]  # in rank order (module docstring)
    mean_distance: float


def _host_share(h: HostAvail, k: int, matrices: Sequence[np.ndarray]) -> tuple[int, tuple[GpuKey, ...]]:
    pair_sum, rows = best_subset(h.matrix_id, matrices[h.matrix_id], h.rows, k)
    if k == 1:  # the first unit on that row (MIG instances of one GPU share their GPU's row)
        return pair_sum, (h.keys[h.rows.index(rows[0])],)
    row_to_key = dict(zip(h.rows, h.keys))  # k > 1: whole GPUs, one row each
    # a whole GPU's key is (host, index), an instance's (host, index, instance): plain tuple
    # order puts a GPU before its instances
    return pair_sum, tuple(sorted(row_to_key[r] for r in rows))


def rank_order(hosts, net: NetworkTiers) -> list[str]:
    """``hosts`` along the network tree: sorted by their path from the top switch down (spine,
    leaf, NVLink domain), then by name, so the hosts under one leaf switch or in one NVLink
    domain get consecutive node ranks (``a1, b1, a2, b2`` with ``a*`` under one leaf and ``b*``
    under another gives ``a1, a2, b1, b2``)."""
    return sorted(hosts, key=lambda h: (tuple(reversed(net.groups_of(h))), h))


def select_gpus(
    hosts: Sequence[HostAvail],
    k: int,
    matrices: Sequence[np.ndarray],
    net: NetworkTiers,
) -> Selection | None:
    """Choose k GPUs among the pool's available ones (SPEC §7.1), or ``None`` if fewer exist."""
    if sum(len(h.keys) for h in hosts) < k:
        return None
    pairs = k * (k - 1) / 2
    fits = [h for h in hosts if len(h.keys) >= k]
    if fits:
        best = None
        seen: set[tuple[int, tuple[int, ...]]] = set()
        for h in fits:  # in host-name order
            signature = (h.matrix_id, h.rows)
            if signature in seen:  # same wiring, same free GPUs as an earlier (smaller-named) host
                continue
            seen.add(signature)
            pair_sum, keys = _host_share(h, k, matrices)
            rank = (pair_sum, len(h.keys), h.host, keys)
            if best is None or rank < best[0]:
                best = (rank, keys)
        d = best[0][0] / pairs if k > 1 else 1.0
        return Selection(best[1], d)
    return _span_hosts(hosts, k, matrices, net)


def _span_hosts(hosts: Sequence[HostAvail], k: int, matrices, net: NetworkTiers) -> Selection | None:
    pairs = k * (k - 1) / 2
    order = sorted(hosts, key=lambda h: (-len(h.keys), h.host))
    # As few hosts as possible: the smallest m whose m largest hosts hold k.
    total, m = 0, 0
    for h in order:
        total += len(h.keys)
        m += 1
        if total >= k:
            break
    # every switch's available hosts, most available first (one pass over hosts x depth)
    members: dict[str, list[HostAvail]] = {}
    for h in order:
        for name in net.groups_of(h.host):
            members.setdefault(name, []).append(h)
    best: tuple | None = None
    best_tier = None
    for name, tier in net.spanning_groups_among(members):
        if best_tier is not None and tier > best_tier:
            break
        inside = order if name in ("(all hosts)", "(no common switch)") else members.get(name, [])
        chosen = inside[:m]
        if len(chosen) < m or sum(len(h.keys) for h in chosen) < k:
            continue
        keys: list[GpuKey] = []
        left, total = k, 0
        takes = []
        for h in chosen:
            take = min(left, len(h.keys))
            pair_sum, share = _host_share(h, take, matrices)
            keys.extend(share)
            total += pair_sum  # the pairs inside the host (the matrices' diagonals are 0)
            takes.append((h.host, take))
            left -= take
        # and the pairs across hosts: d(S) as mean_distance() gives it, from the same integers
        total += across_hosts(takes, net)
        d = total / pairs if k > 1 else 1.0
        rank = (d, tuple(sorted(h.host for h in chosen)))
        if best is None or rank[0] < best[0][0] - EPS or (abs(rank[0] - best[0][0]) <= EPS and rank[1] < best[0][1]):
            best = (rank, keys)
            best_tier = tier
    if best is None:
        return None
    ranks = {host: r for r, host in enumerate(rank_order({key.host for key in best[1]}, net))}
    keys = sorted(best[1], key=lambda key: (ranks[key[0]], key))
    return Selection(tuple(keys), best[0][0])


def choose_replacement(
    holding: Sequence[tuple],
    bad: tuple,
    candidates: Sequence[tuple],
    distance_of: Callable[[Sequence[tuple]], float],
) -> tuple | None:
    """SPEC §8: the available GPU g' minimising d(S - g + g'), ties to g's host, then (host,
    index, instance). Keys are ``GpuKey`` or plain ``(host, index)`` tuples."""
    as_key = lambda k: k if isinstance(k, GpuKey) else GpuKey(*k)  # noqa: E731
    rest = [g for g in holding if as_key(g) != as_key(bad)]
    held = {as_key(g) for g in holding}
    best = None
    for cand in candidates:
        if as_key(cand) in held:
            continue
        d = distance_of([*rest, cand])
        rank = (d, 0 if cand[0] == bad[0] else 1, *as_key(cand).sort_key)
        if best is None or rank[0] < best[0][0] - EPS or (
            abs(rank[0] - best[0][0]) <= EPS and rank[1:] < best[0][1:]
        ):
            best = (rank, tuple(cand))
    return best[1] if best else None
