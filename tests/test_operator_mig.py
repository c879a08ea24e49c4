"""A 1-GPU job that asks for a MIG type runs on a MIG instance, end to end: ``airflow dags test``
against the emulated cluster (real sshd), the collector lists the MIG devices, the ledger
reserves one instance, and the worker sees the instance's UUID in CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import json
import re

from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing.demo import enable_mig, small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from dag_run_helpers import airflow_home, leftovers, run_dag  # noqa: F401

MIG_1G = "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
SHOW = ["sh", "-c", 'echo "visible=$CUDA_VISIBLE_DEVICES rank=$HETERO_GPU_NODE_RANK host=$HETERO_GPU_HOST"']


def test_a_one_gpu_mig_job_runs_on_an_instance(airflow_home, emulated_cluster, tmp_path):
    specs = small_hosts(2, gpus=2)
    gpu = enable_mig(specs[0], 1)  # node01 GPU1: 3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb
    gpu.mig_devices[2]["processes"] = [{"pid": 4242, "name": "python3", "memory_mib": 900}]  # in use
    cluster = emulated_cluster(specs)
    r, out, cfg = run_dag(airflow_home, cluster, tmp_path, gpu_count=1, gpu_type=MIG_1G, command=SHOW)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-6000:]
    decision = json.loads(out.read_text())
    expected = gpu.mig_devices[3]["uuid"]  # MIG device 2 runs a process: the other 1g.10gb slice
    assert decision["pool"] == MIG_1G and decision["hosts"] == ["node01"]
    assert decision["gpus"] == [{"host": "node01", "index": 1, "instance": 3, "uuid": expected, "name": MIG_1G}]
    assert re.search(rf"\[node01 rank 0\] visible={re.escape(expected)} rank=0 host=node01", log), log[-4000:]
    assert decision["run"]["gpus"] == [{"host": "node01", "index": 1, "instance": 3}]
    # the collector stored the MIG listing and the table beside the query
    host_dir = tmp_path / "captures" / "hosts" / "node01"
    assert f"Device  3: (UUID: {expected})" in (host_dir / "mig.txt").read_text()
    assert "| MIG devices:" in (host_dir / "mig-usage.txt").read_text()
    assert not (tmp_path / "captures" / "hosts" / "node02" / "mig.txt").exists()
    with Ledger.from_url(cfg["ledger_url"]) as ledger:
        assert ledger.live_reservations() == []
    assert leftovers(decision["job_id"]) == ""
