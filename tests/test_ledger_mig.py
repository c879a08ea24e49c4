"""The ledger with MIG instances (schema step 4): two jobs hold two instances of one GPU at once,
no unit is held twice, an instance's fault evicts its GPU, replacement stays in the pool."""

from __future__ import annotations

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from airflow_hetero_gpu.core.inventory import load_cluster
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.ledger import schema
from airflow_hetero_gpu.ledger.db import make_engine, write_transaction
from airflow_hetero_gpu.ledger.url import parse_url
from airflow_hetero_gpu.testing.captures import write_capture_dir
from airflow_hetero_gpu.testing.demo import enable_mig, small_hosts
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)

MIG_1G = "NVIDIA A100-SXM4-80GB MIG 1g.10gb"


@pytest.fixture
def mig_cluster(tmp_path):
    """node01 and node02 (2 A100s each); GPU0 of each has MIG on: 3g, 2g, 1g, 1g."""
    specs = small_hosts(2, gpus=2)
    for spec in specs:
        enable_mig(spec, 0)
    return load_cluster(write_capture_dir(tmp_path / "captures", specs))


def test_two_jobs_hold_two_instances_of_one_gpu(ledger_db_url, mig_cluster):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:
        a = led.reserve("job-a", mig_cluster, PlanRequest(1, MIG_1G)).decision
        b = led.reserve("job-b", mig_cluster, PlanRequest(1, MIG_1G)).decision
        assert [g.key for g in a.gpus] == [GpuKey("node01", 0, 2)]
        assert [g.key for g in b.gpus] == [GpuKey("node01", 0, 3)]
        assert led.reserved_map() == {GpuKey("node01", 0, 2): "job-a", GpuKey("node01", 0, 3): "job-b"}
        held = led.get("job-a")
        assert held.keys == [GpuKey("node01", 0, 2)] and held.gpus[0].instance == 2
        assert held.gpus[0].uuid == mig_cluster.gpu(("node01", 0, 2)).uuid and held.gpus[0].uuid.startswith("MIG-")
        assert held.to_json()["gpus"] == [{"host": "node01", "index": 0, "uuid": held.gpus[0].uuid, "instance": 2}]
        # the other 1g slices are node02's; a whole-GPU job still never gets a MIG GPU
        assert led.reserve("job-c", mig_cluster, PlanRequest(1, MIG_1G)).decision.keys == [GpuKey("node02", 0, 2)]
        whole = led.reserve("job-d", mig_cluster, PlanRequest(2)).decision
        assert whole.keys == [GpuKey("node01", 1), GpuKey("node02", 1)]  # each host has one whole GPU left
        assert led.reserve("job-e", mig_cluster, PlanRequest(1)).decision is None
        assert led.release("job-a") and GpuKey("node01", 0, 2) not in led.reserved_map()


def test_no_unit_is_held_twice_even_past_the_planner(ledger_db_url, mig_cluster):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:
        led.reserve("job-a", mig_cluster, PlanRequest(1, MIG_1G))
        led.reserve("job-b", mig_cluster, PlanRequest(1, MIG_1G))
    engine = make_engine(parse_url(ledger_db_url))  # a writer of this release, past the planner
    try:
        with pytest.raises(IntegrityError, match="(?i)unique|duplicate"):
            with write_transaction(engine) as conn:  # a second claim of node01 GPU0 MIG 2, written by hand
                conn.execute(insert(schema.reservation_gpus).values(
                    host="node01", gpu_index=0, mig_instance=2, job_id="job-b", slot=1, uuid="MIG-x"))
        with write_transaction(engine) as conn:  # instance 1 of the same GPU is another unit
            conn.execute(insert(schema.reservation_gpus).values(
                host="node01", gpu_index=0, mig_instance=1, job_id="job-b", slot=1, uuid="MIG-y"))
    finally:
        engine.dispose()


def test_an_instance_fault_evicts_its_gpu_and_replacement_stays_in_the_pool(ledger_db_url, mig_cluster):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:
        led.reserve("job-a", mig_cluster, PlanRequest(1, MIG_1G))
        new = led.replace("job-a", GpuKey("node01", 0, 2), mig_cluster, reasons=["xid-79"])
        # not the sibling 1g slice of the faulty GPU: the same profile on node02
        assert new == GpuKey("node02", 0, 2)
        assert led.get("job-a").keys == [GpuKey("node02", 0, 2)]
        assert led.get("job-a").gpus[0].uuid == mig_cluster.gpu(new).uuid
        assert led.evicted_map() == {GpuKey("node01", 0): ("xid-79",)}
        assert led.evictions()[0].uuid == mig_cluster.gpu(("node01", 0)).uuid  # the GPU's, not the slice's
        # an evicted GPU's instances are out of every pool
        assert led.reserve("job-b", mig_cluster, PlanRequest(1, MIG_1G)).decision.keys == [GpuKey("node02", 0, 3)]
        assert led.reserve("job-c", mig_cluster, PlanRequest(1, MIG_1G)).decision is None
        led.evict(("node02", 0, 1), reasons=["ecc"])  # an instance key evicts its GPU
        assert set(led.evicted_map()) == {GpuKey("node01", 0), GpuKey("node02", 0)}


def test_bad_unit_keys_are_one_line_errors(ledger_db_url):  # noqa: F811
    from airflow_hetero_gpu.ledger import LedgerError

    with Ledger.from_url(ledger_db_url) as led:
        for key in (("h", 0, -1), ("h", 0, "1"), ("h", 0, 1, 2)):
            with pytest.raises(LedgerError, match=r"expected \(host, index >= 0\[, MIG instance >= 0\]\)"):
                led.evict(key)
