"""The queue against a stream of small jobs (docs/queue.md, "A gang in a stream of 1-GPU jobs"):
two 8-GPU hosts, a 1-GPU job every 8.8 s for an hour, 120 s each (85 % of the 16 GPUs), and one
8-GPU job at 300 s. With the admission queue it claims a host and starts once that host drains,
within one small job's run time; with ``--queue greedy`` (every job that fits starts, the product
before its queue) the 1-GPU jobs never leave 8 GPUs free and it waits until the stream ends.
Run through ``hetero-gpu simulate`` on the committed CSV trace and node list."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_hetero_gpu.cli.simulate import main
from airflow_hetero_gpu.sim.trace import read_jobs_csv

DATA = Path(__file__).with_name("data") / "queue"
RUN_TIME = 120.0  # every 1-GPU job's


def _simulate(queue: str, capsys) -> dict:
    assert main(["simulate", "--trace", str(DATA / "stream.csv"), "--nodes", str(DATA / "nodes.csv"),
                 "--time-scale", "1", "--comm-cost", "0", "--policies", "seed", "--queue", queue,
                 "--workers", "1", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["policies"][0]["metrics"]


def test_the_trace_is_what_the_docs_say():
    jobs = read_jobs_csv(DATA / "stream.csv").jobs
    small = [j for j in jobs if j.gpus == 1]
    (gang,) = [j for j in jobs if j.gpus == 8]
    assert (gang.arrival, gang.duration) == (300.0, 600.0)
    assert len(small) == 410 and {j.duration for j in small} == {RUN_TIME}
    span = small[-1].arrival - small[0].arrival
    assert len(small) * RUN_TIME / ((span + 8.8) * 16) == pytest.approx(0.85, abs=0.01)


def test_admission_starts_the_gang_within_a_small_jobs_run_time(capsys):
    m = _simulate("admission", capsys)
    assert m["jobs"] == 411 and m["rejected"] == 0
    assert m["wait_by_gpus"]["8"]["max_s"] <= RUN_TIME


def test_greedy_keeps_the_gang_waiting_until_the_stream_ends(capsys):
    m = _simulate("greedy", capsys)
    last_small_arrival = max(j.arrival for j in read_jobs_csv(DATA / "stream.csv").jobs if j.gpus == 1)
    assert 300.0 + m["wait_by_gpus"]["8"]["max_s"] > last_small_arrival
    assert m["wait_by_gpus"]["1"]["max_s"] == 0.0  # every small job started on arrival
