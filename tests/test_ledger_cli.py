"""Ledger URLs and the ledger's ``hetero-gpu`` sub-commands."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from airflow_hetero_gpu.cli.app import main
from airflow_hetero_gpu.core.cluster import build_cluster
from airflow_hetero_gpu.core.model import Gpu, GpuKey, PlanRequest
from airflow_hetero_gpu.core.topology import HostWiring
from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.ledger import Ledger, LedgerUrlError, default_url, parse_url
from airflow_hetero_gpu.cli.ledger import parse_gpu_target, reserve_for_cli
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)


def make_cluster():
    gpus = [Gpu(f"h{h}", i, f"GPU-h{h}-{i}", "NVIDIA A100-SXM4-80GB", 81920, 0, 0.0) for h in range(2) for i in range(4)]
    nv = {pair: "NV12" for pair in itertools.combinations(range(4), 2)}
    return build_cluster(gpus, {f"h{h}": HostWiring.from_links(range(4), nv) for h in range(2)})


# --- URLs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("given, expected", [
    ("postgresql://u:pw@db.example:5432/ledger", "postgresql+psycopg://u:pw@db.example:5432/ledger"),
    ("postgres://u@db/ledger", "postgresql+psycopg://u@db/ledger"),
    ("postgresql+psycopg://u@db/ledger", "postgresql+psycopg://u@db/ledger"),
    ("postgresql+psycopg2://u@db/ledger", "postgresql+psycopg2://u@db/ledger"),
    ("sqlite:////var/lib/ledger.db", "sqlite:////var/lib/ledger.db"),
    ("sqlite://", "sqlite://"),
    ("/var/lib/ledger.db", "sqlite:////var/lib/ledger.db"),
])
def test_urls_are_mapped_to_their_driver(given, expected):
    assert parse_url(given).render_as_string(hide_password=False) == expected


@pytest.mark.parametrize("given, message", [
    ("mysql://u@db/ledger", "unsupported database 'mysql'"),
    ("postgresql://u@db", "names no database"),
    ("postgresql:ledger", "malformed"),
    ("db.example:5432/ledger", "malformed"),
    ("sqlite:/tmp/x.db", "malformed"),
    ("postgresql://u:secret@db:notaport/x", "malformed"),
])
def test_bad_urls_are_one_line_errors_naming_the_value(given, message):
    with pytest.raises(LedgerUrlError, match=message) as err:
        parse_url(given)
    assert "\n" not in str(err.value)
    assert "secret" not in str(err.value)


def test_default_ledger_lives_under_airflow_home(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "af"))
    assert default_url() == f"sqlite:///{tmp_path}/af/hetero_gpu_ledger.db"
    with Ledger.from_url(None) as led:  # creates the directory and the file
        assert led.dialect == "sqlite"
    assert (tmp_path / "af" / "hetero_gpu_ledger.db").is_file()
    monkeypatch.delenv("AIRFLOW_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_url() == f"sqlite:///{tmp_path}/home/airflow/hetero_gpu_ledger.db"


def test_sqlite_uses_wal(tmp_path):
    with Ledger.from_url(f"sqlite:///{tmp_path}/l.db") as led:
        led.expire()
    assert (tmp_path / "l.db-wal").exists() or (tmp_path / "l.db").is_file()
    import sqlite3

    con = sqlite3.connect(tmp_path / "l.db")
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        con.close()


def test_in_memory_ledger_works_for_one_process():
    with Ledger.from_url("sqlite://") as led:
        assert led.reserve("j", make_cluster(), PlanRequest(2)).decision is not None
        assert len(led.reserved_map()) == 2


def test_unreachable_postgres_is_a_one_line_error():
    with pytest.raises(HeteroGpuError, match=r"ledger postgresql\+psycopg://u:\*\*\*@127.0.0.1:1/x") as err:
        Ledger.from_url("postgresql://u:pw@127.0.0.1:1/x")
    assert "\n" not in str(err.value) and "pw" not in str(err.value)


# --- HOST[:INDEX] ------------------------------------------------------------------------------
@pytest.mark.parametrize("given, expected", [("dgx-a", ("dgx-a", None)), ("dgx-a:3", ("dgx-a", 3)),
                                             ("10.0.0.7:0", ("10.0.0.7", 0))])
def test_gpu_targets(given, expected):
    assert parse_gpu_target(given) == expected


@pytest.mark.parametrize("given", ["", ":3", "dgx-a:", "dgx-a:x", "dgx-a:-1", "dgx a:1"])
def test_bad_gpu_targets_name_the_value(given):
    with pytest.raises(HeteroGpuError, match="HOST:INDEX") as err:
        parse_gpu_target(given)
    assert repr(given) in str(err.value)


# --- the sub-commands ----------------------------------------------------------------------------
def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_reserve_for_cli_then_reservations_and_release(ledger_db_url, capsys):  # noqa: F811
    cluster = make_cluster()
    result = reserve_for_cli(ledger_db_url, "job-7", cluster, PlanRequest(3), cluster.config)
    assert result.decision is not None
    assert reserve_for_cli(ledger_db_url, "job-8", cluster, PlanRequest(6), cluster.config).decision is None

    code, out, _ = run(capsys, "reservations", "--ledger", ledger_db_url, "--json")
    assert code == 0
    listed = json.loads(out)
    assert [r["job_id"] for r in listed] == ["job-7"]
    assert [(g["host"], g["index"]) for g in listed[0]["gpus"]] == [tuple(k) for k in result.decision.keys]
    assert listed[0]["score"] == result.decision.score.to_json()

    code, out, _ = run(capsys, "reservations", "--ledger", ledger_db_url)
    assert code == 0 and "job-7" in out and "h0:0 h0:1 h0:2" in out

    code, out, _ = run(capsys, "release", "--job-id", "job-7", "--ledger", ledger_db_url)
    assert code == 0 and "released job 'job-7'" in out
    code, out, _ = run(capsys, "release", "--job-id", "job-7", "--ledger", ledger_db_url)
    assert code == 0 and "nothing to release" in out
    code, out, _ = run(capsys, "reservations", "--ledger", ledger_db_url)
    assert code == 0 and "no live reservations" in out


def test_uncordon_and_evictions(ledger_db_url, capsys):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:
        led.evict(("h0", 1), "GPU-h0-1", ["ecc"])
        led.evict(("h1", 2), "GPU-h1-2", ["xid-79"])
        led.evict(("h1", 3), "GPU-h1-3", ["lost"])
    code, out, _ = run(capsys, "evictions", "--ledger", ledger_db_url, "--json")
    assert code == 0 and [(e["host"], e["index"], e["reasons"]) for e in json.loads(out)] == [
        ("h0", 1, ["ecc"]), ("h1", 2, ["xid-79"]), ("h1", 3, ["lost"])]
    code, out, _ = run(capsys, "uncordon", "h0:1", "--ledger", ledger_db_url)
    assert code == 0 and "readmitted: h0:1" in out
    code, out, _ = run(capsys, "uncordon", "h1", "--ledger", ledger_db_url)
    assert code == 0 and "readmitted: h1:2, h1:3" in out
    code, out, _ = run(capsys, "uncordon", "h1", "--ledger", ledger_db_url)
    assert code == 0 and "nothing to do" in out
    code, out, _ = run(capsys, "evictions", "--ledger", ledger_db_url)
    assert code == 0 and "no evicted GPUs" in out
    with Ledger.from_url(ledger_db_url) as led:
        assert led.evicted_map() == {}


def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/l.db"
    code, _, err = run(capsys, "uncordon", "h0:x", "--ledger", url)
    assert code == 2 and "'h0:x'" in err and err.count("\n") == 1
    code, _, err = run(capsys, "release", "--job-id", "j", "--ledger", "mysql://db/x")
    assert code == 2 and "unsupported database 'mysql'" in err and err.count("\n") == 1
    code, _, err = run(capsys, "reservations", "--ledger", "sqlite:/nope")
    assert code == 2 and "'sqlite:/nope'" in err


def test_cli_ledger_defaults_to_airflow_home(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    cluster = make_cluster()
    reserve_for_cli(None, "j", cluster, PlanRequest(1), None)
    code, out, _ = run(capsys, "reservations", "--json")
    assert code == 0 and [r["job_id"] for r in json.loads(out)] == ["j"]
    assert Path(tmp_path / "hetero_gpu_ledger.db").is_file()
    with Ledger.from_url(None) as led:
        assert led.reserved_map() == {GpuKey("h0", 0): "j"}


SAMPLE = Path(__file__).resolve().parents[1] / "airflow_hetero_gpu" / "samples" / "cluster"


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="the shipped sample capture directory is absent")
def test_plan_reserve_exits_0_then_3_when_the_gpus_are_taken(ledger_db_url, capsys):  # noqa: F811
    args = ["plan", "--captures", str(SAMPLE), "--gpus", "8", "--gpu-type", "A100*", "--reserve",
            "--ledger", ledger_db_url, "--json"]
    code, out, _ = run(capsys, *args, "--job-id", "first")
    assert code == 0
    placed = json.loads(out)["decision"]
    code, out, _ = run(capsys, *args, "--job-id", "second")
    assert code == 3 and json.loads(out)["decision"] is None
    code, out, _ = run(capsys, *args, "--job-id", "first")  # a retry gets its own GPUs back
    assert code == 0 and json.loads(out)["decision"]["gpus"] == placed["gpus"]
    with Ledger.from_url(ledger_db_url) as led:
        assert [r.job_id for r in led.live_reservations()] == ["first"]
        assert led.get("first").keys == [GpuKey(g["host"], g["index"]) for g in placed["gpus"]]


def test_missing_postgres_binaries_give_a_skip_reason(monkeypatch):
    from airflow_hetero_gpu.testing import postgres

    monkeypatch.delenv("HETERO_GPU_PG_BIN", raising=False)
    monkeypatch.setattr(postgres.shutil, "which", lambda name: None)
    monkeypatch.setattr(postgres.glob, "glob", lambda pattern: [])
    with pytest.raises(postgres.PostgresUnavailable, match="apt-get install -y postgresql"):
        postgres.find_bin_dir()


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="the shipped sample capture directory is absent")
def test_plan_and_pools_with_a_ledger_count_live_leases_and_evictions_only(ledger_db_url, capsys):  # noqa: F811
    """`plan --ledger` / `pools --ledger` plan against the ledger without writing to it: a live
    reservation holds its GPUs, an expired lease holds nothing, an eviction takes a GPU out."""
    import time

    args = ["--captures", str(SAMPLE), "--ledger", ledger_db_url, "--json"]
    code, out, _ = run(capsys, "plan", *args, "--gpus", "8", "--gpu-type", "A100*", "--reserve", "--job-id", "holder",
                       "--lease", "1")
    assert code == 0
    code, out, _ = run(capsys, "pools", *args)
    a100 = next(p for p in json.loads(out) if "A100" in p["card_type"])
    assert a100["available"] == 12 - 8  # 12 available in the sample, 8 held by "holder"
    with Ledger.from_url(ledger_db_url) as led:
        led.evict(("a100-1", 3), reasons=["ecc"])
    time.sleep(1.5)  # the lease runs out; nobody calls expire()
    code, out, _ = run(capsys, "pools", *args)
    a100 = next(p for p in json.loads(out) if "A100" in p["card_type"])
    assert a100["available"] == 12 - 1 and a100["healthy"] == 15 - 1
    with Ledger.from_url(ledger_db_url) as led:
        assert led.live_reservations() == []


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="the shipped sample capture directory is absent")
def test_a_lease_past_365_days_is_one_line_and_reserves_nothing(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    code, _, err = run(capsys, "plan", "--captures", str(SAMPLE), "--gpus", "1", "--reserve", "--job-id", "j",
                       "--ledger", url, "--lease", str(10 ** 13))
    assert code == 2 and err.count("\n") == 1 and "lease_seconds: expected a positive number of seconds, at most " \
        "31536000 (365 days), got 10000000000000" in err, err
    with Ledger.from_url(url) as led:
        assert led.live_reservations() == []


# --- the tasks' ledger by default ----------------------------------------------------------------
def _cli(env: dict, *argv: str):
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__HETERO_GPU__", "AIRFLOW_CONFIG"))}
    clean["PYTHONPATH"] = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", *argv], env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


def test_queue_with_only_the_ledger_url_setting_reads_that_ledger(tmp_path):
    """As after sourcing the emulated cluster's airflow.env: the task's ledger, not $AIRFLOW_HOME's."""
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    with Ledger.from_url(url) as led:
        led.enqueue("waits-here", PlanRequest(4))
    home = tmp_path / "home"
    home.mkdir()
    done = _cli({"AIRFLOW_HOME": str(home), "AIRFLOW__HETERO_GPU__LEDGER_URL": url}, "queue")
    assert done.returncode == 0, done.stderr
    assert "waits-here" in done.stdout
    assert done.stderr == f"hetero-gpu queue: ledger {url} (from AIRFLOW__HETERO_GPU__LEDGER_URL; --ledger URL " \
                          "for another)\n"
    assert list(home.iterdir()) == []  # nothing opened or created under $AIRFLOW_HOME
    done = _cli({"AIRFLOW_HOME": str(home), "AIRFLOW__HETERO_GPU__LEDGER_URL": url}, "queue", "--ledger",
                f"sqlite:///{tmp_path / 'other.db'}")
    assert done.returncode == 2 and "other.db" in done.stderr and "from AIRFLOW" not in done.stderr  # --ledger wins


