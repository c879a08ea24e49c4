"""The parsed ``query.csv`` kept beside its text in the ledger (``inventory_hosts.facts``): the same
rows as parsing the text, for every real output; readers use them; rows without them, or with
facts of another layout, are parsed from the text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select, update

from airflow_hetero_gpu.capture.facts import LAYOUT, VERSION, query_facts, query_from_facts
from airflow_hetero_gpu.capture.query import parse_query_csv
from airflow_hetero_gpu.errors import CaptureError
from airflow_hetero_gpu.ledger import Ledger, LedgerError, schema
from airflow_hetero_gpu.ledger.inventory import HostRecord
from airflow_hetero_gpu.ledger.url import parse_url
from airflow_hetero_gpu.testing.captures import host_files
from airflow_hetero_gpu.testing.demo import small_hosts
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)
from shared_data import shared_data

LOCAL = Path(__file__).resolve().parent / "data" / "nvidia-smi"
SHARED_QUERY = shared_data() / "nvidia-smi" / "query"


def _real_outputs() -> list[Path]:
    found = sorted(LOCAL.glob("query-*.csv"))
    if SHARED_QUERY.is_dir():  # a missing collection is a failure under CI (tests/ci_skips.py)
        found += sorted(p for p in SHARED_QUERY.rglob("*") if p.is_file() and p.suffix in (".csv", ".txt"))
    return found


def test_facts_rebuild_exactly_what_parsing_gave_for_every_real_output():
    if not SHARED_QUERY.is_dir():
        pytest.skip(f"real nvidia-smi samples not present at {SHARED_QUERY}")
    checked, kinds = 0, set()
    for path in _real_outputs():
        try:
            parsed = parse_query_csv(path.read_text(encoding="utf-8"), str(path))
        except CaptureError:
            continue  # not a query output the reader accepts (its own tests say why)
        facts = json.loads(json.dumps(query_facts(parsed)))  # as the JSON column returns them
        rebuilt = query_from_facts(facts)
        assert rebuilt == parsed, path.name
        assert [hash(r) for r in rebuilt.rows] == [hash(r) for r in parsed.rows], path.name
        checked += 1
        kinds.update({"rows"} if parsed.rows else set(), {"lost"} if parsed.lost else set(),
                     {"host error"} if parsed.host_error else set())
    assert checked >= 15 and kinds == {"rows", "lost", "host error"}, (checked, kinds)


def test_facts_of_another_version_or_layout_are_not_used():
    text = (LOCAL / "query-gpu-allfields-h100-80gb-hbm3-load.csv").read_text(encoding="utf-8")
    facts = json.loads(json.dumps(query_facts(parse_query_csv(text, "q"))))
    assert query_from_facts(facts) is not None
    assert query_from_facts({**facts, "v": VERSION + 1}) is None
    assert query_from_facts({**facts, "fields": LAYOUT[:-1]}) is None  # a QueryRow of another version
    assert query_from_facts(None) is None and query_from_facts({}) is None


def _records(specs):
    return [HostRecord(s.name, True, host_files(s)) for s in specs]


def _set_facts(url: str, host: str, facts) -> None:
    from airflow_hetero_gpu.ledger.db import make_engine, write_transaction

    engine = make_engine(parse_url(url))  # a writer of this release
    try:
        with write_transaction(engine) as conn:
            conn.execute(update(schema.inventory_hosts).where(schema.inventory_hosts.c.host == host)
                         .values(facts=facts))
    finally:
        engine.dispose()


def _facts(url: str) -> dict:
    engine = create_engine(parse_url(url))
    try:
        with engine.connect() as conn:
            return dict(conn.execute(select(schema.inventory_hosts.c.host, schema.inventory_hosts.c.facts)).all())
    finally:
        engine.dispose()


def test_the_ledger_stores_facts_with_each_text_and_readers_rebuild_from_them(ledger_db_url):  # noqa: F811
    specs = small_hosts(3, gpus=2)
    with Ledger.from_url(ledger_db_url) as led:
        led.store_collection(_records(specs), collector="test collector")
    stored = _facts(ledger_db_url)
    for s in specs:
        assert query_from_facts(stored[s.name]) == parse_query_csv(host_files(s)["query.csv"], "q")

    # the reader takes the rows from the facts, not from the text: facts saying 77 % (a
    # stand-in that no text says) are what the planner's GPUs show
    changed = json.loads(json.dumps(stored["node02"]))
    changed["rows"][0][LAYOUT.index("utilization_pct")] = 77.0
    _set_facts(ledger_db_url, "node02", changed)
    with Ledger.open_existing(ledger_db_url) as led:
        caps = led.inventory().captures()
    assert caps.hosts["node02"].query.rows[0].utilization_pct == 77.0
    assert caps.hosts["node01"].query == parse_query_csv(host_files(specs[0])["query.csv"], "q")


def test_rows_without_facts_or_with_foreign_ones_are_parsed_from_their_text(ledger_db_url):  # noqa: F811
    """A row stored before schema step 7 has NULL facts; facts of another layout are ignored;
    the next stored collection of the host writes facts again."""
    specs = small_hosts(2, gpus=2)
    with Ledger.from_url(ledger_db_url) as led:
        led.store_collection(_records(specs), collector="test collector")
    _set_facts(ledger_db_url, "node01", None)
    foreign = {**_facts(ledger_db_url)["node02"], "fields": ["index", "name"]}
    _set_facts(ledger_db_url, "node02", foreign)
    with Ledger.open_existing(ledger_db_url) as led:
        caps = led.inventory().captures()
    for s in specs:
        assert caps.hosts[s.name].query == parse_query_csv(host_files(s)["query.csv"], "q")
    with Ledger.from_url(ledger_db_url) as led:  # a failed collection keeps the text, and now has facts
        led.store_collection([HostRecord("node01", False, {}, "ssh: timed out"),
                              HostRecord("node02", True, host_files(specs[1]))], collector="test collector")
    stored = _facts(ledger_db_url)
    assert query_from_facts(stored["node01"]) == parse_query_csv(host_files(specs[0])["query.csv"], "q")
    assert query_from_facts(stored["node02"]) == parse_query_csv(host_files(specs[1])["query.csv"], "q")


def test_an_unreadable_text_is_refused_in_one_line_and_nothing_is_stored(ledger_db_url):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:
        with pytest.raises(LedgerError, match=r"^ledger inventory of host node01/query.csv:1: header lacks"):
            led.store_collection([HostRecord("node01", True, {"query.csv": "index, name\n0, x\n"})],
                                 collector="test collector")
    assert _facts(ledger_db_url) == {}
