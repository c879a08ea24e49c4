"""Latency of one admission pass: 100 waiting jobs on a 10,000-GPU cluster, against one plan().

The cluster is ``plan_latency.py``'s synthetic one (hosts of 8 with real wirings, four card types,
task-type rules, ~40 % of the GPUs loaded from outside the ledger, ~1 % unhealthy, racks under
leaves under spines). Live reservations then hold 98 % of the remaining usable GPUs, in jobs of
1, 2, 4 or 8 GPUs on one host. The queue: 100 jobs of 1 (40 %), 2, 4, 8 (15 % each) and 16 GPUs
(15 %), a third of them for one card type, priorities 0-2, enqueued over the last hour.

Three timings, median and p95 of ``--repeat`` runs each (after one warm-up):

* ``plan``: one ``plan()`` call for an 8-GPU job with the same reservations, as the operator
  calls it (a ``{GPU: job}`` mapping; the baseline), and with them as a mask (the fast path the
  admission pass uses for its placer calls);
* ``first pass``: ``Admission(...)`` built and run on the queue with no claims yet, the
  planner's pool reports that earlier passes kept on the cluster dropped before each run;
* ``steady pass``: the next write: the jobs the first pass admitted now hold their GPUs, the
  others wait with the claims it made (kept, so the heads are not planned again);
* ``first, teams`` / ``steady, teams``: the same with three teams' quotas and preemption on
  (every running job a candidate); the steady one once the passes have settled;
* ``first, preemption`` / ``steady, preemption``: preemption on without teams (the default of a
  deployment with no teams file).

With ``--baseline REV`` every row is timed for the package at REV too (in a subprocess), and the
run says whether both made the same admissions and preemptions.

    python benchmarks/admission_latency.py [--gpus 10000] [--jobs 100] [--repeat 20] [--baseline REV]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from plan_latency import KINDS, p95, synthetic_cluster  # noqa: E402

from airflow_hetero_gpu.core.admission import Admission, QueueEntry  # noqa: E402
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest  # noqa: E402
from airflow_hetero_gpu.core.planner import cluster_state, plan  # noqa: E402


def timed(fn, repeat: int, setup=None) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of ``repeat`` calls after one warm-up (CPU time says what a call costs
    when the machine is shared; wall time what a caller waits); ``setup`` runs, untimed, before
    each call."""
    fn()
    wall, cpu = [], []
    gc.disable()
    try:
        for _ in range(repeat):
            if setup is not None:
                setup()
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    finally:
        gc.enable()
    return wall, cpu


def cold(cluster):
    """A setup for a first pass: the planner's pool reports kept on the cluster by the passes
    before (``core/plankept.py``) are dropped, so it plans every pool as a pass over a new queue
    would. The admission's other per-cluster state (each request's primary filters, the loads)
    stays, as it does in the ledger between passes."""
    def forget():
        _, kept = cluster.__dict__.get("_admission_static", (None, {}))
        for static in kept.values():
            for part in static:
                if hasattr(part, "forget"):
                    part.forget()
    return forget


def reservations(cluster, share: float, seed: int = 11) -> dict[GpuKey, str]:
    """Running jobs of 1, 2, 4 or 8 GPUs, each on one host, holding ``share`` of the usable GPUs."""
    rng = random.Random(seed)
    state = cluster_state(cluster, PlanRequest(1))
    free: dict[str, list[int]] = {}
    for p in np.flatnonzero(state.available).tolist():
        g = cluster.gpus[p]
        free.setdefault(g.host, []).append(g.index)
    target = int(share * int(state.available.sum()))
    held: dict[GpuKey, str] = {}
    hosts = sorted(free)
    n = 0
    while len(held) < target:
        host = rng.choice(hosts)
        k = min(rng.choice((1, 1, 2, 4, 8)), len(free[host]))
        if k == 0:
            continue
        for i in free[host][:k]:
            held[GpuKey(host, i)] = f"run-{n}"
        free[host] = free[host][k:]
        n += 1
    return held


def queue(n: int, seed: int = 5) -> list[QueueEntry]:
    rng = random.Random(seed)
    types = [None, None, KINDS[0][0], KINDS[1][0], KINDS[3][0]]
    out = []
    for i in range(n):
        k = rng.choices((1, 2, 4, 8, 16), weights=(40, 15, 15, 15, 15))[0]
        out.append(QueueEntry(f"wait-{i}", PlanRequest(k, rng.choice(types)), rng.choice((0, 0, 1, 2)),
                              rng.uniform(0, 3600)))
    return out


TEAMS = {"research": {"quota": {"*": 4000}, "weight": 2}, "prod": {"quota": {"*": 2000}},
         "intern": {"quota": {"*": 1000}, "borrowing_limit": {"*": 1000}}}