def test_the_ledger_url_of_airflow_cfg_and_the_fallback(tmp_path):
    url = f"sqlite:///{tmp_path / 'cfg.db'}"
    with Ledger.from_url(url) as led:
        led.reserve("held", make_cluster(), PlanRequest(1))
    home = tmp_path / "home"
    home.mkdir()
    (home / "airflow.cfg").write_text(f"[core]\ndags_folder = {{AIRFLOW_HOME}}/dags\n[hetero_gpu]\nledger_url = {url}\n")
    done = _cli({"AIRFLOW_HOME": str(home)}, "reservations", "--json")
    assert done.returncode == 0 and [r["job_id"] for r in json.loads(done.stdout)] == ["held"], done.stderr
    assert f"(from [hetero_gpu] ledger_url in {home / 'airflow.cfg'};" in done.stderr
    (home / "airflow.cfg").write_text("[core]\n")
    done = _cli({"AIRFLOW_HOME": str(home)}, "queue")
    assert done.returncode == 2 and done.stderr.splitlines()[0] == (
        f"hetero-gpu queue: ledger sqlite:///{home / 'hetero_gpu_ledger.db'} (the default: no [hetero_gpu] "
        "ledger_url is set; --ledger URL for another)")
    done = _cli({"AIRFLOW_HOME": str(home), "AIRFLOW__HETERO_GPU__LEDGER_CONN_ID": "pg_ledger"}, "drain", "x",
                "--reason", "r")
    assert done.returncode == 2 and done.stderr == (
        "hetero-gpu drain: error: the tasks' ledger is the Airflow connection 'pg_ledger' "
        "(AIRFLOW__HETERO_GPU__LEDGER_CONN_ID), which the command line does not read: give --ledger URL\n")


