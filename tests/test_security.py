"""Security properties, each checked against the real thing where one exists.

* Host keys are verified everywhere (collection CLI, launcher) and nothing can turn that off.
* No user-controlled string reaches a remote shell unquoted: hostile values either run as
  literal data over the emulated cluster's sshd, or are rejected with a one-line error.
* The ledger builds no SQL from strings; hostile job ids and host names are stored verbatim.

* Secrets given in ``env`` are masked in the task log (one ``airflow dags test`` run).

That the cluster page needs a login is tested in ``tests/test_plugin_app.py``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, inspect, select
from test_collect_cli import hetero_gpu, ssh_args
from test_launch_remote import Lines, assert_nothing_left, factory_of, new_job_id, targets_of

from airflow_hetero_gpu.collect.nvml import agent_command
from airflow_hetero_gpu.collect.targets import SshTarget, parse_host
from airflow_hetero_gpu.core.cluster import build_cluster
from airflow_hetero_gpu.core.model import Gpu, PlanRequest
from airflow_hetero_gpu.core.topology import HostWiring
from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.launch import Command, JobStartError, LaunchSpec, RemoteJob, Torchrun, Worker, torchrun_job
from airflow_hetero_gpu.launch.command import HostShare, build_commands, build_host_command
from airflow_hetero_gpu.ledger import Ledger, LedgerError
from airflow_hetero_gpu.ledger.schema import reservation_gpus, reservations
from airflow_hetero_gpu.testing.demo import small_hosts
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)
from cluster_fixtures import emulated_cluster  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "airflow_hetero_gpu"


def pwned_path() -> Path:
    return Path("/tmp") / f"pwned-{uuid.uuid4().hex}"


def hostile_values(target: Path) -> list[str]:
    """Shell metacharacters that would create ``target`` if any shell evaluated them."""
    return [
        f"; touch {target}",
        f"$(touch {target})",
        f"`touch {target}`",
        f"| touch {target}",
        f"&& touch {target}",
        f"\ntouch {target}\n",
        f"' ; touch {target} ; '",
        f'" ; touch {target} ; "',
        f"x'\"$(touch {target})\"'",
    ]


@pytest.fixture
def two_hosts(emulated_cluster):
    return emulated_cluster(small_hosts(2, gpus=1))


# ---------------------------------------------------------------------------------------------
# a. Host keys
# ---------------------------------------------------------------------------------------------


def test_collect_refuses_a_host_whose_key_changed(two_hosts, tmp_path):
    two_hosts.inject_fault("node02", "host_key_changed")
    out = tmp_path / "out"
    done = hetero_gpu("collect", *ssh_args(two_hosts), "--out", str(out), "--retries", "0")
    lines = done.stdout.splitlines()
    bad = [line for line in lines if line.startswith("node02 ")]
    assert len(bad) == 1 and "failed: host key mismatch for 127.0.0.12:" in bad[0], done.stdout + done.stderr
    assert (out / "hosts" / "node01" / "query.csv").is_file()
    assert not (out / "hosts" / "node02" / "query.csv").exists()
    assert "host key" in (out / "hosts" / "node02" / "error.txt").read_text()


def test_launcher_refuses_a_host_whose_key_changed(two_hosts):
    two_hosts.inject_fault("node02", "host_key_changed")
    job_id = new_job_id("hostkey")
    marker = pwned_path()
    spec = LaunchSpec(job_id, Torchrun("train.py", launcher=("sh", "-c", f"touch {marker}", "sh")))
    placements = [(t, (0,)) for t in targets_of(two_hosts)]
    job = torchrun_job(spec, placements, factory_of(two_hosts), rdzv_port=29400)
    with pytest.raises(JobStartError) as caught:
        job.start()
    assert caught.value.host == "node02" and "\n" not in str(caught.value)
    assert "host key" in str(caught.value).lower()
    assert not marker.exists()
    assert_nothing_left(job_id)


@pytest.mark.parametrize("needle", [
    "AutoAddPolicy",
    "WarningPolicy",
    "no_host_key_check=True",
    "StrictHostKeyChecking=no",
    "allow_host_key_change=True",
])
def test_no_way_to_disable_host_key_verification(needle):
    hits = [f"{path.relative_to(REPO)}:{n}"
            for path in sorted(PACKAGE.rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if needle in line]
    assert hits == []


# ---------------------------------------------------------------------------------------------
# b. No injection into remote command lines
# ---------------------------------------------------------------------------------------------

# The launcher runs ``sh -c <this> sh <torchrun argv...>``: it prints every argument it got,
# the working directory and one environment variable, one per line.
ECHO = 'printf "ARG=%s\\n" "$@"; printf "PWD=%s\\n" "$PWD"; printf "EVIL=%s\\n" "$EVIL"'


@pytest.mark.parametrize("where", ["script", "script_args", "env", "workdir"])
def test_hostile_values_stay_literal_over_sshd(two_hosts, tmp_path, where):
    target = pwned_path()
    values = hostile_values(target)
    for i, value in enumerate(values):
        job_id = new_job_id(f"inj-{where}-{i}")
        script, args, env, workdir = "train.py", ("--epochs", "1"), {"EVIL": "plain"}, None
        if where == "script":
            script = value
        elif where == "script_args":
            args = (value, "--x", value)
        elif where == "env":
            env = {"EVIL": value}
        else:
            # A directory whose name holds the value ('/' in it makes sub-directories).
            workdir_path = tmp_path / f"w{i}" / value.lstrip("/\n")
            workdir_path.mkdir(parents=True)
            workdir = str(workdir_path)
        spec = LaunchSpec(job_id, Torchrun(script, args, launcher=("sh", "-c", ECHO, "sh")),
                          env=env, workdir=workdir)
        lines = Lines()
        # One host per job: the emulated hosts share one home directory, and a job this short
        # on two of them races on the shared run directory (one host removes it while the
        # other is about to write its pid file); that is not what this test is about.
        job = torchrun_job(spec, [(targets_of(two_hosts)[i % 2], (0,))], factory_of(two_hosts),
                           rdzv_port=29400, on_line=lines)
        result = job.run(timeout=60)
        assert result.ok, lines.text()
        for host in (("node01", "node02")[i % 2],):
            out = "".join(line + "\n" for h, _, stream, line in lines.items if h == host and stream == "stdout")
            if where == "script":
                assert out.count(f"ARG={value}\n") == 1, out
            elif where == "script_args":
                assert out.count(f"ARG={value}\n") == 2, out
            elif where == "env":
                assert out.count(f"EVIL={value}\n") == 1, out
            else:
                assert out.count(f"PWD={workdir}\n") == 1, out
        assert_nothing_left(job_id)
    assert not target.exists()


def test_hostile_command_argv_stays_literal_under_sh(tmp_path):
    """The command line as built, run by ``/bin/sh -c`` (no SSH): argv comes back verbatim."""
    import subprocess

    target = pwned_path()
    values = hostile_values(target)
    spec = LaunchSpec("t-sh-" + uuid.uuid4().hex[:8], Command(("sh", "-c", 'printf "%s\\0" "$@"', "sh", *values)),
                      env={"EVIL": values[0]}, workdir=str(tmp_path))
    command = build_host_command(spec, [HostShare("node01", "127.0.0.1", (0,))], 0, 29400)
    read_end, write_end = os.pipe()  # stdin held open, as the SSH channel's is (else the watchdog acts)
    try:
        done = subprocess.run(["/bin/sh", "-c", command], stdin=read_end, capture_output=True, timeout=30)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert done.returncode == 0, done.stderr
    stdout = done.stdout.decode()
    assert stdout.split("\n", 1)[1].split("\0")[:-1] == values
    assert not target.exists()


@pytest.mark.parametrize("build, message", [
    (lambda v: LaunchSpec(v, Command(("true",))), "invalid job id"),
    (lambda v: HostShare(v, "127.0.0.1", (0,)), "invalid host name"),
    (lambda v: SshTarget(v, "127.0.0.1", 22, "u"), "invalid host name"),
    (lambda v: parse_host(v), "invalid --hosts entry"),
    (lambda v: agent_command(v), "must be a command name or path"),
    (lambda v: LaunchSpec("job", Command(("true",)), env={v: "x"}), "invalid environment variable name"),
])
def test_hostile_names_are_rejected_in_one_line(build, message):
    target = pwned_path()
    for value in hostile_values(target) + [f"ok{c}touch" for c in ";$`|&\n'\" "]:
        with pytest.raises((ValueError, HeteroGpuError)) as caught:
            build(value)
        assert message in str(caught.value) and "\n" not in str(caught.value).replace("\\n", ""), str(caught.value)
    assert not target.exists()


def test_hostile_job_id_never_reaches_a_host(two_hosts):
    target = pwned_path()
    for value in hostile_values(target):
        with pytest.raises(ValueError, match="invalid job id"):
            RemoteJob(value, [Worker(targets_of(two_hosts)[0], 0, f"touch {target}")], factory_of(two_hosts))
    assert not target.exists()


def test_build_commands_quote_everything_once():
    """A static view of the same: no hostile value appears unquoted in the script."""
    target = pwned_path()
    for value in hostile_values(target):
        spec = LaunchSpec("job-1", Torchrun(value, (value,)), env={"EVIL": value}, workdir=value)
        for command in build_commands(spec, [HostShare("a", "10.0.0.1", (0,)), HostShare("b", "10.0.0.2", (0,))],
                                      29400):
            assert command.startswith("sh -c '") and command.endswith("'")


# ---------------------------------------------------------------------------------------------
# d. The ledger and SQL
# ---------------------------------------------------------------------------------------------

#: The only statements the ledger passes as text: constants, no value interpolated into them.
ALLOWED_SQL_TEXT = {
    "BEGIN IMMEDIATE",            # SQLite: take the write lock at BEGIN (db.py)
    "BEGIN",                      # SQLite: read transactions (db.py)
    "PRAGMA journal_mode = WAL",  # SQLite connection setup (db.py)
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
    # schema step 5 (migrations.py): the MIG instance joins reservation_gpus' primary key; SQLite
    # rebuilds the table, PostgreSQL alters the key. Constant text, no value from outside.
    "ALTER TABLE reservation_gpus RENAME TO reservation_gpus_v4",
    "DROP INDEX IF EXISTS ix_reservation_gpus_job_id",
    "INSERT INTO reservation_gpus (host, gpu_index, job_id, slot, uuid, mig_instance) "
    "SELECT host, gpu_index, job_id, slot, uuid, -1 FROM reservation_gpus_v4",
    "DROP TABLE reservation_gpus_v4",
    "ALTER TABLE reservation_gpus DROP CONSTRAINT pk_reservation_gpus",
    "ALTER TABLE reservation_gpus ADD CONSTRAINT pk_reservation_gpus PRIMARY KEY (host, gpu_index, mig_instance)",
}
SQL_CALLS = {"text", "exec_driver_sql", "execute", "executescript", "literal_column"}


def sql_text_calls() -> list[tuple[str, int, str, object]]:
    """Every call of text()/exec_driver_sql()/execute() in the ledger whose first argument is a
    string (constant or built): (file, line, function, the constant or 'built')."""
    found = []
    for path in sorted((PACKAGE / "ledger").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name not in SQL_CALLS:
                continue
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append((path.name, node.lineno, name, arg.value))
            elif isinstance(arg, (ast.JoinedStr, ast.BinOp)) or (
                    isinstance(arg, ast.Call) and getattr(arg.func, "attr", None) == "format"):
                found.append((path.name, node.lineno, name, "built"))
    return found


def test_ledger_passes_only_constant_sql_text():
    calls = sql_text_calls()
    assert [c for c in calls if c[3] == "built"] == []
    assert {c[3] for c in calls} <= ALLOWED_SQL_TEXT, calls
    assert [c for c in calls if c[2] in ("text", "literal_column", "executescript")] == []


HOSTILE_NAMES = ["x'; DROP TABLE reservations; --", 'x"; DROP TABLE reservation_gpus; --',
                 "x\\'); DELETE FROM reservations; --", "名前 ' OR '1'='1", "x%s%(a)s?:1"]


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_hostile_job_ids_are_refused_and_host_names_stored_verbatim(ledger_db_url, hostile):
    """A job id follows the one name rule (core/names.py), so a hostile one is refused in one line;
    a host name is the inventory's and is stored as it is, as a bound parameter."""
    from airflow_hetero_gpu.ledger.errors import LedgerError

    host = "h-" + hostile
    job = "job-1"
    gpus = [Gpu(host, i, f"GPU-{i}", "NVIDIA A100-SXM4-80GB", 81920, 0, 0.0) for i in range(2)]
    cluster = build_cluster(gpus, {host: HostWiring.from_links(range(2), {(0, 1): "NV12"})})
    with Ledger(ledger_db_url) as ledger:
        with pytest.raises(LedgerError, match="^invalid job id"):
            ledger.reserve(hostile, cluster, PlanRequest(2))
        result = ledger.reserve(job, cluster, PlanRequest(2))
        assert result.decision is not None
        live = ledger.live_reservations()
        assert [r.job_id for r in live] == [job]
        assert {(g.host, g.index) for g in live[0].gpus} == {(host, 0), (host, 1)}
        assert set(ledger.reserved_map().values()) == {job}
        assert ledger.release(job) is True
        assert ledger.live_reservations() == []
    engine = create_engine(ledger_db_url)
    try:
        tables = set(inspect(engine).get_table_names())
        assert {reservations.name, reservation_gpus.name} <= tables
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(reservations)).scalar_one() == 0
    finally:
        engine.dispose()


