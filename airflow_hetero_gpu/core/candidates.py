"""The hosts a selection (SPEC §7.1) looks at: a pool's available GPUs grouped by host.

:func:`~airflow_hetero_gpu.core.selection.select_gpus` ranks hosts one by one, which at 100,000
GPUs (12,500 hosts) costs tens of milliseconds per request in Python alone. This module narrows
its input with numpy over all hosts at once, to the hosts it would choose anyway:

* **Some host can hold all k GPUs**: the ranking (smallest mean distance among the host's best
  k, then fewer available GPUs, then host name) depends on a host only through its wiring and
  its set of available rows, so it is computed once per distinct (wiring, rows) signature and
  only the winning host is handed on.
* **The job spans hosts**: for every switch (and NVLink domain) the m hosts with the most
  available GPUs are found by one sort of the (host, switch) pairs; the feasible switches of the
  lowest tier get their mean distance from their hosts' best shares (cached by signature) and
  the tiers between those hosts; only the winner's m hosts are handed on.

``select_gpus`` then chooses exactly what it would have chosen among all hosts (the tests compare
both on random fleets). Where the vector form does not apply (a host under two switches of one
tier, more than 48 GPUs in a host, MIG instances sharing a row) every host is handed on.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from airflow_hetero_gpu.core.selection import HostAvail, best_subset
from airflow_hetero_gpu.core.topology import DOMAIN_TIER, INTER_HOST_UNIT, NVLINK_DOMAIN_DISTANCE
from airflow_hetero_gpu.core.view import PoolView

#: rows are packed into one int64 bitmask per host, the wiring id above them
_MAX_ROWS = 48
_BULK = 64  # above this many hosts, records are built from whole-array lists


def host_candidates(view: PoolView, k: int, *, narrow: bool = True) -> list[HostAvail]:
    """The pool's available GPUs grouped by host, in host-name order.

    When some host can hold all k GPUs, only such hosts are eligible (§7.1 looks no further);
    otherwise every host with an available GPU is. ``narrow`` (the default) returns only the
    hosts the selection will choose among those, where the vector form applies.
    """
    c = view.state.cluster
    pos, hid, starts, ends, counts = view.memo("host_groups", lambda: _groups(c, view.positions_where("available")))
    if len(pos) == 0:
        return []
    codes = lambda: view.memo("host_signatures", lambda: _signatures(c, pos, starts))  # noqa: E731
    if counts.max() >= k:
        keep = np.flatnonzero(counts >= k)
        chosen = _best_fitting_host(c, hid, starts, counts, keep, k, codes) if narrow else None
    else:
        keep = np.arange(len(starts))
        chosen = None
        if narrow:
            ranked = view.memo("host_ranks", lambda: _ranked_pairs(c, hid[starts], counts))
            chosen = _spanning_hosts(c, hid[starts], counts, k, codes, ranked)
    if chosen is not None:
        keep = chosen
    return _records(c, pos, hid, starts, ends, keep)


def _groups(c, pos: np.ndarray) -> tuple:
    """The available positions ``pos`` by host: (pos, host of each, start, end and count of each
    host's run); the same for every k."""
    if len(pos) == 0:
        return pos, None, None, None, None
    hid = c.host_of[pos]
    cuts = np.flatnonzero(hid[1:] != hid[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(pos)]))
    out = (pos, hid, starts, ends, ends - starts)
    for a in out:  # shared by the questions of every k: never written to
        a.flags.writeable = False
    return out


def _records(c, pos, hid, starts, ends, keep: np.ndarray) -> list[HostAvail]:
    keys_of, mids = c.keys, c.host_matrix_ids
    if len(keep) <= _BULK:
        out = []
        for i in keep.tolist():
            s, e = int(starts[i]), int(ends[i])
            h = int(hid[s])
            out.append(HostAvail(c.hosts[h], tuple(keys_of[p] for p in pos[s:e].tolist()),
                                 tuple(c.row_of[pos[s:e]].tolist()), mids[h]))
        return out
    hid_l, row_l = hid.tolist(), c.row_of[pos].tolist()
    keys_l = [keys_of[p] for p in pos.tolist()]
    return [HostAvail(c.hosts[hid_l[s]], tuple(keys_l[s:e]), tuple(row_l[s:e]), mids[hid_l[s]])
            for s, e in zip(starts[keep].tolist(), ends[keep].tolist())]


@lru_cache(maxsize=65536)
def _rows_of_mask(mask: int) -> tuple[int, ...]:
    return tuple(r for r in range(mask.bit_length()) if mask >> r & 1)


