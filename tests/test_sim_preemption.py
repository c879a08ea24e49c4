"""Preemption in the simulator, end to end through ``hetero-gpu simulate`` (its --jobs-out and
--events-out files), on 32 GPUs: four hosts of 8 V100s.

Times are worked out by hand with ``--comm-cost 0`` (run times are the trace's), the defaults
``--preemption-grace 300``, ``--min-runtime 600`` and a preemption delay of 60 s.
"""

from __future__ import annotations

import csv
import json

import pytest

from airflow_hetero_gpu.cli.simulate import main

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"h{i},1,1,8,V100M32\n" for i in range(4))
HEADER = "job_id,arrival_s,duration_s,gpus,priority,preemptible,checkpoint_s\n"
# four 2-hour low-priority jobs fill the 32 GPUs; an urgent 8-GPU job arrives 10 minutes later
FULL = HEADER + "".join(f"lo{i},0,7200,8,1,1,300\n" for i in range(4)) + "hi,600,600,8,5,1,0\n"


def _simulate(tmp_path, trace: str, *extra: str) -> tuple[dict, dict[str, dict], list[dict]]:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "jobs.csv").write_text(trace)
    jobs, events = tmp_path / "jobs-out.csv", tmp_path / "events.csv"
    argv = ["simulate", "--trace", str(tmp_path / "jobs.csv"), "--nodes", str(tmp_path / "nodes.csv"),
            "--time-scale", "1", "--workers", "1", "--comm-cost", "0", "--policies", "seed", "--json",
            "--jobs-out", str(jobs), "--events-out", str(events), *extra]
    return argv, jobs, events


