"""The ledger's schema: versioned upgrades keep reservations; concurrent first use does not race."""

from __future__ import annotations

import itertools
import multiprocessing
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    ForeignKey,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    create_engine,
    insert,
    inspect,
    select,
)

from airflow_hetero_gpu.core.cluster import build_cluster
from airflow_hetero_gpu.core.model import Gpu, GpuKey, PlanRequest
from airflow_hetero_gpu.core.topology import HostWiring
from airflow_hetero_gpu.ledger import Ledger, LedgerError
from airflow_hetero_gpu.ledger import migrations, schema
from airflow_hetero_gpu.ledger.db import make_engine, write_transaction
from airflow_hetero_gpu.ledger.url import parse_url
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)

A100 = "NVIDIA A100-SXM4-80GB"


def make_cluster(hosts: int = 2, per_host: int = 8):
    gpus = [Gpu(f"h{h}", i, f"GPU-h{h}-{i}", A100, 81920, 0, 0.0) for h in range(hosts) for i in range(per_host)]
    nv = {pair: "NV12" for pair in itertools.combinations(range(per_host), 2)}
    return build_cluster(gpus, {f"h{h}": HostWiring.from_links(range(per_host), nv) for h in range(hosts)})


def version_1_by_hand(url: str, now: datetime) -> None:
    """The version-1 layout written without the ledger's code, holding one reservation and one eviction."""
    m = MetaData()
    version = Table("schema_version", m, Column("version", Integer, primary_key=True, autoincrement=False),
                    Column("description", String(200), nullable=False),
                    Column("applied_at", DateTime(timezone=True), nullable=False))
    res = Table("reservations", m,
                Column("job_id", String(250), primary_key=True), Column("pool", String(500), nullable=False),
                Column("gpu_count", Integer, nullable=False), Column("score", JSON, nullable=False),
                Column("created_at", DateTime(timezone=True), nullable=False),
                Column("renewed_at", DateTime(timezone=True), nullable=False),
                Column("expires_at", DateTime(timezone=True), nullable=False, index=True))
    gpus = Table("reservation_gpus", m,
                 Column("host", String(250), nullable=False), Column("gpu_index", Integer, nullable=False),
                 Column("job_id", String(250), ForeignKey("reservations.job_id", ondelete="CASCADE"),
                        nullable=False, index=True),
                 Column("slot", Integer, nullable=False), Column("uuid", String(250)),
                 PrimaryKeyConstraint("host", "gpu_index", name="pk_reservation_gpus"))
    ev = Table("evictions", m,
               Column("host", String(250), nullable=False), Column("gpu_index", Integer, nullable=False),
               Column("uuid", String(250)), Column("reasons", JSON, nullable=False),
               Column("evicted_at", DateTime(timezone=True), nullable=False),
               PrimaryKeyConstraint("host", "gpu_index", name="pk_evictions"))
    engine = create_engine(parse_url(url))
    try:
        with engine.begin() as conn:
            m.create_all(conn)
            conn.execute(insert(version).values(version=1, description="v1", applied_at=now))
            conn.execute(insert(res).values(job_id="old-job", pool=A100, gpu_count=2,
                                            score={"load_balance": 1.0, "total": 0.8}, created_at=now,
                                            renewed_at=now, expires_at=now + timedelta(hours=1)))
            conn.execute(insert(gpus), [{"host": "h0", "gpu_index": i, "job_id": "old-job", "slot": i,
                                         "uuid": f"GPU-h0-{i}"} for i in (0, 1)])
            conn.execute(insert(ev).values(host="h1", gpu_index=7, uuid="GPU-h1-7", reasons=["ecc"], evicted_at=now))
    finally:
        engine.dispose()


def test_upgrade_from_version_1_keeps_reservations_and_evictions(ledger_db_url):  # noqa: F811
    now = datetime.now(timezone.utc).replace(microsecond=0)
    version_1_by_hand(ledger_db_url, now)
    cluster = make_cluster()
    with Ledger.from_url(ledger_db_url) as led:
        assert led.schema_version() == migrations.LATEST == 11
        old = led.get("old-job")
        assert old is not None
        assert old.keys == [GpuKey("h0", 0), GpuKey("h0", 1)] and old.gpus[1].uuid == "GPU-h0-1"
        assert old.created_at == now and old.expires_at == now + timedelta(hours=1)
        assert old.identity is None and old.request is None and old.score["total"] == 0.8
        assert led.evicted_map() == {GpuKey("h1", 7): ("ecc",)}
        assert led.evictions()[0].healthy_checks == 0
        # the upgraded ledger plans around what it kept, and the kept rows work like new ones
        assert led.reserve("new-job", cluster, PlanRequest(14)).decision is None  # 16 - 2 held - 1 evicted
        new = led.reserve("new-job", cluster, PlanRequest(13))
        assert new.decision is not None
        assert {GpuKey("h0", 0), GpuKey("h0", 1), GpuKey("h1", 7)}.isdisjoint(new.decision.keys)
        assert led.renew("old-job", 60).expires_at > now
        assert led.record_check(("h1", 7), True, readmit_after=1) is None
        assert led.release("old-job") is True
    with Ledger.from_url(ledger_db_url) as led:  # opening again changes nothing
        assert led.schema_version() == 11
        assert [r.job_id for r in led.live_reservations()] == ["new-job"]


