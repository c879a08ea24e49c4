"""The admission rule (core/admission) on a hand-made cluster, against outcomes worked out by hand.

Cluster: hgx-a1 and hgx-a2, 8 × A100 each, every pair NV12 (d = 1); rtx-1, 4 × RTX 4090 on
PCIe, 0-1 and 2-3 PHB (4), SYS (6) across. Pools: A100 (16 GPUs) and RTX 4090 (4 GPUs).
The planner picks, among hosts that hold a job, the smallest d, then the host with fewer
available GPUs, then the host name; inside a host the lowest indices of the best set.
"""

from __future__ import annotations

import json

import pytest

from airflow_hetero_gpu.core.admission import (
    Admission, QueueEntry, admit, describe_gpus, effective_priority, ordered, passing_window_s, rank_key,
)
from airflow_hetero_gpu.core.admission.order import ordinal
from airflow_hetero_gpu.core.cluster import build_cluster
from airflow_hetero_gpu.core.model import Gpu, GpuKey, PlanRequest
from airflow_hetero_gpu.core.topology import HostWiring
from airflow_hetero_gpu.errors import RequestError

A100 = "NVIDIA A100-SXM4-80GB"
RTX = "NVIDIA GeForce RTX 4090"
POOL_A = A100
POOL_R = RTX


def _keys(spec: str) -> list[GpuKey]:
    """``hgx-a1:0-6`` or ``rtx-1:0,2`` -> GPU keys."""
    host, _, idx = spec.partition(":")
    out = []
    for part in idx.split(","):
        a, _, b = part.partition("-")
        out += [GpuKey(host, i) for i in range(int(a), int(b or a) + 1)]
    return out


def _cluster(loads: dict[str, float] | None = None):
    loads = loads or {}
    nv12 = HostWiring.from_links(range(8), {(i, j): "NV12" for i in range(8) for j in range(8) if i < j})
    rtx = HostWiring.from_links(range(4), {(0, 1): "PHB", (2, 3): "PHB", (0, 2): "SYS", (0, 3): "SYS",
                                           (1, 2): "SYS", (1, 3): "SYS"})
    gpus = [Gpu(h, i, f"GPU-{h}-{i}", A100, 81920, 0, loads.get(f"{h}:{i}", 0.0))
            for h in ("hgx-a1", "hgx-a2") for i in range(8)]
    gpus += [Gpu("rtx-1", i, f"GPU-rtx-{i}", RTX, 24564, 0, loads.get(f"rtx-1:{i}", 0.0)) for i in range(4)]
    return build_cluster(gpus, {"hgx-a1": nv12, "hgx-a2": nv12, "rtx-1": rtx})


def _reserved(spec: dict[str, str]) -> dict[GpuKey, str]:
    return {k: job for job, where in spec.items() for part in where.split(" ") for k in _keys(part)}


def _entry(job, gpus, gpu_type=None, priority=0, at=0.0, claim=None):
    return QueueEntry(job, PlanRequest(gpus, gpu_type), priority, at, tuple(_keys(claim)) if claim else ())


HELD_A1_7 = {"j1": "hgx-a1:0-6", "j2": "hgx-a2:0-7"}