def _signatures(c, pos, starts) -> np.ndarray | None:
    """(wiring id << 48 | available-rows bitmask) of each host (run of ``pos`` from ``starts``),
    or None where a bitmask cannot stand for the rows."""
    rows = c.row_of[pos]
    if rows.max() >= _MAX_ROWS:
        return None
    bits = np.left_shift(np.int64(1), rows.astype(np.int64))
    masks = np.bitwise_or.reduceat(bits, starts)
    if not np.array_equal(np.add.reduceat(bits, starts), masks):
        return None  # a row listed twice on a host (MIG instances)
    mids = c.host_matrix_id_array[c.host_of[pos[starts]]]
    if mids.min() < 0 or mids.max() >= (1 << (62 - _MAX_ROWS)):
        return None
    return (mids << _MAX_ROWS) | masks


def _pair_sums(c, codes: np.ndarray, takes: np.ndarray | int) -> np.ndarray:
    """Pair-distance sum of the best ``take`` rows of each signature (once per distinct one)."""
    low = (1 << _MAX_ROWS) - 1

    def one(code: int, take: int) -> int:
        mid = code >> _MAX_ROWS
        return best_subset(mid, c.matrices[mid], _rows_of_mask(code & low), take)[0] if take > 1 else 0

    if isinstance(takes, int):
        uniq, inverse = np.unique(codes, return_inverse=True)
        return np.fromiter((one(u, takes) for u in uniq.tolist()), dtype=np.int64, count=len(uniq))[inverse.reshape(-1)]
    memo: dict[tuple[int, int], int] = {}
    out = []
    for pair in zip(codes.tolist(), takes.tolist()):
        v = memo.get(pair)
        if v is None:
            v = memo[pair] = one(*pair)
        out.append(v)
    return np.asarray(out, dtype=np.int64)


def _best_fitting_host(c, hid, starts, counts, keep, k: int, signatures) -> np.ndarray | None:
    if len(keep) == 1:
        return keep
    host_ids = hid[starts[keep]]
    cnt = counts[keep]
    if k == 1:  # every host's best is one GPU at distance 0: fewest available, then name
        return keep[np.lexsort((host_ids, cnt))[:1]]
    codes = signatures()
    if codes is None:
        return None
    sums = _pair_sums(c, codes[keep], k)
    return keep[np.lexsort((host_ids, cnt, sums))[:1]]


# --- jobs that span hosts ----------------------------------------------------------------------
@dataclass(frozen=True)
class _SpanIndex:
    """The network as arrays over the cluster's hosts (built once per cluster)."""

    group_tier: np.ndarray  # per group number, in spanning_groups order (domains, then switches)
    level_of: np.ndarray  # per host and level (domain, then each switch tier): group number or -1
    level_tier: tuple[int, ...]  # tier of each level
    unit: tuple[int, ...]  # distance between two hosts whose lowest common level is this one


def _span_index(c) -> _SpanIndex | None:
    net = c.net
    cached = c.__dict__.get("_span_index")
    if cached is not None and cached[0] is net:
        return cached[1]
    index = _build_span_index(c)
    c.__dict__["_span_index"] = (net, index)
    return index


def _build_span_index(c) -> _SpanIndex | None:
    net = c.net
    host_id = {h: i for i, h in enumerate(c.hosts)}
    groups = [(name, DOMAIN_TIER, members) for name, members in net.domains.items()]
    if not net.flat:
        groups += list(net.groups)
    tiers = sorted({t for _, t, _ in groups if t != DOMAIN_TIER})
    level_tier = (DOMAIN_TIER, *tiers)
    level_no = {t: i for i, t in enumerate(level_tier)}
    level_of = np.full((len(c.hosts), len(level_tier)), -1, dtype=np.int64)
    for g, (_, tier, members) in enumerate(groups):
        lv = level_no[tier]
        for h in members:
            i = host_id.get(h)
            if i is None:
                continue
            if level_of[i, lv] != -1:
                return None  # under two groups of one tier: not a tree
            level_of[i, lv] = g
    unit = (NVLINK_DOMAIN_DISTANCE, *(INTER_HOST_UNIT * t for t in tiers))
    return _SpanIndex(np.asarray([t for _, t, _ in groups], dtype=np.int64), level_of, level_tier, unit)