def test_fresh_schema_matches_the_tables_the_code_queries(ledger_db_url):  # noqa: F811
    Ledger.from_url(ledger_db_url).close()
    engine = create_engine(parse_url(ledger_db_url))
    try:
        with engine.connect() as conn:
            insp = inspect(conn)
            for table in schema.metadata.sorted_tables:
                cols = {c["name"]: c for c in insp.get_columns(table.name)}
                assert list(cols) == [c.name for c in table.columns], table.name
                for c in table.columns:
                    assert cols[c.name]["nullable"] == c.nullable, (table.name, c.name)
                assert insp.get_pk_constraint(table.name)["constrained_columns"] == [c.name for c in table.primary_key]
            uniques = insp.get_unique_constraints("reservation_gpus")
            assert [u["column_names"] for u in uniques] == [["job_id", "slot"]]
            applied = conn.execute(select(schema.schema_version.c.version).order_by("version")).scalars().all()
            assert applied == list(range(1, 12))
    finally:
        engine.dispose()


def test_a_newer_schema_is_refused(ledger_db_url):  # noqa: F811
    Ledger.from_url(ledger_db_url).close()
    engine = make_engine(parse_url(ledger_db_url), writes_schema=99)  # a future release's writer
    try:
        with write_transaction(engine) as conn:
            conn.execute(insert(schema.schema_version).values(version=99, description="future",
                                                              applied_at=datetime.now(timezone.utc)))
    finally:
        engine.dispose()
    with pytest.raises(LedgerError, match="schema version 99, newer than"):
        Ledger.from_url(ledger_db_url)


def _first_use(url: str, idx: int, barrier, conn) -> None:
    try:
        barrier.wait(60)
        with Ledger.from_url(url) as led:
            result = led.reserve(f"job-{idx}", make_cluster(), PlanRequest(1))
            conn.send(None if result.decision else "no decision")
    except BaseException as err:  # noqa: BLE001 - reported to the parent
        conn.send(repr(err))


def test_concurrent_first_use_creates_the_schema_once(ledger_db_url):  # noqa: F811
    """16 processes open an empty database at the same instant; all of them work."""
    ctx = multiprocessing.get_context("fork")
    n = 16
    barrier = ctx.Barrier(n)
    pipes = [ctx.Pipe(duplex=False) for _ in range(n)]
    procs = [ctx.Process(target=_first_use, args=(ledger_db_url, i, barrier, pipes[i][1])) for i in range(n)]
    for p in procs:
        p.start()
    try:
        outcomes = [pipes[i][0].recv() if pipes[i][0].poll(120) else "timeout" for i in range(n)]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert outcomes == [None] * n
    with Ledger.from_url(ledger_db_url) as led:
        assert len(led.live_reservations()) == n
        assert len(led.reserved_map()) == n
        engine = create_engine(parse_url(ledger_db_url))
        try:
            with engine.connect() as conn:
                assert conn.execute(select(schema.schema_version.c.version)).scalars().all() == list(range(1, migrations.LATEST + 1))
        finally:
            engine.dispose()


def test_a_new_sqlite_file_held_by_another_process_is_waited_for(tmp_path, monkeypatch):
    """Switching a new file to WAL needs its exclusive lock; while another connection holds the
    file's reserved lock SQLite refuses at once rather than waiting. The ledger retries until the
    holder lets go, instead of failing its first use."""
    import sqlite3
    import threading

    from airflow_hetero_gpu.ledger import db as ledger_db

    path = tmp_path / "ledger.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE held (x)")  # a real file, still in rollback-journal mode
    holder.execute("BEGIN IMMEDIATE")  # the reserved lock: the pragma's wait is not offered
    retried = threading.Event()
    real_sleep = ledger_db.time.sleep

    def sleep(seconds: float) -> None:
        retried.set()
        real_sleep(seconds)

    monkeypatch.setattr(ledger_db.time, "sleep", sleep)
    outcome: list = []

    def first_use() -> None:
        try:
            with Ledger.from_url(f"sqlite:///{path}") as led:
                outcome.append(led.schema_version())
        except BaseException as err:  # noqa: BLE001 - reported to the test
            outcome.append(err)

    opener = threading.Thread(target=first_use)
    opener.start()
    try:
        # Either the opener retries (then the lock is let go) or it has already given up.
        while not retried.wait(0.05) and opener.is_alive():
            pass
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        opener.join(120)
    assert outcome == [migrations.LATEST]