def test_queue_wraps_its_reasons_to_the_terminal_and_wide_prints_them_whole(tmp_path, capsys, monkeypatch):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger.from_url(url) as led:
        led.reserve("hold", make_cluster(), PlanRequest(8))
        led.enqueue("waits", PlanRequest(4))
        reason = led.queue_entry("waits").reason
    assert len(reason) > 60
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = run(capsys, "queue", "--ledger", url)
    lines = out.splitlines()
    assert code == 0 and max(len(x) for x in lines) <= 100, out
    start = lines[0].index("REASON")
    follow = [x for x in lines[3:] if x.strip() and not x.startswith(("1", "-", "(", "\n"))]
    assert follow and all(x[:start].strip() == "" for x in follow), out  # continuation lines sit under REASON
    assert " ".join(x[start:].strip() for x in lines[2:3] + follow) == reason
    code, out, _ = run(capsys, "queue", "--ledger", url, "--wide")
    assert code == 0 and any(x.rstrip().endswith(reason) for x in out.splitlines()), out
    monkeypatch.delenv("COLUMNS")  # not a terminal (captured): whole lines, as for a pipe
    code, out, _ = run(capsys, "queue", "--ledger", url)
    assert any(x.rstrip().endswith(reason) for x in out.splitlines()), out