def _read(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _run(tmp_path, capsys, trace, *extra):
    argv, jobs, events = _simulate(tmp_path, trace, *extra)
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    return report["policies"][0]["metrics"], {r["job_id"]: r for r in _read(jobs)}, _read(events)


def test_the_urgent_job_starts_within_grace_plus_a_minute_and_one_victim_loses_little(tmp_path, capsys):
    metrics, jobs, events = _run(tmp_path, capsys, FULL)
    hi = jobs["hi"]
    wait = float(hi["start_s"]) - float(hi["arrival_s"])
    assert wait <= 300 + 60
    assert wait == 360  # the delay (60 s), then the victim's whole grace (300 s)
    preempts = [e for e in events if e["event"] == "preempt"]
    assert len(preempts) == 1 and preempts[0]["detail"] == "hi" and preempts[0]["time_s"] == "660"
    victim = preempts[0]["job_id"]
    assert int(jobs[victim]["preemptions"]) == 1
    assert sum(int(j["preemptions"]) for j in jobs.values()) == metrics["preemptions"] == 1
    # signalled at 660, last checkpoint at 600: 60 s × 8 GPUs lost; it kept 600 s of its 7200
    assert float(jobs[victim]["lost_gpu_s"]) == metrics["lost_gpu_s"] == 480
    # it goes back to the queue, restarts when hi ends (960 + 600) and runs the 6600 s it had left
    assert float(jobs[victim]["end_s"]) == 1560 + 6600
    assert float(jobs[victim]["start_s"]) == 0  # its first start
    starts = [e for e in events if e["job_id"] == victim and e["event"] == "start"]
    assert [e["time_s"] for e in starts] == ["0", "1560"]
    for other in {"lo0", "lo1", "lo2", "lo3"} - {victim}:
        assert jobs[other]["preemptions"] == "0" and float(jobs[other]["end_s"]) == 7200


def test_without_preemption_the_urgent_job_waits_for_a_job_to_end(tmp_path, capsys):
    metrics, jobs, events = _run(tmp_path, capsys, FULL, "--preemption", "off")
    assert float(jobs["hi"]["start_s"]) == 7200
    assert metrics["preemptions"] == 0 and metrics["lost_gpu_s"] == 0
    assert not [e for e in events if e["event"] == "preempt"]


def test_a_job_that_is_not_preemptible_is_never_chosen(tmp_path, capsys):
    trace = HEADER + "".join(f"lo{i},0,7200,8,1,{0 if i < 3 else 1},300\n" for i in range(4)) + "hi,600,600,8,5,1,0\n"
    _, jobs, events = _run(tmp_path, capsys, trace)
    assert [e["job_id"] for e in events if e["event"] == "preempt"] == ["lo3"]
    trace = HEADER + "".join(f"lo{i},0,7200,8,1,0,300\n" for i in range(4)) + "hi,600,600,8,5,1,0\n"
    _, jobs, events = _run(tmp_path, capsys, trace)
    assert not [e for e in events if e["event"] == "preempt"] and float(jobs["hi"]["start_s"]) == 7200


def test_no_thrashing_under_a_stream_of_urgent_short_jobs(tmp_path, capsys):
    # four 2-hour low-priority jobs and, for two hours, an urgent 8-GPU 5-minute job every 4 minutes
    trace = HEADER + "".join(f"lo{i},{i},7200,8,0,1,600\n" for i in range(4))
    trace += "".join(f"hi{n:02d},{600 + 240 * n},300,8,5,1,0\n" for n in range(30))
    metrics, jobs, events = _run(tmp_path, capsys, trace)
    assert metrics["preemptions"] >= 2  # preemption does happen
    last_start: dict[str, float] = {}
    for e in events:
        t = float(e["time_s"])
        if e["event"] == "start":
            last_start[e["job_id"]] = t
        elif e["event"] == "preempt":
            assert t - last_start[e["job_id"]] >= 600, f"{e['job_id']} preempted {t - last_start[e['job_id']]} s after its start"
            assert e["job_id"].startswith("lo")
    # every low-priority job still finishes, and has run all its 7200 s of work (kept + last run)
    for i in range(4):
        lo = jobs[f"lo{i}"]
        assert lo["end_s"] != ""
    assert len(jobs) == 34
    assert sum(float(j["lost_gpu_s"]) for j in jobs.values()) == pytest.approx(metrics["lost_gpu_s"])


def test_bad_trace_values_and_options_are_one_line_errors(tmp_path, capsys):
    argv, _, _ = _simulate(tmp_path, HEADER + "a,0,10,1,0,2,0\n")
    assert main(argv) == 2
    assert "jobs.csv:2: column 'preemptible': expected 1 or 0, got '2'" in capsys.readouterr().err
    argv, _, _ = _simulate(tmp_path, HEADER + "a,0,10,1,0,1,-5\n")
    assert main(argv) == 2
    assert "column 'checkpoint_s': must be at least 0, got '-5'" in capsys.readouterr().err
    argv, _, _ = _simulate(tmp_path, FULL, "--policies", "seed,first-fit")
    assert main(argv) == 2
    assert "--jobs-out: writes the jobs of one run; give one policy" in capsys.readouterr().err
    argv, _, _ = _simulate(tmp_path, FULL, "--queue", "fifo", "--preemption", "on")
    assert main(argv) == 2
    assert "--preemption on: only the admission queue preempts" in capsys.readouterr().err


# The lending scenario with preemption. intern (quota 16) fills all 32 GPUs with
# long high-priority jobs while prod (quota 16) is idle: 16 of them run on prod's lent quota.
# prod's first job (8 GPUs, priority 0) then reclaims its quota: it stops one borrower.
LEND_TEAMS = "teams:\n  prod: {quota: {\"*\": 16}}\n  intern: {quota: {\"*\": 16}}\n"
LEND = ("job_id,arrival_s,duration_s,gpus,team,priority,preemptible,checkpoint_s\n"
        + "".join(f"intern{i},0,7200,8,intern,5,0,300\n" for i in range(4))
        + "prod0,900,600,8,prod,0,1,0\n")


def test_a_returning_lender_reclaims_within_grace_plus_a_minute(tmp_path, capsys):
    (tmp_path / "teams.yaml").write_text(LEND_TEAMS)
    metrics, jobs, events = _run(tmp_path, capsys, LEND, "--teams", str(tmp_path / "teams.yaml"))
    prod = jobs["prod0"]
    assert float(prod["start_s"]) - float(prod["arrival_s"]) <= 300 + 60
    preempts = [e for e in events if e["event"] == "preempt"]
    assert len(preempts) == 1 and preempts[0]["detail"] == "prod0"  # one borrower, though preemptible=0
    victim = jobs[preempts[0]["job_id"]]
    assert victim["team"] == "intern" and victim["preemptions"] == "1"
    assert float(victim["end_s"]) > 7200  # it resumed and finished later
    # without preemption the lender waits for a borrower to end
    metrics, jobs, events = _run(tmp_path, capsys, LEND, "--teams", str(tmp_path / "teams.yaml"),
                                 "--preemption", "off")
    assert float(jobs["prod0"]["start_s"]) == 7200 and not [e for e in events if e["event"] == "preempt"]
