"""The inventory's Xid rule: which kernel-log Xid lines of a capture count as health facts.

Readers with a ledger take Xids from its eviction records (XIDS_FROM_LEDGER: no line counts);
a capture directory read on its own counts the lines logged within ``xid_window`` of the
capture's time (xid.log's modification time), and the lines whose time cannot be known.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from airflow_hetero_gpu.capture.directory import read_capture_dir
from airflow_hetero_gpu.core.inventory import XIDS_FROM_LEDGER, XidRule, cluster_from_captures, load_cluster
from plan_fixtures import make_captures

CAPTURED = datetime(2026, 3, 1, 12, 0, 0)
BUS = {3: "0000:4e:00", 5: "0000:90:00"}  # a100-1 GPU3 and GPU5 (plan_fixtures' bus ids)


def _journal(when: datetime, gpu: int, xid: int) -> str:
    return f"{when:%b %d %H:%M:%S} a100-1 kernel: NVRM: Xid (PCI:{BUS[gpu]}): {xid}, pid=1, name=python3, x\n"


def captures_with_log(tmp_path: Path, text: str) -> Path:
    root = make_captures(tmp_path)
    log = root / "hosts" / "a100-1" / "xid.log"
    log.write_text(text)
    os.utime(log, (CAPTURED.timestamp(), CAPTURED.timestamp()))  # the capture's time
    return root


def reasons(cluster, index: int) -> tuple[str, ...]:
    return cluster.gpu(("a100-1", index)).reasons


# log, rule, expected reasons of GPU3, of GPU5
CASES = [
    pytest.param(_journal(CAPTURED - timedelta(hours=2), 3, 79) + _journal(CAPTURED - timedelta(minutes=10), 5, 48),
                 None, (), ("xid-48",), id="default-window-1h-counts-the-recent-line-only"),
    pytest.param(_journal(CAPTURED - timedelta(hours=2), 3, 79) + _journal(CAPTURED - timedelta(minutes=10), 5, 48),
                 XidRule.offline(3 * 3600), ("xid-79",), ("xid-48",), id="a-wider-window-counts-both"),
    pytest.param(_journal(CAPTURED - timedelta(minutes=10), 5, 48), XidRule.offline(0), (), (), id="window-0-counts-none"),
    pytest.param(_journal(CAPTURED - timedelta(minutes=10), 5, 48), XIDS_FROM_LEDGER, (), (), id="ledger-readers-count-none"),
    pytest.param("[ 1234.567890] NVRM: Xid (PCI:0000:4e:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
                 None, ("xid-79",), (), id="dmesg-uptime-line-has-no-time-and-counts"),
    pytest.param("[ 1234.567890] NVRM: Xid (PCI:0000:4e:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
                 XIDS_FROM_LEDGER, (), (), id="dmesg-line-ignored-with-a-ledger"),
    pytest.param(f"[{CAPTURED - timedelta(days=3):%a %b %d %H:%M:%S %Y}] NVRM: Xid (PCI:0000:4e:00): 94, x\n",
                 None, (), (), id="dmesg-T-line-three-days-old"),
    pytest.param(_journal(CAPTURED - timedelta(minutes=1), 3, 13), None, (), (), id="application-xid-never-counts"),
]


@pytest.mark.parametrize("log, rule, gpu3, gpu5", CASES)
def test_which_xid_lines_count(tmp_path, log, rule, gpu3, gpu5):
    captures = read_capture_dir(captures_with_log(tmp_path, log))
    assert captures.hosts["a100-1"].collected_at.timestamp() == CAPTURED.timestamp()
    cluster = cluster_from_captures(captures, xid_rule=rule)
    assert (reasons(cluster, 3), reasons(cluster, 5)) == (gpu3, gpu5)
    assert cluster.gpu(("a100-1", 3)).healthy is (not gpu3)


def test_the_window_comes_from_cluster_yaml(tmp_path):
    root = captures_with_log(tmp_path, _journal(CAPTURED - timedelta(hours=2), 3, 79))
    assert reasons(load_cluster(root), 3) == ()
    (root / "cluster.yaml").write_text("thresholds:\n  xid_window_s: 10800\n")
    assert reasons(load_cluster(root), 3) == ("xid-79",)
    assert reasons(load_cluster(root, xid_rule=XidRule.offline(60)), 3) == ()  # the argument wins


def test_a_negative_window_is_refused():
    with pytest.raises(ValueError, match="must not be negative"):
        XidRule.offline(-1)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", *args], capture_output=True,
                          text=True, timeout=60)


def test_plan_from_a_capture_directory_keeps_an_old_xid_out_of_health(tmp_path):
    # an Xid 79 two hours before the capture: the GPU has been fine since, an 8-GPU job gets a100-1
    root = captures_with_log(tmp_path, _journal(CAPTURED - timedelta(hours=2), 3, 79))
    r = cli("plan", "--captures", str(root), "--gpus", "8", "--gpu-type", "A100-SXM4-80GB", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["decision"]["hosts"] == ["a100-1"] and out["unhealthy"] == []
    # asked to look back three hours, the same line keeps GPU3 out: the job goes to a100-2
    r = cli("plan", "--captures", str(root), "--gpus", "8", "--gpu-type", "A100-SXM4-80GB", "--json",
            "--xid-window", "10800")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["decision"]["hosts"] == ["a100-2"]
    assert out["unhealthy"] == [{"host": "a100-1", "index": 3, "reasons": ["xid-79"]}]
    r = cli("inventory", "--captures", str(root), "--xid-window", "10800")
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("a100-1") and " 3 " in ln[:12])
    assert line.split()[-2:] == ["no", "xid-79"]


def test_bad_xid_window_is_one_line_exit_2(tmp_path):
    r = cli("plan", "--captures", str(make_captures(tmp_path)), "--gpus", "1", "--xid-window", "soon")
    assert r.returncode == 2 and "--xid-window" in r.stderr and len(r.stderr.strip().splitlines()) == 1