# (case, reserved {job: GPUs}, evicted, loads, queue, admitted {job: GPUs},
#  waiting {job: (state, claim or None, kept, text the reason contains)})
CASES = [
    ("everything fits: jobs start in queue order, not list order",
     {}, {}, {}, [_entry("b", 8, at=2), _entry("a", 8, at=1), _entry("c", 4, at=3)],
     {"a": "hgx-a1 GPU 0-7", "b": "hgx-a2 GPU 0-7", "c": "rtx-1 GPU 0-3"}, {}),
    ("on the host chosen the claim waits on as few jobs as it can: 2-3 (e1 holds 2) rather than 0-1 (viz)",
     {"viz": "rtx-1:0-1", "e1": "rtx-1:2", **HELD_A1_7}, {}, {}, [_entry("ft-2", 2, "RTX 4090", at=1)],
     {}, {"ft-2": ("head", "rtx-1 GPU 2-3", False, "1 of them held by e1")}),
    ("a gang that cannot start claims the host where the fewest GPUs are held",
     HELD_A1_7, {}, {}, [_entry("big", 8, at=1)],
     {}, {"big": ("head", "hgx-a1 GPU 0-7", False,
                  f"head of the queue: claims hgx-a1 GPU 0-7 (pool {POOL_A}), 7 of them held by j1×7")}),
    ("jobs behind the head start outside its claim (the RTX pool), never on its free GPU",
     HELD_A1_7, {}, {}, [_entry("big", 8, at=1), _entry("small", 1, at=2), _entry("r2", 2, "RTX 4090", at=3)],
     {"small": "rtx-1 GPU 0", "r2": "rtx-1 GPU 2-3"}, {"big": ("head", "hgx-a1 GPU 0-7", False, "head of the queue")}),
    ("backfill never delays the head: with nothing else free the claim's free GPU stays idle",
     {**HELD_A1_7, "j3": "rtx-1:0-3"}, {}, {}, [_entry("big", 8, at=1), _entry("small", 1, "A100-SXM4-80GB", at=2)],
     {}, {"big": ("head", "hgx-a1 GPU 0-7", False, "head of the queue"),
          "small": ("waiting", None, False,
                    f"2nd in the queue, 2nd for pool {POOL_A}, behind big (head for pool {POOL_A}, claims hgx-a1 "
                    f"GPU 0-7, 7 of them held); now: needs 1 free GPU in one pool, has at most 0 outside "
                    f"reservations and claims")}),
    ("a job for RTX GPUs is not held up by the A100 claim: it heads its own pool",
     {**HELD_A1_7, "j3": "rtx-1:0"}, {}, {}, [_entry("big", 8, at=1), _entry("r4", 4, "RTX 4090", at=2)],
     {}, {"big": ("head", "hgx-a1 GPU 0-7", False, "head of the queue"),
          "r4": ("head", "rtx-1 GPU 0-3", False,
                 f"2nd in the queue, first for its pool: claims rtx-1 GPU 0-3 (pool {POOL_R}), 1 of them held by j3")}),
    ("one head per pool: a second gang for the same pool waits behind the first, without a claim",
     HELD_A1_7, {}, {}, [_entry("big", 8, "A100-SXM4-80GB", at=1), _entry("big2", 8, "A100-SXM4-80GB", at=2)],
     {}, {"big": ("head", "hgx-a1 GPU 0-7", False, "head of the queue"),
          "big2": ("waiting", None, False, f"2nd in the queue, 2nd for pool {POOL_A}, behind big")}),
    ("a job ahead of the head is not bound by its claim; the head keeps it, now all held",
     HELD_A1_7, {}, {}, [_entry("big", 8, at=1, claim="hgx-a1:0-7"), _entry("vip", 1, "A100-SXM4-80GB", 5, at=10)],
     {"vip": "hgx-a1 GPU 7"},
     {"big": ("head", "hgx-a1 GPU 0-7", True, "8 of them held by j1×7, vip")}),
    ("claims are stable: kept on hgx-a2 although hgx-a1 has as many GPUs held",
     {"j1": "hgx-a1:0-5", "j2": "hgx-a2:0-5"}, {}, {}, [_entry("big", 8, at=1, claim="hgx-a2:0-7")],
     {}, {"big": ("head", "hgx-a2 GPU 0-7", True, "6 of them held by j2×6")}),
    ("a claim moves where strictly fewer GPUs are still held",
     {"j1": "hgx-a1:0-2", "j2": "hgx-a2:0-5"}, {}, {}, [_entry("big", 8, at=1, claim="hgx-a2:0-7")],
     {}, {"big": ("head", "hgx-a1 GPU 0-7", False, "3 of them held by j1×3")}),
    ("a job without a claim spans hosts when no host can hold it (SPEC 7.1): 5 + 3 free",
     {"j1": "hgx-a1:0-2", "j2": "hgx-a2:0-4"}, {}, {}, [_entry("big", 8, "A100-SXM4-80GB", at=1)],
     {"big": "hgx-a1 GPU 3-7, hgx-a2 GPU 5-7"}, {}),
    ("a head whose claim is on one host waits for one host rather than spanning the same 5 + 3",
     {"j1": "hgx-a1:0-2", "j2": "hgx-a2:0-4"}, {}, {}, [_entry("big", 8, "A100-SXM4-80GB", at=1, claim="hgx-a1:0-7")],
     {}, {"big": ("head", "hgx-a1 GPU 0-7", True, "3 of them held by j1×3")}),
    ("an evicted GPU ends a claim: hgx-a2 can no longer hold 8, the claim goes to hgx-a1",
     {"j1": "hgx-a1:0-6", "j2": "hgx-a2:0-5"}, {GpuKey("hgx-a2", 7): ["xid-79"]}, {},
     [_entry("big", 8, at=1, claim="hgx-a2:0-7")],
     {}, {"big": ("head", "hgx-a1 GPU 0-7", False, "7 of them held by j1×7")}),
    ("a GPU loaded by the job that holds it still counts for the target (idle once released)",
     HELD_A1_7, {}, {**{f"hgx-a1:{i}": 1.0 for i in range(7)}, **{f"hgx-a2:{i}": 1.0 for i in range(8)}},
     [_entry("big", 8, at=1)],
     {}, {"big": ("head", "hgx-a1 GPU 0-7", False, "7 of them held by j1×7")}),
    ("a GPU loaded from outside the ledger is never claimed",
     {"j1": "hgx-a1:0-5", "j2": "hgx-a2:0-7"}, {}, {"hgx-a1:7": 0.5}, [_entry("big", 8, at=1)],
     {}, {"big": ("head", "hgx-a2 GPU 0-7", False, "8 of them held by j2×8")}),
    ("impossible: a card type no host has; reported, claims nothing, blocks nobody",
     HELD_A1_7, {}, {}, [_entry("h100", 1, "H100", at=1), _entry("small", 1, at=2)],
     {"small": "hgx-a1 GPU 7"},
     {"h100": ("impossible", None, False,
               f"can never start on this cluster as it is (a mistake in the request, or hosts lost): {POOL_A}: "
               f"card type '{A100}' is not the requested 'H100'")}),
    ("impossible: more GPUs than any pool has healthy",
     {}, {}, {}, [_entry("huge", 17, at=1), _entry("small", 1, at=2)],
     {"small": "rtx-1 GPU 0"},  # free blocks: a PCIe box's GPU before an idle NVSwitch block
     {"huge": ("impossible", None, False, f"{POOL_A}: needs 17 GPUs, has 16 healthy of 16")}),
]