@pytest.mark.parametrize("bad", ["", "   ", None, 42, "x" * 10_000])
def test_unusable_job_ids_are_rejected_in_one_line(tmp_path, bad):
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        with pytest.raises(LedgerError) as caught:
            ledger.release(bad)
    assert "\n" not in str(caught.value)


def test_sql_text_scan_sees_the_known_statements():
    """Guards the scan itself: it finds the SQLite BEGIN statements db.py is known to issue."""
    assert {"BEGIN IMMEDIATE", "BEGIN"} <= {c[3] for c in sql_text_calls()}
    assert re.search(r"pg_advisory_xact_lock\(bindparam", (PACKAGE / "ledger" / "db.py").read_text())


# ---------------------------------------------------------------------------------------------
# c. Secrets in env are masked in task logs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("line", [
    "[node01 rank 0] TOKEN={secret}",
    "[node02 rank 1] Traceback: KeyError: '{secret}'",
    "{secret}{secret}",
])
def test_env_secrets_are_masked_in_the_task_log(line):
    """The operator registers every env value with the Task SDK's secrets masker, and the
    processor that redacts task log lines (``airflow.sdk.log.mask_logs``: what a real run's
    task log goes through) prints ``***`` for it.

    Not through ``airflow dags test``: that command runs tasks in its own process with the core
    logging setup, which has no masking processor: its console showed the worker's line with the
    value in clear (checked on Airflow 3.3.2)."""
    from airflow.sdk.log import mask_logs

    from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator

    secret = f"s3cr3t-{uuid.uuid4().hex}"
    op = HeteroTrainOperator(task_id="t", gpu_count=1, command=[sys.executable, "-c", "pass"],
                             env={"API_TOKEN": secret, "OMP_NUM_THREADS": "1"}, ssh_conn_ids=["a"])
    op._mask_env()
    event = mask_logs(None, "info", {"event": line.format(secret=secret), "secret": secret})
    assert secret not in json.dumps(event)
    assert event["event"] == line.format(secret="***") and event["secret"] == "***"
