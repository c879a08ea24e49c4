"""A rolling upgrade on real SQLite and PostgreSQL: a process of the previous release (schema 10,
installed from git into a temporary directory and run with this venv's python) opens the
ledger, this release upgrades it beside it, and every write the old process then tries — a
reservation, an enqueue, a release — is refused in one line by the ledger's
writers' guard, with nothing written. A process of this release is refused the same way by a
ledger a newer release upgraded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import io
from pathlib import Path

import pytest
from sqlalchemy import insert, select

from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger, migrations, schema
from airflow_hetero_gpu.ledger import guard
from airflow_hetero_gpu.ledger.db import make_engine, write_transaction
from airflow_hetero_gpu.ledger import LedgerUpgraded
from airflow_hetero_gpu.ledger.url import parse_url
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)
from test_ledger_queue import fill

pytestmark = pytest.mark.slow  # processes of the previous release: left out of make test-fast

#: The last release before schema step 11 (schema version 10).
OLD_RELEASE = "f2f4a94f0bbd7603f768f06ea458fcf3624f6447"
REPO = Path(__file__).resolve().parents[1]

#: The old process: opens the ledger, leaves a preemption record open (its leave_queue bug),
#: says so, then on each command line tries one write and answers with what happened.
OLD_PROCESS = r'''
import json, sys
import airflow_hetero_gpu
from airflow_hetero_gpu.collect.freshness import FreshInventory
from airflow_hetero_gpu.core.admission import PreemptionRules
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger, migrations
from airflow_hetero_gpu.ledger.inventory import HostRecord
from airflow_hetero_gpu.testing.captures import host_files
from airflow_hetero_gpu.testing.demo import small_hosts

def say(**kw):
    print(json.dumps(kw), flush=True)

led = Ledger.from_url(sys.argv[1])
led.preemption = PreemptionRules(min_runtime_s=0, delay_s=0)
led.store_collection([HostRecord(s.name, True, host_files(s)) for s in small_hosts(2, gpus=8)], collector="old")
assert led.enqueue("keep", PlanRequest(8), priority=0, lease_seconds=3600).admitted
led.take_admission("keep")
assert led.enqueue("lo", PlanRequest(8), priority=1, lease_seconds=3600, preemptible=True).admitted
hi = led.enqueue("hi", PlanRequest(8), priority=5, lease_seconds=3600)
marked = led.get("lo").preempting is not None
led.leave_queue("lo")  # this release leaves lo's record open
assert led.queue_entry("hi").admitted
led.leave_queue("hi")  # a host free again: the writes below would place there
say(package=airflow_hetero_gpu.__file__, latest=migrations.LATEST, version=led.schema_version(), marked=marked,
    open=[p["victim"] for p in led.preemptions() if p["state"] == "in progress"])
cluster = FreshInventory(led.inventory(), float("inf")).cluster()
for line in sys.stdin:
    what = line.strip()
    try:
        if what == "reserve":
            got = led.reserve("old-job", cluster, PlanRequest(8), lease_seconds=3600)
            say(what=what, ok=True, decision=got.decision is not None)
        elif what == "enqueue":
            got = led.enqueue("old-queued", PlanRequest(2), lease_seconds=3600)
            say(what=what, ok=True, state=got.state)
        elif what == "release":
            say(what=what, ok=True, freed=led.release("keep"))
        else:
            break
    except Exception as err:
        say(what=what, ok=False, error=f"{type(err).__name__}: {err}")
led.close()
'''


@pytest.fixture(scope="module")
def old_release(tmp_path_factory) -> Path:
    """The previous release's package, from git, in a directory of its own."""
    out = tmp_path_factory.mktemp("old-release")
    try:
        tar = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", OLD_RELEASE, "airflow_hetero_gpu"],
                             check=True, capture_output=True, timeout=120).stdout
    except subprocess.CalledProcessError as err:
        pytest.fail(f"the previous release {OLD_RELEASE} is not in this repository's history "
                    f"(a shallow clone? fetch it): {err.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(out, filter="data")
    return out


def _tables(url: str) -> dict[str, list]:
    """Every row of every ledger table, as this release reads them."""
    with Ledger.open_existing(url) as led, led._read("dump") as (conn, _now):
        return {t.name: sorted(map(repr, conn.execute(select(t)).all())) for t in schema.metadata.sorted_tables}


def _ask(proc: subprocess.Popen, what: str) -> dict:
    proc.stdin.write(what + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    assert line, f"the old process ended: {proc.stderr.read()}"
    return json.loads(line)


def test_an_old_release_that_opened_the_ledger_before_the_upgrade_is_refused_every_write(
        ledger_db_url, old_release, tmp_path):  # noqa: F811
    env = {**os.environ, "PYTHONPATH": str(old_release)}
    proc = subprocess.Popen([sys.executable, "-c", OLD_PROCESS, ledger_db_url], cwd=tmp_path, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        opened = json.loads(proc.stdout.readline() or json.dumps({"error": proc.stderr.read()}))
        assert opened.get("package", "").startswith(str(old_release)), opened  # the old code, not this tree
        assert (opened["latest"], opened["version"]) == (10, 10)
        assert opened["marked"] and opened["open"] == ["lo"]  # the old release's leave_queue left it open
        with Ledger.from_url(ledger_db_url) as new:  # this release upgrades the ledger beside it
            assert new.schema_version() == migrations.LATEST >= 11
            [record] = new.preemptions()
            assert record["victim"] == "lo" and record["state"] == "abandoned"  # step 11 closed it
        before = _tables(ledger_db_url)
        answers = [_ask(proc, what) for what in ("reserve", "enqueue", "release")]
    finally:
        proc.stdin.close()
        proc.wait(60)
    for answer in answers:
        assert answer["ok"] is False, answer
        error = answer["error"]
        assert "\n" not in error and error.startswith("LedgerError: "), error
        assert "ledger schema version 11 refuses writes from a process of an older airflow-hetero-gpu" in error
        assert "writes schema 10 or older" in error and "restart it with the new package" in error
    assert _tables(ledger_db_url) == before  # nothing written by it
    with Ledger.from_url(ledger_db_url) as new:  # this release writes on
        assert new.get("old-job") is None and new.queue_entry("old-queued") is None
        assert new.release("keep")


def test_this_release_is_refused_by_a_ledger_a_newer_release_upgraded(ledger_db_url):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:
        fill(led)
        assert led.enqueue("a", PlanRequest(2), lease_seconds=600).admitted
        newer = migrations.LATEST + 1
        engine = make_engine(parse_url(ledger_db_url), writes_schema=newer)  # the newer release's upgrade
        try:
            with write_transaction(engine) as conn:
                conn.execute(insert(schema.schema_version).values(version=newer, description="a newer step",
                                                                  applied_at=led.now()))
                guard.install(conn, newer)
        finally:
            engine.dispose()
        before = _tables_any(ledger_db_url)
        with pytest.raises(LedgerUpgraded) as err:
            led.enqueue("b", PlanRequest(2), lease_seconds=600)
        line = str(err.value)
        assert "\n" not in line and f"the ledger has schema version {newer}, newer than this process of " \
            f"airflow-hetero-gpu writes ({migrations.LATEST})" in line and "restart it with the new package" in line
        with pytest.raises(LedgerUpgraded):
            led.release("a")
        assert _tables_any(ledger_db_url) == before
        assert led.get("a") is not None  # reads go on


def _tables_any(url: str) -> dict[str, list]:
    engine = make_engine(parse_url(url))
    try:
        with engine.connect() as conn:
            return {t.name: sorted(map(repr, conn.execute(select(t)).all())) for t in schema.metadata.sorted_tables}
    finally:
        engine.dispose()


def test_every_table_is_guarded_for_the_version_reached(ledger_db_url):  # noqa: F811
    """A fresh ledger and one upgraded step by step end with the guard on every table; an upgrade
    from an unguarded version installs it, and a writer that declares nothing is refused."""
    from datetime import datetime, timezone

    from sqlalchemy import create_engine

    engine = create_engine(parse_url(ledger_db_url))  # a writer that declares no release
    try:
        with engine.begin() as conn:  # a ledger as the previous release left it
            migrations.upgrade(conn, datetime.now(timezone.utc), target=10)
            assert guard.installed(conn) == {}
        with Ledger.from_url(ledger_db_url) as led, led._read("guards") as (conn, _now):
            per_table = 3 if conn.dialect.name == "sqlite" else 1  # row triggers per operation, or one
            assert guard.installed(conn) == {t.name: per_table for t in schema.metadata.sorted_tables}
        with pytest.raises(Exception, match=f"ledger schema version {migrations.LATEST} refuses writes"), engine.begin() as conn:
            conn.execute(insert(schema.team_settings).values(key="x", value=1))
    finally:
        engine.dispose()
