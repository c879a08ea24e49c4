"""The simulator's decisions on every trace of tests/ and benchmarks/, job by job, to compare two
versions of the admission pass.

Each scenario replays one trace through ``hetero-gpu simulate``'s engine (admission queue, policy
``seed``, ``--comm-cost 0``, time scale 1) and records, per job, its start and end, the GPUs it
started on (host and index) and how often it was preempted, and every preemption (time, victim,
preemptor). The scenarios: the queue stream (tests/data/queue), the three team traces of
tests/data/teams with and without the teams file, with preemption on and off, and the traces of
tests/test_sim_preemption.py and tests/test_sim_engine.py written out here.

    python benchmarks/sim_decisions.py --out decisions.json       # this checkout's decisions
    python benchmarks/sim_decisions.py --baseline main             # and main's, then the differences

With ``--baseline REV`` the same script runs against the package at REV (benchmarks/baseline.py)
and every difference is printed, scenario by scenario; the exit status is 1 when any.
``--against FILE`` compares with a file written earlier by ``--out`` instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"

V100 = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"h{i},1,1,8,V100M32\n" for i in range(4))
PRE = "job_id,arrival_s,duration_s,gpus,priority,preemptible,checkpoint_s\n"
FULL = PRE + "".join(f"lo{i},0,7200,8,1,1,300\n" for i in range(4)) + "hi,600,600,8,5,1,0\n"
NOT_PRE = PRE + "".join(f"lo{i},0,7200,8,1,{0 if i else 1},300\n" for i in range(4)) + "hi,600,600,8,5,1,0\n"
STORM = (PRE + "".join(f"lo{i},{i},7200,8,0,1,600\n" for i in range(4))
         + "".join(f"hi{n:02d},{600 + 240 * n},300,8,5,1,0\n" for n in range(30)))
LEND_TEAMS = "teams:\n  prod: {quota: {\"*\": 16}}\n  intern: {quota: {\"*\": 16}}\n"
LEND = ("job_id,arrival_s,duration_s,gpus,team,priority,preemptible,checkpoint_s\n"
        + "".join(f"intern{i},0,7200,8,intern,5,0,300\n" for i in range(4)) + "prod0,900,600,8,prod,0,1,0\n")
# research (quota 8 of 16) runs r-a (8) and r-b (4, borrowing prod's idle quota); r-a ends;
# prod then wants its quota back while r-b runs (docs/teams.md, "Borrowed")
RP_NODES = "sn,cpu_milli,memory_mib,gpu,model\nh0,1,1,8,A100\nh1,1,1,8,A100\n"
RP_TEAMS = "teams:\n  research: {quota: {\"*\": 8}}\n  prod: {quota: {\"*\": 8}}\n"
RP = ("job_id,arrival_s,duration_s,gpus,team,priority,preemptible,checkpoint_s\n"
      "r-a,0,600,8,research,0,1,0\nr-b,1,7200,4,research,0,1,0\n"
      "p-a,1800,600,8,prod,0,1,0\np-b,1900,600,4,prod,0,1,0\n")


def scenarios(tmp: Path) -> list[tuple]:
    """(name, trace, nodes, teams file or None, preemption on)."""
    for name, text in (("v100.csv", V100), ("full.csv", FULL), ("notpre.csv", NOT_PRE), ("storm.csv", STORM),
                       ("lend-teams.yaml", LEND_TEAMS), ("lend.csv", LEND), ("rp-nodes.csv", RP_NODES),
                       ("rp-teams.yaml", RP_TEAMS), ("rp.csv", RP)):
        (tmp / name).write_text(text)
    teams = DATA / "teams"
    out = [("queue-stream", DATA / "queue" / "stream.csv", DATA / "queue" / "nodes.csv", None, False)]
    for trace in ("skewed-1h", "skewed", "lending"):
        for with_teams in (False, True):
            for pre in (False, True):
                out.append((f"{trace}{'-teams' if with_teams else ''}{'-preempt' if pre else ''}",
                            teams / f"{trace}.csv", teams / "nodes.csv",
                            teams / "teams.yaml" if with_teams else None, pre))
    out += [("preempt-full", tmp / "full.csv", tmp / "v100.csv", None, True),
            ("preempt-full-off", tmp / "full.csv", tmp / "v100.csv", None, False),
            ("preempt-not-preemptible", tmp / "notpre.csv", tmp / "v100.csv", None, True),
            ("preempt-storm", tmp / "storm.csv", tmp / "v100.csv", None, True),
            ("preempt-lend", tmp / "lend.csv", tmp / "v100.csv", tmp / "lend-teams.yaml", True),
            ("preempt-lend-off", tmp / "lend.csv", tmp / "v100.csv", tmp / "lend-teams.yaml", False),
            ("research-prod", tmp / "rp.csv", tmp / "rp-nodes.csv", tmp / "rp-teams.yaml", True),
            ("research-prod-off", tmp / "rp.csv", tmp / "rp-nodes.csv", tmp / "rp-teams.yaml", False)]
    return out


def decisions() -> dict:
    from airflow_hetero_gpu.core.admission.quota import teams_from_text
    from airflow_hetero_gpu.sim.engine import simulate
    from airflow_hetero_gpu.sim.fleet import build_fleet, read_nodes
    from airflow_hetero_gpu.sim.policies import make_policy
    from airflow_hetero_gpu.sim.preempt import SimPreemption
    from airflow_hetero_gpu.sim.trace import read_jobs_csv

    out = {}
    with tempfile.TemporaryDirectory(prefix="sim-decisions-") as tmp:
        for name, trace, nodes, teams_file, pre in scenarios(Path(tmp)):
            cluster = build_fleet(read_nodes(nodes)).cluster
            teams = teams_from_text(teams_file.read_text(), str(teams_file)) if teams_file else None
            jobs = read_jobs_csv(trace).jobs
            result = simulate(cluster, jobs, make_policy("seed"), comm_cost=0.0, teams=teams,
                              preemption=SimPreemption() if pre else None)
            out[name] = {
                "jobs": {r.id: [round(r.start, 6), round(r.end, 6), [f"{k[0]}:{k[1]}" for k in sorted(r.keys)],
                                r.preemptions] for r in result.records},
                "preemptions": [[round(t, 6), job, detail] for t, ev, job, _, detail in result.events
                                if ev == "preempt"],
            }
    return out


def differences(old: dict, new: dict) -> list[str]:
    lines = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a is None or b is None:
            lines.append(f"{name}: only in {'the new' if a is None else 'the baseline'}")
            continue
        for job in sorted(set(a["jobs"]) | set(b["jobs"])):
            if a["jobs"].get(job) != b["jobs"].get(job):
                lines.append(f"{name}: {job}: baseline {a['jobs'].get(job)} now {b['jobs'].get(job)}")
        if a["preemptions"] != b["preemptions"]:
            lines.append(f"{name}: preemptions: baseline {a['preemptions']} now {b['preemptions']}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the decisions as JSON here")
    ap.add_argument("--baseline", metavar="REV", help="also run the package at this git revision and compare")
    ap.add_argument("--against", metavar="FILE", help="compare with decisions written earlier by --out")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # baseline runs
    args = ap.parse_args()
    new = decisions()
    if args.json:
        json.dump(new, sys.stdout)
        return
    if args.out:
        Path(args.out).write_text(json.dumps(new, indent=1, sort_keys=True))
    total = sum(len(s["jobs"]) for s in new.values())
    print(f"{len(new)} scenarios, {total} jobs, {sum(len(s['preemptions']) for s in new.values())} preemptions")
    if args.baseline or args.against:
        sys.path.insert(0, str(Path(__file__).parent))
        from baseline import revision, run

        if args.against:
            old, label = json.loads(Path(args.against).read_text()), args.against
        else:
            old, label = run(args.baseline, str(Path(__file__).resolve()), []), revision(args.baseline)
        diff = differences(old, new)
        print(f"against {label}: {len(diff)} differences")
        for line in diff:
            print("  " + line)
        raise SystemExit(1 if diff else 0)


if __name__ == "__main__":
    main()