def test_plan_warns_when_it_places_on_an_inventory_older_than_inventory_max_age(tmp_path, capsys, monkeypatch):
    import re
    from datetime import datetime, timedelta, timezone

    from test_ledger_queue import fill

    monkeypatch.delenv("AIRFLOW__HETERO_GPU__INVENTORY_MAX_AGE", raising=False)
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger.from_url(url, clock=lambda: datetime.now(timezone.utc) - timedelta(seconds=703)) as led:
        fill(led)  # collected 703 s ago
    code, out, err = run(capsys, "plan", "--ledger", url, "--gpus", "2", "--json")
    assert code == 0 and json.loads(out)["decision"] is not None
    assert err.count("\n") == 1 and re.match(r"hetero-gpu plan: warning: placed on an inventory 70\d s old \(node0\d\), "
                                             r"older than inventory_max_age 300 s", err), err
    monkeypatch.setenv("AIRFLOW__HETERO_GPU__INVENTORY_MAX_AGE", "3600")
    code, _, err = run(capsys, "plan", "--ledger", url, "--gpus", "2")
    assert code == 0 and err == ""
    code, _, err = run(capsys, "plan", "--ledger", url, "--gpus", "2", "--max-age", "1000")  # a bound given: no warning
    assert code == 0 and err == ""
