"""The one walk of an admission pass: the queue visited in the order its
:class:`~.rules.base.Ordering` gives, each entry decided by the same steps, the rules consulted
through :class:`~.rules.base.Rule` (docs/queue.md has the steps with a worked example).

1. **impossible**: no pool of the cluster as it is can ever hold it; it never claims or blocks;
2. the rules' **verdict**: the pools it may use now (a team's quota, its ``max_jobs``); a rule
   that leaves none refuses it (it waits with that rule's reason) or defers it to a later stage;
3. it **starts now** on GPUs neither held nor claimed for a head ahead of it;
4. else a rule may **claim** for it (preemption), else it becomes the **head** of the pools it
   may use that have none yet, with a claim (:mod:`~.claims`); else it waits behind the heads.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from airflow_hetero_gpu.core.admission import reasons
from airflow_hetero_gpu.core.admission.claims import claim_for
from airflow_hetero_gpu.core.admission.model import Admitted, AdmissionResult, QueueEntry, Waiting
from airflow_hetero_gpu.core.admission.order import effective_priority
from airflow_hetero_gpu.core.admission.passstate import PassState, Shape
from airflow_hetero_gpu.core.admission.records import Held, Item, Outcome, Reason, ReasonKind, Verdict
from airflow_hetero_gpu.core.admission.rules.base import Ordering, Rule
from airflow_hetero_gpu.core.model import PlanRequest

_KIND = {"impossible": ReasonKind.IMPOSSIBLE, "head": ReasonKind.HEAD, "waiting": ReasonKind.QUEUE}
_NO_HEADS: tuple = ()  # behind no head: one empty sequence for every such entry (nobody changes it)


class Walk:
    """One pass's walk: ``adm`` the Admission (cluster, placer), ``p`` the pass's bookkeeping."""

    def __init__(self, adm, p: PassState, *, explain: bool) -> None:
        self.adm, self.p, self.explain = adm, p, explain
        self.cluster = adm.cluster
        self.rules: list[Rule] = []
        self.admitted: list[Admitted] = []
        self.held: list[Held] = []
        self.position = 0  # among the entries that keep waiting
        self._shapes: dict[int, Shape] = {}  # id(request) -> what this pass learnt about it
        self._by_value: dict[PlanRequest, Shape] = {}
        self._together: dict[tuple[int, int], tuple] = {}  # see _verdict

    def shape_of(self, entry: QueueEntry) -> Shape:
        shape = self._shapes.get(id(entry.request))
        if shape is None:
            shape = self._by_value.get(entry.request)
            if shape is None:
                shape = self._by_value[entry.request] = Shape(entry.request, *self.adm.accepts(entry.request))
            self._shapes[id(entry.request)] = shape
        return shape

    def run(self, ordering: Ordering, entries: Sequence[QueueEntry], now: float) -> AdmissionResult:
        self._verdicts, self._notes, self._helds = (_saying(self.rules, h) for h in ("verdict", "note", "held"))
        ordering.walk(self, entries, self.visit)
        result = self._result(now, entries)
        for rule in self.rules:
            result = rule.finish(self, result)
        return result

    # --- one entry ---------------------------------------------------------------------------
    def visit(self, item: Item) -> Outcome:
        shape = self.shape_of(item.entry)
        if not shape.possible:
            return self._record(item, "impossible", None, shape, _NO_HEADS)
        verdict = self._verdict(item, shape)
        if verdict.refusal is not None:
            if verdict.defer:
                return Outcome.DEFERRED
            return self._record(item, "waiting", None, shape, _NO_HEADS, verdict.refusal)
        pools = verdict.pools
        same = pools is shape.ok or (pools.shape == shape.ok.shape and bool((pools == shape.ok).all()))
        sub = shape if same else Shape(shape.request, pools, shape.rejected)
        if self._start(item, shape, sub, verdict):
            return Outcome.STARTED
        return self._hold(item, sub)

    def _verdict(self, item: Item, shape: Shape) -> Verdict:
        """Every rule's say, together: the pools all of them allow; the first refusal. Where one
        rule alone says, the same answer of that rule for the same shape gives the same verdict
        (a rule may hand its answers out again: the quota rule does)."""
        pools, borrow, said_once = shape.ok, {}, None
        for rule in self._verdicts:
            said = rule.verdict(self, item, shape)
            if said is None:
                continue
            if said.refusal is not None:
                return said
            said_once = said if pools is shape.ok else None
            pools, borrow = pools & said.pools, said.borrow or borrow
        if said_once is None or pools is shape.ok:
            return Verdict(pools, borrow)
        hit = self._together.get((id(shape), id(said_once)))
        if hit is None or hit[0] is not shape or hit[1] is not said_once:
            if pools.shape == shape.ok.shape and bool((pools == shape.ok).all()):
                pools = shape.ok  # no pool taken away: the shape's own mask, which visit() sees at once
            else:
                pools.flags.writeable = False  # handed out again: nobody may change it
            hit = self._together[(id(shape), id(said_once))] = (shape, said_once, Verdict(pools, borrow))
        return hit[2]

    def _start(self, item: Item, shape: Shape, sub: Shape, verdict: Verdict) -> bool:
        entry = item.entry
        if sub.dead and not entry.claim:
            return False
        outside = None if sub is shape else ~verdict.pools[self.cluster.pool_of]
        placement = self.p.try_start(entry, sub, outside)
        if placement is None:
            return False
        pos = self.p.admit(entry.job_id, placement.gpus)
        pool = int(self.cluster.pool_of[pos[0]])
        decision = placement.result.decision if placement.result is not None else None
        admitted = Admitted(entry.job_id, item.rank, tuple(placement.gpus), placement.pool or self.cluster.pools[pool].id,
                            decision, item.team, verdict.borrow.get(pool, 0))
        self.admitted.append(admitted)
        for rule in self.rules:
            rule.started(self, item, admitted, pool)
        return True

    def _hold(self, item: Item, sub: Shape) -> Outcome:
        """An entry that could use ``sub``'s pools but did not start: a rule's claim, else the
        usual head and claim, else it waits behind the heads (its shape is then dead: held and
        claimed GPUs only grow in a pass)."""
        entry, claim = item.entry, None
        if not (sub.dead and not entry.claim):
            claim = next((c for c in (r.blocked(self, item, sub) for r in self.rules) if c is not None), None)
            claim = claim or claim_for(self.p, entry, sub)
        if claim is None:
            sub.dead = True
            return self._record(item, "waiting", None, sub, self.p.heads_for(sub.ok))
        return self._record(item, "head", claim, sub, _NO_HEADS)

    def _record(self, item: Item, state: str, claim, shape: Shape, heads: Sequence,
                refusal: Reason | None = None) -> Outcome:
        self.position += 1
        notes: tuple[Reason, ...] = ()
        if self.explain and state != "impossible" and refusal is None:
            notes = tuple(n for n in (r.note(self, item) for r in self._notes) if n is not None)
        if self.explain or state != "waiting":
            self.held.append(Held(self.position, item.entry, state, claim, shape, heads, refusal, notes))
        if state != "impossible":
            for rule in self._helds:
                rule.held(self, item, shape, claim, refusal is not None)
        return Outcome.HELD

    # --- the answer --------------------------------------------------------------------------
    def _result(self, now: float, entries: Sequence[QueueEntry]) -> AdmissionResult:
        out: list[Waiting] = []
        ahead = [0] * len(self.cluster.pools)  # waiting jobs so far accepting each pool
        aging, explain = self.adm.aging, self.explain
        pools_of: dict[int, tuple] = {}  # id(shape) -> (shape, its pools' indices): see _pools
        behinds: dict[int, tuple] = {}  # id(heads) -> (heads, reasons.behind(heads))
        names: dict[int, tuple] = {}  # id(heads) -> (heads, their job ids)
        for h in self.held:
            if explain:
                text = self._text(h, ahead, pools_of, behinds)
                if h.state != "impossible":
                    for i in self._pools(h.shape, pools_of):
                        ahead[i] += 1
            else:
                text = ""
            kind = h.refusal.kind if h.refusal is not None else _KIND[h.state]
            heads = names.get(id(h.heads))  # the jobs behind the same heads share one list
            if heads is None or heads[0] is not h.heads:
                heads = names[id(h.heads)] = (h.heads, tuple(c.job_id for c in h.heads))
            out.append(Waiting(h.entry.job_id, h.position, h.state, text, effective_priority(h.entry, now, aging),
                               h.claim, heads[1], kind))
        return AdmissionResult(now, self.admitted, out, entries)

    @staticmethod
    def _pools(shape: Shape, pools_of: dict[int, tuple]) -> list[int]:
        """The indices of the pools ``shape`` may use, once per shape in an answer."""
        hit = pools_of.get(id(shape))
        if hit is None or hit[0] is not shape:
            hit = pools_of[id(shape)] = (shape, np.flatnonzero(shape.ok).tolist())
        return hit[1]

    def _text(self, h: Held, ahead: list[int], pools_of: dict[int, tuple], behinds: dict[int, tuple]) -> str:
        if h.refusal is not None:
            text = reasons.refused(h.position, h.refusal.kind, h.refusal.text)
        elif h.state == "impossible":
            text = reasons.impossible(h.entry.request, h.shape.rejected)
        elif h.state == "head":
            text = reasons.head(h.position, h.claim)
        else:
            pools = self._pools(h.shape, pools_of)  # a shape with one pool says its place there
            single = self.cluster.pools[pools[0]].id if len(pools) == 1 else None
            pool_pos = ahead[pools[0]] + 1 if single else None
            said = behinds.get(id(h.heads))  # the waiting jobs behind the same heads share one list
            if said is None or said[0] is not h.heads:
                said = behinds[id(h.heads)] = (h.heads, reasons.behind(h.heads))
            text = reasons.waiting(h.position, h.heads, single, pool_pos, h.shape.why_not, h.shape.no_target,
                                   said[1])
        return text + "".join(f"; {n.text}" for n in h.notes if n.text) if h.notes else text


def walk_queue(adm, p: PassState, ordering: Ordering, rules: Iterable[Rule], entries: Sequence[QueueEntry],
               now: float, *, explain: bool) -> AdmissionResult:
    """One pass: ``entries`` (in queue order) walked by ``ordering`` with ``rules``."""
    walk = Walk(adm, p, explain=explain)
    walk.rules = list(rules)
    return walk.run(ordering, entries, now)


def _saying(rules: Sequence[Rule], hook: str) -> list[Rule]:
    """The rules whose ``hook`` is their own (the others' is :class:`Rule`'s, which does nothing):
    the walk asks only those, once per entry."""
    return [r for r in rules if getattr(type(r), hook) is not getattr(Rule, hook)]