def shared_fleet(cluster, held, entries, now: float, with_teams: bool = True):
    """The same passes on a shared fleet: three teams with quotas (every job a team's; with
    ``with_teams`` False none, as a deployment without a teams file), and preemption on with every
    running job a candidate (priority 0, running for an hour). None where the package has neither
    (a baseline revision)."""
    try:
        from airflow_hetero_gpu.core.admission import PreemptionRules, QuotaInput, RunningJob, teams_from_mapping
    except ImportError:
        return None
    names = sorted(TEAMS)
    teams = teams_from_mapping({"teams": TEAMS})

    def team(job: str) -> str:
        return names[sum(map(ord, job)) % len(names)]

    def running_of(reserved, borrowed=frozenset(), preempting=None, started=frozenset()):
        by_job: dict[str, list] = {}
        for key, job in reserved.items():
            by_job.setdefault(job, []).append(key)
        stopping = preempting or {}
        return [RunningJob(job, tuple(keys), 0, now if job in started else now - 3600,
                           None if job in started else now - 600, team(job) if with_teams else None,
                           borrowed=job in borrowed,
                           preempting=stopping.get(job)) for job, keys in by_job.items()]

    rules = PreemptionRules()
    teamed = {id(e): dataclasses.replace(e, team=team(e.job_id) if with_teams else None) for e in entries}

    team_of = {job: team(job) for job in {*held.values(), *(e.job_id for e in entries)}}
    # the ledger reads them with the reservations: outside the timing
    quotas = QuotaInput(teams, team_of) if with_teams else None

    def run(queue, reserved, running=None):
        return Admission(cluster).run([teamed.get(id(e), e) for e in queue], now=now, reserved=reserved,
                                      quotas=quotas, running=running if running is not None else running_of(reserved),
                                      preemption=rules)

    def steady():
        """The queue once the passes settle, as the ledger sees it at the next write: passes run
        until one decides nothing new (at most five); after each, the jobs it admitted hold their
        GPUs (just started; those on borrowed quota marked so), the others wait with the claims it
        made, and the victims of its preemptions are stopping for their preemptors."""
        queue = [teamed[id(e)] for e in entries]
        reserved, running = dict(held), running_of(held)
        borrowed: set[str] = set()
        preempting: dict[str, str] = {}
        started: set[str] = set()
        for _ in range(5):
            result = run(queue, reserved, running)
            if not result.admitted and not result.preemptions:
                break
            reserved |= {k: a.job_id for a in result.admitted for k in a.gpus}
            borrowed |= {a.job_id for a in result.admitted if getattr(a, "borrowed", 0)}
            preempting |= {v: pre.preemptor for pre in result.preemptions for v in pre.victims}
            started |= {a.job_id for a in result.admitted}
            claimed = {j: c.gpus for j, c in result.claims.items()}
            queue = [dataclasses.replace(e, claim=claimed.get(e.job_id, ())) for e in queue if e.job_id not in started]
            running = running_of(reserved, borrowed, preempting, started)
        return queue, reserved, running

    return run, steady, running_of


