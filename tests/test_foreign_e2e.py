"""GPUs used outside the scheduler on the emulated fleet (real sshd per host): a real process
of another user holds GPU 3 of node01; the collector reads the listing and ``ps`` over SSH into
the ledger, and ``hetero-gpu plan`` keeps the GPU out, naming the user, the pid and the memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from people_fixtures import other_users_process  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


def hetero_gpu(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", *argv], capture_output=True,
                          text=True, env=env, timeout=120)


def test_a_process_of_another_user_keeps_its_gpu_out_of_the_plan(emulated_cluster, other_users_process, tmp_path):
    pid, user = other_users_process
    cluster = emulated_cluster(small_hosts(2, gpus=4))
    # an idle notebook: 0 % utilization, 1,632 MiB of 81,920 (load 0.02, under busy_utilization)
    cluster.update_gpu("node01", 3, utilization_gpu=0, memory_used_mib=1632,
                       processes=[{"pid": pid, "name": "python3", "memory_mib": 1632}])
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    ssh = ["--hosts", cluster.hosts_arg(), "--identity-file", str(cluster.identity_file),
           "--known-hosts", str(cluster.known_hosts_path)]
    done = hetero_gpu("collect", *ssh, "--ledger", ledger)
    assert done.returncode == 0, done.stderr

    reason = f"in use outside the scheduler: {user}, pid {pid} python3, 1,632 MiB"
    eight = hetero_gpu("plan", "--ledger", ledger, "--gpus", "8", "--json")
    assert eight.returncode == 3, eight.stdout + eight.stderr
    (pool,) = json.loads(eight.stdout)["pools"]
    assert pool["available"] == 7 and f"node01 GPU3 {reason}" in pool["reason"], pool
    table = hetero_gpu("plan", "--ledger", ledger, "--gpus", "8")
    assert reason in table.stdout, table.stdout

    four = json.loads(hetero_gpu("plan", "--ledger", ledger, "--gpus", "4", "--json").stdout)
    assert {g["host"] for g in four["decision"]["gpus"]} == {"node02"}

    # a job holds node02's GPUs and its workers run there: they stay "reserved", never "outside"
    reserved = hetero_gpu("plan", "--ledger", ledger, "--gpus", "4", "--reserve", "--job-id", "job-a")
    assert reserved.returncode == 0, reserved.stderr
    for index in range(4):
        cluster.update_gpu("node02", index, utilization_gpu=0, memory_used_mib=900,
                           processes=[{"pid": os.getpid(), "name": "python", "memory_mib": 900}])
    assert hetero_gpu("collect", *ssh, "--ledger", ledger).returncode == 0
    (counts,) = json.loads(hetero_gpu("pools", "--ledger", ledger, "--json").stdout)
    assert (counts["reserved"], counts["busy"], counts["available"]) == (4, 1, 3), counts

    # a site that shares GPUs on purpose
    config = tmp_path / "cluster.yaml"
    config.write_text("thresholds:\n  foreign_processes: ignore\n")
    shared = json.loads(hetero_gpu("plan", "--ledger", ledger, "--config", str(config), "--gpus", "4",
                                   "--json").stdout)
    assert shared["decision"] is not None
    assert sorted((g["host"], g["index"]) for g in shared["decision"]["gpus"]) == [("node01", i) for i in range(4)]
    # a bad value is one line naming the key
    config.write_text("thresholds:\n  foreign_processes: warn\n")
    bad = hetero_gpu("plan", "--ledger", ledger, "--config", str(config), "--gpus", "1")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "thresholds.foreign_processes" in bad.stderr


def test_an_unreadable_ps_output_is_a_warning_and_the_gpu_stays_out(emulated_cluster, other_users_process,
                                                                     tmp_path):
    """A host whose ``ps`` prints something else (a BusyBox ps without ``-o``): the collection of
    that host still succeeds, one warning line names the file and line, the owners are left out,
    and the GPU with a process stays out of the plan (its owner unknown)."""
    pid, _user = other_users_process
    cluster = emulated_cluster(small_hosts(1, gpus=2))
    cluster.update_gpu("node01", 1, processes=[{"pid": pid, "name": "python3", "memory_mib": 1632}])
    fake_ps = cluster.host("node01").bin_dir / "ps"
    fake_ps.write_text("#!/bin/sh\necho 'ps: error: unsupported SysV option'\nexit 1\n")
    fake_ps.chmod(0o755)
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    done = hetero_gpu("collect", "--hosts", cluster.hosts_arg(), "--identity-file", str(cluster.identity_file),
                      "--known-hosts", str(cluster.known_hosts_path), "--ledger", ledger)
    assert done.returncode == 0, done.stderr
    (warning,) = [line.strip() for line in done.stdout.splitlines() if "warning:" in line]
    assert warning == ("warning: GPU processes' owners not read: procs.txt:1: expected 'PID PGID USER' "
                       "(ps -o pid=,pgid=,user=), got 'ps: error: unsupported SysV option'")
    planned = json.loads(hetero_gpu("plan", "--ledger", ledger, "--gpus", "2", "--json").stdout)
    (pool,) = planned["pools"]
    assert planned["decision"] is None
    assert f"node01 GPU1 in use outside the scheduler: unknown user, pid {pid} python3, 1,632 MiB" in pool["reason"]


def test_an_unreadable_stored_listing_is_refused_in_one_line_and_nothing_is_stored(tmp_path):
    from airflow_hetero_gpu.ledger import Ledger, LedgerError
    from airflow_hetero_gpu.ledger.inventory import HostRecord
    from airflow_hetero_gpu.testing.captures import host_files

    (spec,) = small_hosts(1, gpus=2)
    files = {**host_files(spec), "apps.csv": "gpu_uuid, pid, used_gpu_memory [MiB], process_name\n",
             "procs.txt": "ps: error: unsupported SysV option\n"}
    with Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.db'}") as led:
        try:
            led.store_collection([HostRecord("node01", True, files)], collector="test collector")
        except LedgerError as err:
            message = str(err)
        else:
            raise AssertionError("stored")
        assert message.startswith("ledger inventory of host node01/procs.txt:1: expected 'PID PGID USER'")
        assert "\n" not in message and led.inventory().hosts == {}
