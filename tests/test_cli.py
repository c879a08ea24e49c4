"""The ``hetero-gpu`` command as a user runs it: a real process, its exit status, stdout, stderr."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plan_fixtures import make_captures

SAMPLE = Path(__file__).resolve().parents[1] / "airflow_hetero_gpu" / "samples" / "cluster"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd)


def test_help_lists_the_commands():
    r = run("--help")
    assert r.returncode == 0
    for cmd in ("inventory", "pools", "plan"):
        assert cmd in r.stdout


def test_plan_json_has_the_spec_shape(tmp_path):
    r = run("plan", "--captures", str(make_captures(tmp_path)), "--gpus", "2", "--gpu-type", "A100-SXM4-80GB", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"decision", "pools", "unhealthy"}
    d = out["decision"]
    assert set(d) == {"pool", "gpus", "hosts", "score"}
    assert d["pool"] == "NVIDIA A100-SXM4-80GB" and d["hosts"] == ["a100-1"]
    assert [(g["host"], g["index"]) for g in d["gpus"]] == [("a100-1", 0), ("a100-1", 1)]
    assert set(d["gpus"][0]) == {"host", "index", "uuid", "name"} and d["gpus"][0]["uuid"].startswith("GPU-")
    # a100-1 GPUs 0-1 out of 8 idle break its 4- and 8-block: free blocks 0; E = 0.1 + 0.5 + 0.2 * 0
    assert d["score"] == {"load_balance": 1.0, "fragmentation": 0.0, "topology": 1.0, "free_blocks": 0.0,
                          "total": pytest.approx(0.6)}
    assert set(out["pools"][0]) == {"pool", "card_type", "task_types", "gpus", "healthy", "available", "stage",
                                    "reason", "score"}
    assert {p["stage"] for p in out["pools"]} == {"scheduling", "rejected"}


def test_plan_table_and_exit_3_when_nothing_fits(tmp_path):
    # 16 GPUs: the A100 pool has 16, one of them unhealthy (a shortage that may pass, not a mistake)
    caps = make_captures(tmp_path, faults={"a100-1": {2: {"ecc_uncorrected_volatile": 1}}})
    r = run("plan", "--captures", str(caps), "--gpus", "16")
    assert r.returncode == 3, r.stderr
    assert "decision: no pool can host the job now" in r.stdout
    for card in ("NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB", "NVIDIA GeForce RTX 4090"):
        line = next(line for line in r.stdout.splitlines() if line.startswith(card))
        assert "rejected" in line and "needs 16 GPUs, has" in line


def test_plan_more_gpus_than_any_pool_has_is_bad_input_naming_the_pools(tmp_path):
    r = run("plan", "--captures", str(make_captures(tmp_path)), "--gpus", "17")
    assert (r.returncode, r.stdout) == (2, ""), r.stdout
    assert r.stderr == ("hetero-gpu plan: error: gpu_count 17: more GPUs than any matching pool has at all, healthy "
                        "or not, so it can never start: NVIDIA A100-SXM4-80GB has 16; NVIDIA GeForce RTX 4090 has 8; "
                        "Tesla V100-SXM2-32GB has 8\n")


def test_plan_json_exit_3_has_null_decision(tmp_path):
    r = run("plan", "--captures", str(make_captures(tmp_path, loads={"v100": {0: 0.9}})), "--gpus", "8",
            "--gpu-type", "V100-SXM2-32GB", "--json")
    assert r.returncode == 3
    out = json.loads(r.stdout)
    assert out["decision"] is None
    assert all(p["reason"] for p in out["pools"])


def test_inventory_json_fields_and_host_errors(tmp_path):
    caps = make_captures(tmp_path, errors={"rtx-2": "connection refused (127.0.0.15:2222)"},
                         faults={"v100": {2: {"ecc_uncorrected_volatile": 1}}})
    r = run("inventory", "--captures", str(caps), "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert len(rows) == 32
    # SPEC §4's fields, then MIG (instance, mode), why a unit is held back, the NVLink fabric and the
    # GPU's compute processes
    assert set(rows[0]) == {"host", "index", "uuid", "name", "memory_total_mib", "memory_used_mib", "utilization",
                            "temperature_c", "power_w", "healthy", "reasons", "instance", "mig", "unschedulable",
                            "fabric", "outside"}
    assert (rows[0]["instance"], rows[0]["mig"], rows[0]["unschedulable"], rows[0]["fabric"]) == (None, None, [], None)
    assert rows[0]["outside"] == []  # the GPU's compute processes (none: the sample has no apps.csv)
    by = {(g["host"], g["index"]): g for g in rows}
    assert by[("v100", 2)]["reasons"] == ["ecc"] and not by[("v100", 2)]["healthy"]
    assert by[("rtx-2", 0)]["reasons"] == ["unreachable"]
    assert by[("a100-1", 0)]["memory_total_mib"] == 81920 and by[("a100-1", 0)]["utilization"] == 0.0
    table = run("inventory", "--captures", str(caps))
    assert "host rtx-2: collection failed: connection refused (127.0.0.15:2222)" in table.stdout


def test_pools_lists_candidate_pools(tmp_path):
    r = run("pools", "--captures", str(SAMPLE), "--json")
    assert r.returncode == 0, r.stderr
    pools = {p["pool"]: p for p in json.loads(r.stdout)}
    assert set(pools) == {"Tesla V100-SXM2-32GB", "cv+finetune@NVIDIA GeForce RTX 4090",
                          "finetune+llm-pretrain@NVIDIA A100-SXM4-80GB"}
    a = pools["finetune+llm-pretrain@NVIDIA A100-SXM4-80GB"]
    assert (a["gpus"], a["healthy"], a["hosts"]) == (16, 15, ["a100-1", "a100-2"])


def _query_without_name(tmp_path: Path) -> Path:
    caps = make_captures(tmp_path / "c")
    q = caps / "hosts" / "rtx-1" / "query.csv"
    lines = q.read_text().splitlines()
    header = [c.strip() for c in lines[0].split(",")]
    drop = header.index("name")
    q.write_text("\n".join(", ".join(c for i, c in enumerate(line.split(", ")) if i != drop) for line in lines) + "\n")
    return caps


@pytest.mark.parametrize(
    "case, args, expect",
    [
        ("zero", ["--gpus", "0"], "argument --gpus: must be at least 1, got '0'"),
        ("negative", ["--gpus", "-3"], "argument --gpus: must be at least 1, got '-3'"),
        ("word", ["--gpus", "four"], "argument --gpus: expected a positive integer, got 'four'"),
        ("memory", ["--gpus", "1", "--gpu-memory", "-5"], "argument --gpu-memory: must be a non-negative number of MiB, got '-5'"),
        ("memory-word", ["--gpus", "1", "--gpu-memory", "lots"], "argument --gpu-memory: expected a number of MiB, got 'lots'"),
        ("reserve-alone", ["--gpus", "1", "--reserve"], "plan --reserve needs --job-id ID and --ledger URL"),
        ("bad-yaml-key", ["--gpus", "1", "@yaml"], "cluster.yaml: weights.topolgy: unknown key"),
        ("no-name", ["--gpus", "1", "@noname"], "query.csv"),
        ("empty-dir", ["--gpus", "1", "@empty"], "no hosts found"),
        ("missing-dir", ["--gpus", "1", "@missing"], "not a directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, case, args, expect):
    captures = make_captures(tmp_path / "ok")
    if "@yaml" in args:
        (captures / "cluster.yaml").write_text("weights:\n  topolgy: 0.5\n")
    elif "@noname" in args:
        captures = _query_without_name(tmp_path)
    elif "@empty" in args:
        captures = tmp_path / "empty"
        captures.mkdir()
    elif "@missing" in args:
        captures = tmp_path / "does-not-exist"
    args = [a for a in args if not a.startswith("@")]
    r = run("plan", "--captures", str(captures), *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert expect in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    if case == "no-name":
        assert "rtx-1" in r.stderr and "name" in r.stderr


def test_config_flag_overrides_the_directory_file(tmp_path):
    # the directory's cluster.yaml has SPEC §3's weights: load balance decides for V100 (see
    # test_planner_scenarios.test_load_balance_decides)
    caps = make_captures(tmp_path / "c", loads={"a100-1": {0: 0.95}},
                         cluster_yaml="weights:\n  load_balance: 0.3\n  free_blocks: 0\n")
    cfg = tmp_path / "weights.yaml"
    # with the load-balance and free-blocks weights at 0 and topology alone deciding, A100 and
    # V100 tie at 0.5: the smaller pool id (the A100 one) wins
    cfg.write_text("weights:\n  load_balance: 0\n  fragmentation: 0\n  topology: 0.5\n  free_blocks: 0\n")
    r = run("plan", "--captures", str(caps), "--gpus", "2", "--config", str(cfg), "--json")
    assert json.loads(r.stdout)["decision"]["pool"] == "NVIDIA A100-SXM4-80GB"
    r = run("plan", "--captures", str(caps), "--gpus", "2", "--json")
    assert json.loads(r.stdout)["decision"]["pool"] == "Tesla V100-SXM2-32GB"


def test_sample_capture_directory_is_shipped():
    assert (SAMPLE / "cluster.yaml").exists() and shutil.which(sys.executable)
    r = run("plan", "--captures", str(SAMPLE), "--gpus", "4", "--task-type", "finetune")
    assert r.returncode == 0
    assert "decision: pool 'finetune+llm-pretrain@NVIDIA A100-SXM4-80GB' -> a100-1 GPU 3,4,5,6" in r.stdout


def test_the_worked_example_of_docs_algorithm_md():
    # docs/algorithm.md computes the sample's 4-GPU plan by hand and shows the command's output
    doc = (Path(__file__).resolve().parents[1] / "docs" / "algorithm.md").read_text()
    shown = doc.split("The command prints exactly these numbers:\n\n```\n", 1)[1].split("\n```", 1)[0]
    r = run("plan", "--captures", str(SAMPLE), "--gpus", "4")
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == shown
    # and its one-GPU paragraph: the RTX 4090 pool wins, its FB and E as computed there
    r = run("plan", "--captures", str(SAMPLE), "--gpus", "1")
    assert "decision: pool 'cv+finetune@NVIDIA GeForce RTX 4090' -> rtx-1 GPU 0" in r.stdout
    assert "E = 0.7778  (load balance 0.9563, fragmentation 0.0000, topology 1.0000, free blocks 0.9107;" in r.stdout
    assert "evaluation 0.704933 below cv+finetune@NVIDIA GeForce RTX 4090's 0.777768" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--gpu-type", "H100"], "gpu_type 'H100': the fleet has no GPU of that card type; its card types: "
                             "NVIDIA A100-SXM4-80GB, NVIDIA GeForce RTX 4090, Tesla V100-SXM2-32GB"),
    (["--gpu-type", "H100", "--gpu-type", "B200*"], "gpu_type 'H100' or 'B200*': the fleet has no GPU"),
    (["--task-type", "llm"], "task_type 'llm': no pool of the fleet supports it; the fleet's task types: "
                             "Tesla V100-SXM2-32GB, cv, finetune, llm-pretrain"),
    (["--gpu-type", "V100-SXM2-32GB", "--task-type", "finetune"],
     "task_type 'finetune': no GPU of card type 'V100-SXM2-32GB' supports it; those support: Tesla V100-SXM2-32GB"),
])
def test_a_card_or_task_type_the_fleet_lacks_is_bad_input_not_no_capacity(args, message):
    """Exit 2 (bad input) with one line naming what the fleet has; exit 3 stays for capacity."""
    r = run("plan", "--captures", str(SAMPLE), "--gpus", "2", *args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("hetero-gpu plan: error: ")
    assert message in r.stderr
    # the same card type that exists, but asked for more GPUs than are free: still a capacity answer
    assert run("plan", "--captures", str(SAMPLE), "--gpus", "8", "--gpu-type", "V100-SXM2-32GB").returncode == 3
    # more than the pool has at all: a mistake
    assert run("plan", "--captures", str(SAMPLE), "--gpus", "9", "--gpu-type", "V100-SXM2-32GB").returncode == 2


def test_the_readme_sample_plan_is_what_the_command_prints():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("```console\n$ ", 1)[1].split("\n```", 1)[0]
    command, shown = block.split("\n", 1)
    assert command == "hetero-gpu plan --captures airflow_hetero_gpu/samples/cluster --gpus 4 --task-type finetune"
    r = run(*command.split()[1:], cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == shown.rstrip("\n")
