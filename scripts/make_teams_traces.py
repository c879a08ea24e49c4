"""Writes the simulator traces of docs/simulation.md's fairness table (tests/data/teams/).

skewed.csv: three teams submit 1-, 2- and 4-GPU jobs (half, 30 %, 20 %) of 200-400 s for two
hours, at rates 1:1:4 (research, prod, intern); research alone offers 1.25 times its quota of 16
GPUs, so every team offers more than its quota and the 32 GPUs stay saturated.
lending.csv: the same for research and intern, while prod submits nothing for the first hour
and then as the others do: prod's idle quota is lent for an hour and then comes back.
skewed-1h.csv: like skewed.csv for one hour (tests/test_sim_teams.py).

    python scripts/make_teams_traces.py tests/data/teams
"""

from __future__ import annotations

import csv
import random
import sys
from pathlib import Path

SIZES = (1, 1, 1, 1, 1, 2, 2, 2, 4, 4)  # mean 1.9 GPUs
MEAN_S = 300.0
RATE = 1.25 * 16 / (1.9 * MEAN_S)  # research's jobs per second: 1.25 x its quota offered


def jobs(team: str, rate: float, start: float, end: float, rng: random.Random):
    t = start
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            return
        yield t, rng.uniform(200.0, 400.0), rng.choice(SIZES), team


def write(path: Path, rows) -> None:
    rows = sorted(rows)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "arrival_s", "duration_s", "gpus", "team"])
        for n, (t, d, g, team) in enumerate(rows):
            w.writerow([f"{team}-{n:05d}", f"{t:.1f}", f"{d:.1f}", g, team])


def main(out: str) -> None:
    out_dir = Path(out)
    rng = random.Random(23)
    write(out_dir / "skewed.csv", [*jobs("research", RATE, 0, 7200, rng), *jobs("prod", RATE, 0, 7200, rng),
                                   *jobs("intern", 4 * RATE, 0, 7200, rng)])
    rng = random.Random(25)
    write(out_dir / "skewed-1h.csv", [*jobs("research", RATE, 0, 3600, rng), *jobs("prod", RATE, 0, 3600, rng),
                                      *jobs("intern", 4 * RATE, 0, 3600, rng)])
    rng = random.Random(24)
    write(out_dir / "lending.csv", [*jobs("research", RATE, 0, 7200, rng), *jobs("prod", RATE, 3600, 7200, rng),
                                    *jobs("intern", 4 * RATE, 0, 7200, rng)])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/teams")
