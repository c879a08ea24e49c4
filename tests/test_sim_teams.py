"""The simulator with teams (docs/teams.md, docs/simulation.md): `hetero-gpu simulate --teams`
on a saturated 32-GPU cluster where intern submits four times as often as research and prod,
through the product's admission function; shares computed from `--jobs-out` over the saturated
window. Bad --teams files are one line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from airflow_hetero_gpu.cli.app import main

DATA = Path(__file__).parent / "data" / "teams"
QUOTA_SHARE = {"research": 0.5, "prod": 0.25, "intern": 0.25}
COLUMNS = ["job_id", "team", "priority", "gpus", "arrival_s", "start_s", "end_s", "preemptions", "lost_gpu_s"]


def _shares(path: Path, since: float, until: float) -> tuple[dict[str, float], float]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == COLUMNS
    held: dict[str, float] = {}
    for r in rows:
        assert r["preemptions"] == "0" and float(r["lost_gpu_s"]) == 0
        span = max(0.0, min(float(r["end_s"]), until) - max(float(r["start_s"]), since))
        held[r["team"]] = held.get(r["team"], 0.0) + int(r["gpus"]) * span
    total = sum(held.values())
    return {t: v / total for t, v in held.items()}, total / (32 * (until - since))


def _simulate(tmp_path: Path, capsys, *extra: str) -> tuple[dict, Path]:
    jobs = tmp_path / "jobs.csv"
    argv = ["simulate", "--trace", str(DATA / "skewed-1h.csv"), "--nodes", str(DATA / "nodes.csv"), "--time-scale",
            "1", "--comm-cost", "0", "--policies", "seed", "--workers", "1", "--json", "--jobs-out", str(jobs), *extra]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out), jobs


def test_quotas_give_each_team_its_share_and_keep_the_cluster_busy(tmp_path, capsys):
    report, jobs = _simulate(tmp_path, capsys, "--teams", str(DATA / "teams.yaml"))
    shares, utilisation = _shares(jobs, 600.0, 3600.0)  # saturated from the first minutes to the last arrival
    for team, share in QUOTA_SHARE.items():
        assert abs(shares[team] - share) <= 0.05, shares
    assert utilisation >= 0.95
    by_team = report["policies"][0]["metrics"]["by_team"]
    assert set(by_team) == set(QUOTA_SHARE) and by_team["intern"]["jobs"] > 3 * by_team["prod"]["jobs"]
    assert report["settings"]["teams"]["teams"]["research"]["quota"] == {"*": 16}


def test_without_teams_the_flooding_team_takes_most_of_the_fleet(tmp_path, capsys):
    report, jobs = _simulate(tmp_path, capsys)
    shares, utilisation = _shares(jobs, 600.0, 3600.0)
    assert shares["intern"] > 0.5 and utilisation >= 0.95
    assert "teams" not in report["settings"]


@pytest.mark.parametrize("text, message", [
    ("teams:\n  prod: {quota: {'H100*': 8}}\n", "team prod: quota: pattern 'H100*' matches no card of the fleet"),
    ("teams:\n  prod: {quota: {'*': 8}, lend: 2}\n", "team prod: unknown key 'lend'"),
])
def test_a_bad_teams_file_is_one_line(tmp_path, capsys, text, message):
    bad = tmp_path / "teams.yaml"
    bad.write_text(text)
    argv = ["simulate", "--trace", str(DATA / "skewed-1h.csv"), "--nodes", str(DATA / "nodes.csv"),
            "--time-scale", "1", "--policies", "seed", "--teams", str(bad)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(bad) in err


def test_max_jobs_is_replayed_at_most_n_of_the_teams_jobs_run_at_once(tmp_path, capsys):
    """intern (max_jobs 2) submits six 1-GPU jobs of 100 s at once on 32 free GPUs: two run at a
    time (starts 0, 0, 100, 100, 200, 200); prod, without a cap, runs its three at once."""
    (tmp_path / "teams.yaml").write_text('teams:\n  intern: {quota: {"*": 16}, max_jobs: 2}\n'
                                         '  prod: {quota: {"*": 16}}\n')
    (tmp_path / "jobs.csv").write_text("job_id,arrival_s,duration_s,gpus,team\n"
                                       + "".join(f"i{n},0,100,1,intern\n" for n in range(6))
                                       + "".join(f"p{n},0,100,1,prod\n" for n in range(3)))
    out = tmp_path / "out.csv"
    assert main(["simulate", "--trace", str(tmp_path / "jobs.csv"), "--nodes", str(DATA / "nodes.csv"),
                 "--time-scale", "1", "--comm-cost", "0", "--policies", "seed", "--workers", "1", "--json",
                 "--teams", str(tmp_path / "teams.yaml"), "--jobs-out", str(out)]) == 0
    capsys.readouterr()
    with out.open() as f:
        starts = {r["job_id"]: float(r["start_s"]) for r in csv.DictReader(f)}
    assert sorted(starts[f"i{n}"] for n in range(6)) == [0, 0, 100, 100, 200, 200]
    assert [starts[f"p{n}"] for n in range(3)] == [0, 0, 0]