def measure(gpus: int, jobs: int, repeat: int) -> dict:
    cluster = synthetic_cluster(gpus)
    held = reservations(cluster, 0.98)
    entries = queue(jobs)
    now = 3600.0

    calls = {"n": 0}

    def counted(adm: Admission) -> Admission:
        inner = adm.placer

        def placer(*a, **kw):
            calls["n"] += 1
            return inner(*a, **kw)

        adm.placer = placer
        return adm

    first = Admission(cluster).run(entries, now=now, reserved=held)
    # the next write: the admitted jobs run, the others wait with the claims the first pass made
    held2 = {**held, **{k: a.job_id for a in first.admitted for k in a.gpus}}
    claimed = {j: c.gpus for j, c in first.claims.items()}
    started = {a.job_id for a in first.admitted}
    steady_queue = [dataclasses.replace(e, claim=claimed.get(e.job_id, ())) for e in entries if e.job_id not in started]
    steady = Admission(cluster).run(steady_queue, now=now, reserved=held2)
    calls["n"] = 0
    counted(Admission(cluster)).run(entries, now=now, reserved=held)
    first_calls = calls["n"]
    calls["n"] = 0
    counted(Admission(cluster)).run(steady_queue, now=now, reserved=held2)
    steady_calls = calls["n"]

    req = PlanRequest(8)
    mask = np.zeros(len(cluster.gpus), dtype=bool)
    mask[[cluster.position[k] for k in held]] = True
    t_plan = timed(lambda: plan(cluster, req, reserved=held), repeat)
    t_mask = timed(lambda: plan(cluster, req, reserved=held, reserved_mask=mask), repeat)
    t_first = timed(lambda: Admission(cluster).run(entries, now=now, reserved=held), repeat, cold(cluster))
    t_steady = timed(lambda: Admission(cluster).run(steady_queue, now=now, reserved=held2), repeat)
    states = {s: sum(1 for w in steady.waiting if w.state == s) for s in ("head", "waiting", "impossible")}
    summary = (f"{len(cluster.gpus)} GPUs in {len(cluster.pools)} pools, {len(held)} held by running jobs; "
               f"{len(entries)} waiting: the first pass admits {len(first.admitted)}; the steady pass admits "
               f"{len(steady.admitted)}, {states['head']} heads, {states['waiting']} waiting, "
               f"{states['impossible']} impossible, {sum(1 for w in steady.waiting if w.claim and w.claim.kept)} "
               f"claims kept")
    timings = [("plan (k=8)", t_plan, 1), ("plan, mask", t_mask, 1), ("first pass", t_first, first_calls),
               ("steady pass", t_steady, steady_calls)]
    decisions = None
    for label, with_teams in (("preemption", False), ("teams", True)):
        shared = shared_fleet(cluster, held, entries, now, with_teams)
        if shared is None:  # the code has neither team quotas nor preemption
            break
        run_shared, steady_shared, running_shared = shared
        state = steady_shared()
        first_running = running_shared(held)  # the ledger builds it from its rows: outside the timing
        timings += [(f"first, {label}", timed(lambda: run_shared(entries, held, first_running), repeat,
                                             cold(cluster)), None),
                    (f"steady, {label}", timed(lambda: run_shared(*state), repeat), None)]

        def decided(result):
            return {"admitted": sorted([a.job_id, [list(k) for k in a.gpus]] for a in result.admitted),
                    "preempted": sorted([p.preemptor, list(p.victims)] for p in result.preemptions)}
        # what the passes decide, to compare with the baseline's
        decisions = (decisions or {}) | {f"first, {label}": decided(run_shared(entries, held, first_running)),
                                         f"steady, {label}": decided(run_shared(*state))}
    rows = {}
    for name, (w, c), n in timings:
        rows[name] = {"wall_p50": statistics.median(w), "wall_p95": p95(w), "cpu_p50": statistics.median(c),
                      "cpu_p95": p95(c), "calls": n}
    admitted = sorted([a.job_id, [list(k) for k in a.gpus]] for a in first.admitted)  # as JSON gives it back
    return {"summary": summary, "rows": rows, "admitted": admitted, "teams": decisions}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--baseline", metavar="REV", help="also time the package at this git revision (same run)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # baseline runs
    args = ap.parse_args()
    if args.json:
        print(json.dumps(measure(args.gpus, args.jobs, args.repeat)))
        return
    base = None
    if args.baseline:
        import baseline
        base = baseline.run(args.baseline, __file__, ["--gpus", str(args.gpus), "--jobs", str(args.jobs),
                                                      "--repeat", str(args.repeat)])
    out = measure(args.gpus, args.jobs, args.repeat)
    print(f"python {platform.python_version()} on {platform.machine()}, repeat {args.repeat}, times in ms")
    print(out["summary"])
    rows = out["rows"]
    mp, mc = rows["plan (k=8)"]["wall_p50"], rows["plan (k=8)"]["cpu_p50"]
    extra = f" {'base CPU':>9} {'x base':>7}" if base else ""
    print(f"{'':>14} {'wall p50':>9} {'wall p95':>9} {'x plan':>7} {'CPU p50':>8} {'CPU p95':>8} {'x plan':>7}{extra} "
          f"{'placer calls':>13}")
    for name, r in rows.items():
        cols = ""
        if base:
            b = base["rows"].get(name)
            cols = f" {b['cpu_p50'] * 1e3:>9.2f} {r['cpu_p50'] / b['cpu_p50']:>7.2f}" if b else f" {'-':>9} {'-':>7}"
        calls = "" if r["calls"] is None else r["calls"]
        print(f"{name:>14} {r['wall_p50'] * 1e3:>9.2f} {r['wall_p95'] * 1e3:>9.2f} {r['wall_p50'] / mp:>7.1f} "
              f"{r['cpu_p50'] * 1e3:>8.2f} {r['cpu_p95'] * 1e3:>8.2f} {r['cpu_p50'] / mc:>7.1f}{cols} {calls:>13}")
    if base:
        same = "the same jobs on the same GPUs" if base["admitted"] == out["admitted"] else "OTHER jobs or GPUs"
        print(f"base: the package at {baseline.revision(args.baseline)}, timed in a subprocess of this run; "
              f"its first pass admitted {same}")
        if out["teams"] is not None and base.get("teams") is not None:
            same = "the same" if base["teams"] == out["teams"] else "OTHER"
            print(f"with preemption, and with teams, its first and steady passes made {same} admissions and "
                  f"preemptions")


if __name__ == "__main__":
    main()
