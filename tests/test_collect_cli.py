"""``hetero-gpu collect`` as a user runs it (a subprocess), against the emulated cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from collect_helpers import set_airflow_connections

from airflow_hetero_gpu.cli.app import main
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.core.planner import plan
from airflow_hetero_gpu.hooks.hetero_gpu import HeteroGpuHook
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


def hetero_gpu(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = dict(os.environ if env is None else env)
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), base.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", *argv], capture_output=True,
                          text=True, env=base, timeout=120)


def ssh_args(cluster) -> list[str]:
    return ["--hosts", cluster.hosts_arg(), "--identity-file", str(cluster.identity_file),
            "--known-hosts", str(cluster.known_hosts_path)]


def test_collect_then_plan_equals_planning_from_the_hook(emulated_cluster, monkeypatch, tmp_path):
    """The same fleet, collected by the command line and by the hook over Airflow connections,
    gives the same placement decision (the JSON of `hetero-gpu plan`)."""
    cluster = emulated_cluster(small_hosts(4, gpus=4))
    cluster.update_gpu("node01", 0, utilization_gpu=92, memory_used_mib=70000)
    cluster.update_gpu("node02", 2, utilization_gpu=40)
    cluster.update_gpu("node03", 1, ecc_uncorrected_volatile=1)
    cluster.inject_fault("node04", "driver_gone")

    out = tmp_path / "cli"
    done = hetero_gpu("collect", *ssh_args(cluster), "--out", str(out), "--connect-timeout", "5")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [ln.split()[:2] for ln in lines[:3]] == [["node01", "ok"], ["node02", "ok"], ["node03", "ok"]]
    assert lines[3].startswith("node04  failed: nvidia-smi exit 9: NVIDIA-SMI has failed")
    assert lines[4].startswith(f"collected 3/4 hosts into {out} in ")
    assert done.stderr == ""

    conns = set_airflow_connections(monkeypatch, cluster)
    hook = HeteroGpuHook(conns, captures_dir=tmp_path / "hook")
    from_hook = hook.get_cluster()
    for k in (3, 4, 6):
        planned = hetero_gpu("plan", "--captures", str(out), "--gpus", str(k), "--json")
        assert planned.returncode == 0, planned.stderr
        cli_plan = json.loads(planned.stdout)
        assert cli_plan == json.loads(json.dumps(plan(from_hook, PlanRequest(k)).to_json()))
        assert cli_plan["decision"] is not None
    # The failed host is reported the same way on both paths.
    assert (out / "hosts" / "node04" / "error.txt").read_text() == \
        (tmp_path / "hook" / "hosts" / "node04" / "error.txt").read_text()


def test_collect_through_airflow_connections(emulated_cluster, monkeypatch, tmp_path):
    cluster = emulated_cluster(small_hosts(2, gpus=1))
    conns = set_airflow_connections(monkeypatch, cluster)
    value = ",".join(f"{label}={conn}" for label, conn in conns.items())
    done = hetero_gpu("collect", "--ssh-conn-ids", value, "--out", str(tmp_path / "out"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [(h["host"], h["ok"]) for h in report["hosts"]] == [("node01", True), ("node02", True)]
    assert sorted(p.name for p in (tmp_path / "out" / "hosts" / "node02").iterdir()) == [
        "apps.csv", "procs.txt", "query.csv", "topo.txt", "xid.log"]


def test_nothing_collected_exits_4(emulated_cluster, tmp_path):
    cluster = emulated_cluster(small_hosts(2, gpus=1))
    cluster.inject_fault("node01", "host_down")
    cluster.inject_fault("node02", "host_key_changed")
    done = hetero_gpu("collect", *ssh_args(cluster), "--out", str(tmp_path / "out"), "--retries", "0")
    assert done.returncode == 4, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"node01  failed: connection refused (127.0.0.11:{cluster.host('node01').port})"
    assert lines[1].startswith("node02  failed: host key mismatch for 127.0.0.12:")
    assert lines[2].startswith("collected 0/2 hosts")


@pytest.mark.parametrize("argv, message", [
    (["--hosts", "gpu1:0", "--out", "OUT"], "invalid --hosts entry 'gpu1:0'"),
    (["--hosts", "a,a", "--out", "OUT"], "host 'a' appears twice"),
    (["--hosts", "gpu1"], "give --ledger URL (store in the ledger's inventory) and/or --out DIR"),
    (["--out", "OUT"], "one of the arguments --hosts --hosts-file --ssh-conn-ids is required"),
    (["--hosts", "gpu1", "--ssh-conn-ids", "a", "--out", "OUT"], "not allowed with argument"),
    (["--hosts", "gpu1", "--identity-file", "/nonexistent/key", "--out", "OUT"],
     "identity file '/nonexistent/key' does not exist"),
    (["--hosts", "gpu1", "--known-hosts", "/nonexistent/kh", "--out", "OUT"],
     "known_hosts file '/nonexistent/kh' does not exist"),
    (["--ssh-conn-ids", "a", "--identity-file", "k", "--out", "OUT"], "--identity-file and --known-hosts go with --hosts"),
    (["--ssh-conn-ids", "a,,b", "--out", "OUT"], "empty item in ssh_conn_ids"),
    (["--hosts", "gpu1", "--nvml", "--nvml-python", "python3;id", "--out", "OUT"], "must be a command name or path"),
    (["--hosts", "gpu1", "--max-parallel", "0", "--out", "OUT"], "must be at least 1"),
    (["--hosts", "gpu1", "--connect-timeout", "nan", "--out", "OUT"], "must be a positive number of seconds"),
    (["--hosts", "gpu1", "--command-timeout", "1e300", "--out", "OUT"], "must be at most 31536000 seconds (365 days)"),
    (["--hosts", "gpu1", "--out", "FILE"], "--out FILE"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "FILE").write_text("not a directory\n")
    argv = [str(tmp_path / a) if a in ("OUT", "FILE") else a for a in argv]
    message = message.replace("--out FILE", f"--out {tmp_path / 'FILE'}")
    try:
        code = main(["collect", *argv])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert out == ""


def test_bad_input_from_a_shell(tmp_path):
    done = hetero_gpu("collect", "--hosts", "gpu1:0", "--out", str(tmp_path))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("hetero-gpu collect: error: invalid --hosts entry 'gpu1:0': "
                           "port '0' must be a number 1-65535\n")
