"""What one admission pass keeps for the next over the same cluster: the live reservations' GPU
positions and the pass's starting arrays, and the teams' holdings counted from them.

A pass at 100,000 GPUs starts from some 58,000 reservations: looking each GPU's position up (a
tuple hashed per key, the keys scattered in memory) cost about 30 ms a pass, and counting the
teams' holdings 10 ms more, although between two passes the holdings often do not change (an
enqueue, a renewal, a pass that admits nobody). :class:`KeptHeld` keeps a copy of the last
``reserved`` mapping and what was computed from it, and hands it back only when the next
``reserved`` is **equal** to the copy (the same GPUs held by the same jobs: a dict comparison,
which reuses the hashes stored in the dicts, about 2.5 ms at 58,000 entries). Anything else is
a miss and is computed afresh, so a kept answer is never stale: there is no version to trust, and
a caller that changes its dict in place between passes is seen as a change.

It lives with the admission's per-cluster state (``Admission._static``: one cluster object, one
set of evictions, drains and configuration), so what it keeps depends only on its key and on that
state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import itertools
import operator

import numpy as np

from airflow_hetero_gpu.core.admission.running import RunningColumns
from airflow_hetero_gpu.core.model import GpuKey


_SERIALS = itertools.count(1)


@dataclass(frozen=True)
class Start:
    """The arrays a pass starts from for one ``reserved`` mapping (read-only: a pass copies the
    ones it changes). ``pos`` and ``jobs`` are the reservations' GPU positions (-1: a GPU the
    cluster no longer lists) and job ids, in the order of the mapping they were computed from."""

    pos: np.ndarray
    jobs: list
    held: np.ndarray
    usable: np.ndarray
    free: np.ndarray
    host_cap: np.ndarray
    host_held: np.ndarray


def start_arrays(adm: Any, pos: np.ndarray, jobs: list) -> Start:
    """The pass's starting arrays for reservations at ``pos`` (``adm``: the Admission)."""
    c = adm.cluster
    held = np.zeros(len(c.gpus), dtype=bool)
    held[pos[pos >= 0]] = True
    return start_from_mask(adm, held, pos, jobs)


def start_from_mask(adm: Any, held: np.ndarray, pos: np.ndarray | None, jobs: list | None) -> Start:
    c = adm.cluster
    # usable: could serve a queued job now or once its holder ends (a held GPU's load is its job's)
    usable = adm.healthy & ~(adm.loaded & ~held) & ~adm.on_drained
    free = np.bincount(c.pool_of[usable & ~held], minlength=len(c.pools))
    # per host: usable GPUs not claimed, and how many of those are held
    host_cap = np.bincount(c.host_of[usable], minlength=len(c.hosts))
    host_held = np.bincount(c.host_of[usable & held], minlength=len(c.hosts))
    for a in (pos, held, usable, free, host_cap, host_held):
        if a is not None:
            a.flags.writeable = False  # shared with the next passes: a pass copies what it changes
    return Start(pos, jobs, held, usable, free, host_cap, host_held)


class KeptHeld:
    """The last pass's :class:`Start` and teams' holdings, handed back while the inputs are equal
    to those they were computed from (see the module docstring)."""

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Drop everything kept (the next pass computes afresh)."""
        # each a tuple replaced whole, so that passes in two threads never mix two states' parts
        self._last: tuple[dict, Start, int] | None = None  # (reserved copy, its Start, serial)
        self._holdings: tuple | None = None  # ((serial, key), team_of copy, counts)
        self._memo: dict = {}  # see memo()
        self._running: tuple | None = None  # (the jobs, their columns): see columns()

    def columns(self, running: Sequence[Any], cluster: Any, *, build: bool = True) -> RunningColumns | None:
        """The running jobs' :class:`~.running.RunningColumns`, kept while a pass is given the very
        same job objects in the same order (frozen: the same objects say the same; the copy of the
        list kept here holds them, so no other object can take one of their ids). ``build``
        False: None unless they are kept (a pass that may not need them builds nothing)."""
        last = self._running
        if last is not None and len(last[0]) == len(running) and all(map(operator.is_, last[0], running)):
            return last[1]
        if not build:
            return None
        cols = RunningColumns(running, cluster)
        self._running = (list(running), cols)
        return cols

    def memo(self, key: Any, compute):
        """What depends only on the per-cluster state this object lives with (and on ``key``)."""
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) >= 64:
                self._memo.clear()
            hit = self._memo[key] = compute()
        return hit

    def start(self, adm: Any, reserved: Mapping[GpuKey, str]) -> tuple[Start, int]:
        """The :class:`Start` of ``reserved`` and a serial number, new whenever it was computed
        afresh (what :meth:`holdings` keys on)."""
        last = self._last
        if last is not None and type(reserved) is dict and len(last[0]) == len(reserved) and last[0] == reserved:
            return last[1], last[2]
        start = start_arrays(adm, adm.cluster.positions_of(list(reserved)), list(reserved.values()))
        serial = next(_SERIALS)
        if type(reserved) is dict:  # another Mapping may not compare fast: not kept
            self._last = (dict(reserved), start, serial)
        return start, serial

    def holdings(self, serial: int, team_of: Mapping[str, str], key: tuple, compute) -> dict:
        """The teams' holdings for the :class:`Start` of ``serial`` and ``team_of`` (the team of
        every job holding GPUs), with ``key`` the rest of what they depend on: kept while all of
        them are equal, else ``compute()``."""
        hit = self._holdings
        if (hit is not None and hit[0] == (serial, key) and type(team_of) is dict and len(hit[1]) == len(team_of)
                and hit[1] == team_of):
            return dict(hit[2])
        counts = compute()
        self._holdings = ((serial, key), dict(team_of), dict(counts)) if type(team_of) is dict else None
        return counts
