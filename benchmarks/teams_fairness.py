"""The fairness table of docs/simulation.md: three teams on a saturated 32-GPU cluster.

Replays tests/data/teams/skewed.csv (rates 1:1:4, research, prod, intern) with and without the
quotas of tests/data/teams/teams.yaml (16/8/8), and tests/data/teams/lending.csv (prod idle for
the first hour), through the simulator's admission queue (the product's admission function, as
``hetero-gpu simulate --teams`` runs it), and prints per team its share of the GPU-seconds in the
saturated window (first 1 % of arrivals to the last arrival) against its quota's share, and the
utilisation; for the lending run, the utilisation while prod is idle, prod's first job's wait and
the longest job that was running on borrowed quota when it arrived.

    python benchmarks/teams_fairness.py [--data tests/data/teams]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from airflow_hetero_gpu.core.admission.quota import teams_from_text
from airflow_hetero_gpu.sim.engine import simulate
from airflow_hetero_gpu.sim.fleet import build_fleet, read_nodes
from airflow_hetero_gpu.sim.metrics import by_team, summarize
from airflow_hetero_gpu.sim.policies import make_policy
from airflow_hetero_gpu.sim.trace import read_jobs_csv


def utilisation(result, since: float, until: float) -> float:
    held = sum(r.gpus * max(0.0, min(r.end, until) - max(r.start, since)) for r in result.records)
    return held / (result.total_gpus * (until - since))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="tests/data/teams")
    args = ap.parse_args()
    data = Path(args.data)
    fleet = build_fleet(read_nodes(data / "nodes.csv"))
    teams = teams_from_text((data / "teams.yaml").read_text(), str(data / "teams.yaml"))
    total_quota = sum(n for t in teams.teams.values() for n in t.quota.values())

    jobs = read_jobs_csv(data / "skewed.csv").jobs
    arrivals = sorted(j.arrival for j in jobs)
    since, until = arrivals[round(0.01 * (len(arrivals) - 1))], arrivals[-1]
    print(f"skewed.csv: {len(jobs)} jobs, window {since:.0f}-{until:.0f} s")
    print("| team | quota share | share without --teams | share with --teams |")
    print("|---|---|---|---|")
    runs = {}
    for label, t in (("without", None), ("with", teams)):
        result = simulate(fleet.cluster, jobs, make_policy("seed"), comm_cost=0.0, teams=t)
        runs[label] = (by_team(result.records, since, until), utilisation(result, since, until),
                       summarize(result)["allocation_mean"])
    for name in sorted(teams.teams):
        q = sum(teams.teams[name].quota.values()) / total_quota
        print(f"| {name} | {q:.1%} | {runs['without'][0][name]['share']:.1%} | {runs['with'][0][name]['share']:.1%} |")
    print(f"| utilisation | | {runs['without'][1]:.1%} | {runs['with'][1]:.1%} |")

    jobs = read_jobs_csv(data / "lending.csv").jobs
    result = simulate(fleet.cluster, jobs, make_policy("seed"), comm_cost=0.0, teams=teams)
    back = min(j.arrival for j in jobs if j.team == "prod")
    arrivals = sorted(j.arrival for j in jobs)
    start = arrivals[round(0.01 * (len(arrivals) - 1))]
    first = min((r for r in result.records if r.team == "prod"), key=lambda r: (r.arrival, r.id))
    borrowing = [r for r in result.records if r.borrowed and r.start <= back < r.end]
    longest = max((r.end - r.start for r in borrowing), default=0.0)
    shares = by_team(result.records, back, arrivals[-1])
    print(f"\nlending.csv: {len(jobs)} jobs; prod idle until {back:.1f} s")
    print(f"utilisation while prod is idle ({start:.0f}-{back:.0f} s): {utilisation(result, start, back):.1%}")
    print(f"jobs started on borrowed quota and still running at {back:.0f} s: {len(borrowing)}, "
          f"the longest of them {longest:.1f} s")
    print(f"prod's first job {first.id}: {first.gpus} GPUs, arrived {first.arrival:.1f} s, waited {first.wait:.1f} s")
    print(f"after prod is back ({back:.0f}-{arrivals[-1]:.0f} s): utilisation "
          f"{utilisation(result, back, arrivals[-1]):.1%}, shares " +
          ", ".join(f"{n} {v['share']:.1%}" for n, v in shares.items()))


if __name__ == "__main__":
    main()