@pytest.mark.parametrize("case,reserved,evicted,loads,queue,admitted,waiting", CASES, ids=[c[0] for c in CASES])
def test_admission_pass(case, reserved, evicted, loads, queue, admitted, waiting):
    result = admit(_cluster(loads), queue, now=100.0, reserved=_reserved(reserved), evicted=evicted)
    assert {a.job_id: describe_gpus(a.gpus) for a in result.admitted} == admitted
    got = {w.job_id: w for w in result.waiting}
    assert set(got) == set(waiting)
    for job, (state, claim, kept, text) in waiting.items():
        w = got[job]
        assert w.state == state, job
        assert (describe_gpus(w.claim.gpus) if w.claim else None) == claim, job
        assert (w.claim.kept if w.claim else False) == kept, job
        assert text in w.reason, (job, w.reason)
    json.dumps(result.to_json())  # plain data for a database column


def test_admitted_jobs_carry_the_planners_decision_and_their_place():
    result = admit(_cluster(), [_entry("b", 8, at=2), _entry("a", 8, at=1)], now=5.0)
    assert [(a.job_id, a.position, a.pool) for a in result.admitted] == [("a", 1, POOL_A), ("b", 2, POOL_A)]
    assert result.admitted[0].decision.pool == POOL_A
    assert [g.key for g in result.admitted[0].decision.gpus] == list(result.admitted[0].gpus)
    assert result.order == ("a", "b")


