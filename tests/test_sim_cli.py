"""``simulate`` end to end on a tiny trace, the report's comparison logic, and bad input."""

from __future__ import annotations

import json

import pytest

from airflow_hetero_gpu.cli.simulate import main
from airflow_hetero_gpu.sim.report import compare

NODES = "sn,cpu_milli,memory_mib,gpu,model\na,1,1,8,G2\nb,1,1,8,V100M32\nc,1,1,2,T4\nd,1,1,4,T4\n"
JOBS = "job_id,arrival_s,duration_s,gpus,gpu_type\n" + "".join(
    f"j{i},{i * 10},{200 + (i * 37) % 300},{[1, 1, 2, 4, 8, 1][i % 6]},{'T4' if i % 7 == 0 else ''}\n"
    for i in range(30)
)
SIX = ["seed", "random", "first-fit", "best-fit", "topology-only", "fgd"]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "jobs.csv").write_text(JOBS)
    return tmp_path


def _args(files, *extra):
    return ["simulate", "--trace", str(files / "jobs.csv"), "--nodes", str(files / "nodes.csv"),
            "--time-scale", "1", "--workers", "1", *extra]


def test_report_and_plots(files, capsys):
    out = files / "out"
    assert main(_args(files, "--out", str(out), "--sweep", "w1=0,0.1;w2=-0.2;w3=0.5;w4=0.2")) == 0
    text = capsys.readouterr().out
    assert "policy" in text and "topology-only" in text and "seed against the other policies" in text
    report = json.loads((out / "report.json").read_text())
    assert [p["policy"] for p in report["policies"]] == SIX
    # j28 asks for 8 T4 GPUs; the cluster has 6: rejected by every policy
    assert all((p["metrics"]["jobs"], p["metrics"]["rejected"]) == (29, 1) for p in report["policies"])
    assert report["trace"]["jobs"] == 30 and report["trace"]["constrained_jobs"] == 5
    assert report["cluster"]["gpus"] == 22
    assert [r["weights"] for r in report["sweep"]] == [
        {"load_balance": 0.0, "fragmentation": -0.2, "topology": 0.5, "free_blocks": 0.2},
        {"load_balance": 0.1, "fragmentation": -0.2, "topology": 0.5, "free_blocks": 0.2},
    ]
    # the default-weights point of the sweep is the seed run itself
    seed = report["policies"][0]["metrics"]
    swept = report["sweep"][1]["metrics"]
    assert {k: seed[k] for k in ("wait_mean_s", "distance_mean")} == {k: swept[k] for k in ("wait_mean_s", "distance_mean")}
    for name in ("sim-allocation.png", "sim-cdf.png", "sim-pareto.png", "sim-sweep.png"):
        assert (out / name).stat().st_size > 1000
    assert set(report["comparison"]) >= {"metrics", "pareto", "within_5_percent", "goal_holds"}


@pytest.mark.parametrize("extra,label", [
    ([], "admission queue (aging 3600 s)"),
    (["--aging", "0"], "admission queue (no aging)"),
    (["--queue", "fifo", "--backfill", "3"], "fifo queue, backfill 3"),
    (["--queue", "greedy"], "greedy queue"),
])
def test_queue_options_and_the_wait_by_size_table(files, capsys, extra, label):
    assert main(_args(files, "--policies", "first-fit", "--limit", "12", *extra)) == 0
    text = capsys.readouterr().out
    assert f"22 GPUs; {label}, comm cost" in text
    assert "queueing delay by job size:" in text and "1 GPU mean/p95/max s" in text


def test_json_output_and_two_workers(files, capsys):
    assert main(_args(files, "--json", "--policies", "first-fit,best-fit", "--workers", "2", "--limit", "10")) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["policy"] for p in report["policies"]] == ["first-fit", "best-fit"]
    assert report["comparison"] is None
    assert report["trace"]["jobs"] == 10


@pytest.mark.parametrize("extra,message", [
    (["--policies", "seed,magic"], "--policies: unknown policy 'magic'"),
    (["--policies", "seed,seed"], "--policies: a policy is listed twice"),
    (["--sweep", "w9=1"], "--sweep: expected NAME=V1,V2,..."),
    (["--sweep", "w1=a"], "--sweep: load_balance: expected numbers"),
    (["--backfill", "4"], "--backfill 4: only with --queue fifo"),
    (["--backfill", "4", "--queue", "greedy"], "--backfill 4: only with --queue fifo"),
])
def test_bad_options(files, capsys, extra, message):
    assert main(_args(files, *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bad_files(files, capsys):
    (files / "nodes.csv").write_text("sn,gpu,model\na,8,G2\na,2,T4\n")
    assert main(_args(files)) == 2
    assert "nodes.csv:3: column 'sn': duplicate host of line 2" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(files / "nope.csv"), "--nodes", str(files / "nodes.csv")]) == 2
    assert "--trace: no such file" in capsys.readouterr().err


# (metrics per policy, expected: dominated_by, within-5% per metric)
COMPARE_CASES = [
    ("seed best everywhere",
     {"seed": (1.0, 0.10, 50.0), "fgd": (2.0, 0.10, 60.0)}, [], {"distance_mean": True, "unallocated_while_waiting": True, "wait_mean_s": True}),
    ("dominated on both",
     {"seed": (2.0, 0.20, 50.0), "fgd": (1.0, 0.10, 50.0)}, ["fgd"], {"distance_mean": False, "unallocated_while_waiting": False, "wait_mean_s": True}),
    ("worse on one, better on the other: not dominated",
     {"seed": (1.0, 0.20, 50.0), "fgd": (1.5, 0.10, 50.0)}, [], {"distance_mean": True, "unallocated_while_waiting": False, "wait_mean_s": True}),
    ("within 5 % relative, and within the absolute tolerance",
     {"seed": (1.04, 0.1005, 50.9), "topology-only": (1.0, 0.1, 50.0)}, ["topology-only"], {"distance_mean": True, "unallocated_while_waiting": True, "wait_mean_s": True}),
    ("ties within tolerance do not dominate",
     {"seed": (1.005, 0.1005, 50.0), "best-fit": (1.0, 0.1, 50.0)}, [], {"distance_mean": True, "unallocated_while_waiting": True, "wait_mean_s": True}),
]


@pytest.mark.parametrize("case,table,dominated,within", COMPARE_CASES, ids=[c[0] for c in COMPARE_CASES])
def test_compare(case, table, dominated, within):
    metrics = {p: {"distance_mean": d, "unallocated_while_waiting": u, "wait_mean_s": w} for p, (d, u, w) in table.items()}
    c = compare(metrics)
    assert c["pareto"]["dominated_by"] == dominated
    assert c["within_5_percent"]["metrics"] == within
    assert c["goal_holds"] == (not dominated and all(within.values()))


def test_weights_option_takes_three_or_four_values():
    import argparse

    from airflow_hetero_gpu.cli.simulate import _weights

    assert _weights("0.3,-0.2,0.5") == {"load_balance": 0.3, "fragmentation": -0.2, "topology": 0.5}
    assert _weights("0.1,-0.2,0.5,0.2") == {"load_balance": 0.1, "fragmentation": -0.2, "topology": 0.5,
                                           "free_blocks": 0.2}
    for bad in ("1,2", "1,2,3,4,5", "a,b,c"):
        with pytest.raises(argparse.ArgumentTypeError):
            _weights(bad)
