"""The preemption table of docs/simulation.md: one trace on 32 GPUs, replayed with and without
preemption, waits of the high-priority jobs, preemptions and lost GPU-hours.

    python scripts/preemption_table.py [--out DIR]

The trace (written to DIR, default a temporary folder): four hosts of 8 V100s; for 48 hours a
stream of low-priority 8-GPU training jobs (priority 0, 2-8 h, one every 80 min on average, a
checkpoint every 30 min) that keeps the fleet about full, and an urgent 8-GPU retraining (priority 5, 30-60 min, no checkpoints)
every 3 h on average. Seeded: the same table every run.
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import tempfile
from pathlib import Path

from airflow_hetero_gpu.cli.simulate import main as simulate

HOURS = 48


def write_trace(folder: Path, seed: int = 7) -> tuple[Path, Path]:
    rng = random.Random(seed)
    nodes = folder / "nodes.csv"
    nodes.write_text("sn,gpu,model\n" + "".join(f"h{i},8,V100M32\n" for i in range(4)))
    rows, t, n = [], 0.0, 0
    while t < HOURS * 3600:  # low priority: a 5-hour 8-GPU job every 80 min on 4 hosts: about full
        rows.append((f"lo{n:03d}", round(t), rng.randint(2, 8) * 3600, 8, 0, 1, 1800))
        t += rng.expovariate(1 / (80 * 60))
        n += 1
    t, n = rng.expovariate(1 / (3 * 3600)), 0
    while t < HOURS * 3600:
        rows.append((f"hi{n:03d}", round(t), rng.randint(30, 60) * 60, 8, 5, 1, 0))
        t += rng.expovariate(1 / (3 * 3600))
        n += 1
    jobs = folder / "jobs.csv"
    with open(jobs, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["job_id", "arrival_s", "duration_s", "gpus", "priority", "preemptible", "checkpoint_s"])
        w.writerows(sorted(rows, key=lambda r: r[1]))
    return nodes, jobs


def run(folder: Path, nodes: Path, jobs: Path, preemption: str) -> list[dict]:
    out = folder / f"jobs-{preemption}.csv"
    argv = ["simulate", "--trace", str(jobs), "--nodes", str(nodes), "--time-scale", "1", "--comm-cost", "0",
            "--policies", "seed", "--workers", "1", "--preemption", preemption, "--jobs-out", str(out),
            "--events-out", str(folder / f"events-{preemption}.csv"), "--json"]
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        assert simulate(argv) == 0
    with open(out, newline="") as fh:
        return list(csv.DictReader(fh))


def row(label: str, jobs: list[dict]) -> str:
    def waits(prio: str) -> list[float]:
        return sorted(float(j["start_s"]) - float(j["arrival_s"]) for j in jobs if j["priority"] == prio)

    hi, lo = waits("5"), waits("0")
    pre = sum(int(j["preemptions"]) for j in jobs)
    lost = sum(float(j["lost_gpu_s"]) for j in jobs) / 3600
    twice = sum(1 for j in jobs if int(j["preemptions"]) > 1)
    used = sum(int(j["gpus"]) * (float(j["end_s"]) - float(j["start_s"])) for j in jobs) / 3600
    waited = [w for w in hi if w > 0]
    return (f"| {label} | {len(waited)} of {len(hi)} | {statistics.mean(waited) / 60:.0f} min | "
            f"{statistics.median(waited) / 60:.0f} min | {hi[-1] / 60:.0f} min | "
            f"{statistics.mean(lo) / 3600:.1f} h | {pre} ({twice} twice) | {lost:.1f} | {lost / used * 100:.2f} % |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    folder = args.out or Path(tempfile.mkdtemp(prefix="preemption-"))
    folder.mkdir(parents=True, exist_ok=True)
    nodes, jobs = write_trace(folder)
    print("| preemption | high-priority jobs that waited | their wait, mean | median | max | low-priority wait, "
          "mean | preemptions | lost GPU-hours | of GPU-hours used |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in ("off", "on"):
        print(row(mode, run(folder, nodes, jobs, mode)))
    print(f"(trace and outputs in {folder})")


if __name__ == "__main__":
    main()