def test_a_claim_binds_only_the_jobs_behind_it_in_the_same_pass():
    """The pass walks in order: the claim's GPUs are taken before the head is reached by a job
    ahead of it, never after."""
    cluster = _cluster()
    reserved = _reserved(HELD_A1_7)
    queue = [_entry("big", 8, at=1), _entry("s1", 1, "A100-SXM4-80GB", at=2)]
    first = admit(cluster, queue, now=3.0, reserved=reserved)
    assert first.admitted == [] and first.claims["big"].free == (GpuKey("hgx-a1", 7),)
    # a higher-priority job arrives: it is ahead of big, so it may take hgx-a1 GPU 7
    queue = [_entry("big", 8, at=1, claim="hgx-a1:0-7"), _entry("s1", 1, "A100-SXM4-80GB", at=2),
             _entry("vip", 1, "A100-SXM4-80GB", priority=2, at=4)]
    second = admit(cluster, queue, now=5.0, reserved=reserved)
    assert [(a.job_id, describe_gpus(a.gpus)) for a in second.admitted] == [("vip", "hgx-a1 GPU 7")]
    assert second.get("s1").state == "waiting" and second.get("s1").behind == ("big",)


def test_explain_off_lists_only_heads_and_stops_early():
    queue = [_entry("big", 8, at=1)] + [_entry(f"s{i}", 1, "A100-SXM4-80GB", at=2 + i) for i in range(50)]
    adm = Admission(_cluster())
    full = adm.run(queue, now=100.0, reserved=_reserved(HELD_A1_7))
    quick = adm.run(queue, now=100.0, reserved=_reserved(HELD_A1_7), explain=False)
    assert [w.job_id for w in quick.waiting] == ["big"] and quick.waiting[0].reason == ""
    assert len(full.waiting) == 51 and full.waiting[-1].reason.startswith("51st in the queue, 51st for pool")
    assert quick.claims["big"].gpus == full.claims["big"].gpus


def test_bad_queue_input_is_a_one_line_error():
    with pytest.raises(RequestError, match="queued twice"):
        admit(_cluster(), [_entry("a", 1), _entry("a", 2)], now=0.0)
    with pytest.raises(RequestError, match="priority: expected an integer"):
        QueueEntry("a", PlanRequest(1), priority=1.5)
    with pytest.raises(RequestError, match="enqueued_at"):
        QueueEntry("a", PlanRequest(1), enqueued_at=float("nan"))
    with pytest.raises(RequestError, match="job_id"):
        QueueEntry("", PlanRequest(1))
    with pytest.raises(RequestError, match="aging_interval_s"):
        Admission(_cluster(), aging_interval_s=0)


def test_queue_entry_json_round_trip():
    e = _entry("j", 2, ("A100", "H100"), priority=3, at=12.5, claim="hgx-a1:0-1")
    assert QueueEntry.from_json(json.loads(json.dumps(e.to_json()))) == e


# --- priority and aging (docs/queue.md) ---------------------------------------------------------
# Both jobs want all 16 A100 GPUs, so only the first in the queue starts. low: priority 0,
# enqueued at 0; high: priority q, enqueued at t. With aging interval A, high is ahead exactly
# when t - q·A < 0, i.e. when it was enqueued less than q·A after low.
PRIORITY_CASES = [
    # (case, q, t, aging, first)
    ("higher priority first although the lower one waited longer", 1, 100.0, 3600.0, "high"),
    ("still first 1 s inside the window (q·A = 3600 s)", 1, 3599.0, 3600.0, "high"),
    ("at the bound the lower one, enqueued first, goes first", 1, 3600.0, 3600.0, "low"),
    ("past the bound aging lets the lower one through", 1, 3601.0, 3600.0, "low"),
    ("priority 3: window of 3·A", 3, 10799.0, 3600.0, "high"),
    ("priority 3, past 3·A", 3, 10801.0, 3600.0, "low"),
    ("a short aging interval: 60 s a level", 1, 61.0, 60.0, "low"),
    ("aging off: strict priority however long the lower one waited", 1, 1e9, None, "high"),
]