def _ranked_pairs(c, host_ids, counts) -> tuple | None:
    """What the spanning selection reads of the hosts whatever k: the hosts most available first
    (then by name), and every (host, group) pair sorted by group, then by that rank, with each
    pair's place in its group (None: the network is no tree). Kept in the pool's view cache."""
    idx = _span_index(c)
    if idx is None:
        return None
    n = len(host_ids)
    order = np.lexsort((host_ids, -counts))  # most available first, then name
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    # the pairs of these hosts read from their rows of ``level_of`` (one group per level), not
    # filtered out of the whole network's pairs
    lv = idx.level_of[host_ids]
    inside = lv >= 0
    p_local = np.nonzero(inside)[0]  # each pair's host, in the row-major order of lv[inside]
    p_group = lv[inside]
    srt = np.lexsort((rank[p_local], p_group))
    p_local, p_group = p_local[srt], p_group[srt]
    within = np.arange(len(p_group)) - np.searchsorted(p_group, p_group, side="left")
    out = (idx, order, np.cumsum(counts[order]), p_local, p_group, within)
    for a in out[1:]:
        a.flags.writeable = False
    return out


def _spanning_hosts(c, host_ids, counts, k: int, signatures, ranked) -> np.ndarray | None:
    """Indices (into ``starts``) of the m hosts the spanning selection will use, or None."""
    if ranked is None:
        return None
    idx, order, held_first, p_local, p_group, within = ranked
    n = len(host_ids)
    m = int(np.searchsorted(held_first, k) + 1)
    if m > n:
        return None
    # every group's m best hosts: the first m pairs of each group
    top = within < m
    t_local, t_group = p_local[top], p_group[top]
    n_groups = len(idx.group_tier)
    taken = np.bincount(t_group, minlength=n_groups)
    held = np.bincount(t_group, weights=counts[t_local], minlength=n_groups)
    feasible = np.flatnonzero((taken == m) & (held >= k))
    everyone = order[:m][None, :]  # the whole set: "(all hosts)" / "(no common switch)"
    if len(feasible):
        tier = idx.group_tier[feasible].min()
        flat_switch = c.net.flat and tier > DOMAIN_TIER
        if not flat_switch:
            feasible = feasible[idx.group_tier[feasible] == tier]
            chosen = np.zeros(n_groups, dtype=bool)
            chosen[feasible] = True
            members = t_local[chosen[t_group]].reshape(len(feasible), m)  # rank order per group
            best = _lowest_distance(c, idx, counts, host_ids, members, k, signatures)
            return None if best is None else np.sort(best)
    best = _lowest_distance(c, idx, counts, host_ids, everyone, k, signatures)
    return None if best is None else np.sort(best)


@lru_cache(maxsize=64)
def _pairs(m: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair (a < b) of m hosts, a then b ascending (read-only)."""
    a, b = np.triu_indices(m, 1)
    a.flags.writeable = b.flags.writeable = False
    return a, b


def _lowest_distance(c, idx: _SpanIndex, counts, host_ids, members: np.ndarray, k: int, signatures):
    """Of candidate host sets (rows of ``members``: local host indices, most available first),
    the one with the smallest mean distance, ties to the smaller sorted host names."""
    g, m = members.shape
    cnt = counts[members]
    before = np.cumsum(cnt, axis=1) - cnt
    take = np.minimum(cnt, np.maximum(0, k - before))
    codes = signatures()
    if codes is None:
        return None
    intra = _pair_sums(c, codes[members.reshape(-1)], take.reshape(-1)).reshape(g, m).sum(axis=1)
    hosts = host_ids[members]  # cluster host ids
    lv = idx.level_of[hosts]  # (g, m, levels)
    outside = INTER_HOST_UNIT * (1 if c.net.flat else c.net.max_tier + 1)  # no common switch
    # every pair (a < b) of each set's hosts at once: the lowest level they share gives their
    # distance, weighted by the GPUs taken on each (integers: the sum is exact in any order)
    a, b = _pairs(m)
    la = lv[:, a, :]
    same = (la == lv[:, b, :]) & (la >= 0)  # (g, pairs, levels)
    unit = np.asarray(idx.unit, dtype=np.int64)[np.argmax(same, axis=2)]
    dist = np.where(same.any(axis=2), unit, outside)
    inter = (dist * take[:, a] * take[:, b]).sum(axis=1, dtype=np.int64)
    total = intra + inter
    best = total.min()
    tied = np.flatnonzero(total == best)
    if len(tied) > 1:
        names = np.sort(hosts[tied], axis=1)
        tied = tied[np.lexsort(names.T[::-1])[:1]]
    return members[tied[0]]