@pytest.mark.parametrize("case,q,t,aging,first", PRIORITY_CASES, ids=[c[0] for c in PRIORITY_CASES])
def test_priority_and_aging(case, q, t, aging, first):
    queue = [_entry("low", 16, at=0.0), _entry("high", 16, priority=q, at=t)]
    result = admit(_cluster(), queue, now=t + 1.0, aging_interval_s=aging)
    assert [a.job_id for a in result.admitted] == [first]
    (w,) = result.waiting
    assert w.state == "head" and w.position == 1
    assert passing_window_s(0, q, aging) == (q * aging if aging else float("inf"))


def test_aging_bound_on_a_stream_of_higher_priority_jobs():
    """low (priority 0) enqueued at 0; a priority-1 job every 600 s. With A = 3600 s, only those
    enqueued less than 3600 s after low are ahead of it, however long the stream goes on."""
    low = _entry("low", 1, at=0.0)
    stream = [_entry(f"h{t}", 1, priority=1, at=float(t)) for t in range(600, 12001, 600)]
    for now in (3000.0, 12000.0, 1e6):
        order = [e.job_id for e in ordered([low, *stream], 3600.0)]
        assert order[:6] == ["h600", "h1200", "h1800", "h2400", "h3000", "low"]
    effs = {e.job_id: effective_priority(e, 12000.0, 3600.0) for e in [low, *stream]}
    assert effs["low"] == pytest.approx(12000 / 3600)
    assert effs["h3600"] == pytest.approx(1 + 8400 / 3600) and effs["h3600"] == pytest.approx(effs["low"])
    assert rank_key(low, 3600.0) < rank_key(stream[5], 3600.0)  # h3600 ties low: low was enqueued first


@pytest.mark.parametrize("keys,text", [
    ([("a", 0), ("a", 1), ("a", 2)], "a GPU 0-2"),
    ([("b", 3), ("a", 0), ("a", 2), ("a", 3)], "a GPU 0,2-3, b GPU 3"),
    ([("h", 5)], "h GPU 5"),
])
def test_describe_gpus(keys, text):
    assert describe_gpus(keys) == text


@pytest.mark.parametrize("n,text", [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"),
                                    (13, "13th"), (21, "21st"), (102, "102nd"), (111, "111th")])
def test_ordinal(n, text):
    assert ordinal(n) == text


def test_wait_notes_repeat_the_warning_while_the_pools_lack_healthy_gpus():
    from airflow_hetero_gpu.core.admission.reasons import WaitNotes

    notes = WaitNotes(every=3)
    said = [notes.note("impossible", "can never start: A: needs 4 GPUs, has 3 healthy of 4") for _ in range(7)]
    levels = [n and n[0] for n in said]
    assert levels == ["warning", None, None, "warning", None, None, "warning"]
    assert said[0][1].startswith("waits until hosts or GPUs come back (its pools lack that many healthy GPUs): ")
    # an ordinary wait is said once per change, at info
    assert notes.note("waiting", "2nd in the queue") == ("info", "2nd in the queue")
    assert notes.note("waiting", "2nd in the queue") is None
    assert notes.note("impossible", "x")[0] == "warning"


def test_what_a_pass_keeps_on_the_cluster_is_not_shared_with_a_copy_or_other_evictions():
    """Admission keeps the primary filters and loads of a cluster for the next pass over it; a
    shallow copy with other loads (the planner's released cluster) and other evictions or drains
    get their own."""
    import copy

    cluster = _cluster()
    adm = Admission(cluster)
    assert Admission(cluster).loaded is adm.loaded  # kept for the next pass
    busy = copy.copy(cluster)
    busy.base_load = cluster.base_load.copy()
    busy.base_load[:] = 100.0
    assert Admission(busy).loaded.all() and not adm.loaded.any()
    key = GpuKey("hgx-a1", 0)
    evicted = Admission(cluster, evicted={key: ["xid 79"]})
    assert not evicted.healthy[cluster.position[key]] and adm.healthy[cluster.position[key]]
    drained = Admission(cluster, drained={"hgx-a2": "maintenance"})
    assert drained.on_drained.sum() == 8 and not adm.on_drained.any()
