"""Faults during a run, end to end: `airflow dags test` of the operator's test DAG on the
emulated cluster (real sshd per host), real torchrun (CPU, gloo) training across two hosts.

After each fault: no GPU held by a dead job (the ledger), no process of the job left on any
host, and the task's outcome and log say what happened."""

from __future__ import annotations

import re
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from airflow_hetero_gpu.launch.command import JOB_ENV, WATCHDOG_GRACE_S
from airflow_hetero_gpu.launch.orphans import KILL_WAIT_S
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing import procs
from airflow_hetero_gpu.testing.postgres import PostgresServer, PostgresUnavailable
from cluster_fixtures import emulated_cluster  # noqa: F401
from airflow_hetero_gpu.testing.airflow_env import airflow_env, migrate
from dag_run_helpers import DAGS, airflow_home, finish, leftovers, run_leftovers, losses, start_dag, two_hosts  # noqa: F401
from ledger_files import new_ledger

pytest.importorskip("torch", reason="torch (CPU build) is needed to train the example model")

#: how long a host's watchdog may take to end the job once its SSH session is gone
WATCHDOG_S = WATCHDOG_GRACE_S + KILL_WAIT_S + 10
LONG_TRAINING = ["--epochs", "100000", "--sleep", "0.2"]


def _when(pattern: str):
    """An on_line callback and the event it sets at the first line matching ``pattern``."""
    seen = threading.Event()
    return (lambda line: seen.set() if re.search(pattern, line) else None), seen


def _wait_nothing_left(job_id: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while (left := leftovers(job_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _wait_for(predicate, timeout: float) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _reservation_rows(url: str) -> list[str]:
    """The job ids of every reservation row, live or expired: a row goes only when it is
    released or when a later write expires it, and nobody writes here."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sqlalchemy.text("select job_id from reservations")).scalars())
    finally:
        engine.dispose()


def _live(url: str) -> list:
    with Ledger.from_url(url) as ledger:
        return ledger.live_reservations()


def _job_id_of(url: str) -> str:
    (res,) = _live(url)
    return res.job_id


def test_sshd_killed_on_a_host_mid_training(airflow_home, two_hosts, tmp_path):
    """`pkill sshd` on node02 while the job trains on both hosts: the task fails naming node02
    and the lost connection, node01 is swept, node02's watchdog ends the job there (sshd stays
    down, so nothing from outside could), and the reservation is released."""
    on_line, training = _when(r"epoch 2 loss")
    proc, pump, lines, out, cfg = start_dag(airflow_home, two_hosts, tmp_path, "sshd", on_line,
                                            gpu_count=4, script_args=LONG_TRAINING)
    try:
        assert training.wait(240), "".join(lines)[-4000:]
        job_id = _job_id_of(cfg["ledger_url"])
        two_hosts.inject_fault("node02", "sshd_killed")
    finally:
        finish(proc, pump)
    log = "".join(lines)
    assert proc.returncode != 0
    assert re.search(r"worker on node02 \(node rank 1\) (ended without an exit status|no exit status)", log) \
        or re.search(r"node02[^\n]*no exit status \(connection lost", log), log[-5000:]
    assert re.search(r"sweep of node02: cannot reconnect", log), log[-5000:]
    assert f"job {job_id}: reservation released" in log
    assert _live(cfg["ledger_url"]) == []
    assert _wait_nothing_left(job_id, WATCHDOG_S) == ""
    assert not out.exists()


def test_a_host_gone_silent_mid_training(airflow_home, two_hosts, tmp_path):
    """node02's sshd and its sessions are SIGSTOPped (the network goes quiet; nothing is closed,
    so reads just hang): the keepalives go unanswered and after host_timeout the task fails
    naming node02; node01 is swept, the GPUs are released, and once node02 speaks again its
    watchdog finds the session gone and ends the job there."""
    on_line, training = _when(r"epoch 2 loss")
    proc, pump, lines, out, cfg = start_dag(airflow_home, two_hosts, tmp_path, "silent", on_line,
                                            gpu_count=4, host_timeout=6, script_args=LONG_TRAINING)
    try:
        assert training.wait(240), "".join(lines)[-4000:]
        job_id = _job_id_of(cfg["ledger_url"])
        two_hosts.inject_fault("node02", "network_silent")
        silenced = time.monotonic()
        proc.wait(timeout=180)
        failed_after = time.monotonic() - silenced
    finally:
        two_hosts.clear_fault("node02", "network_silent")
        finish(proc, pump)
    log = "".join(lines)
    assert proc.returncode != 0
    assert re.search(r"no answer from node02 for \d+ s \(SSH keepalive\)", log), log[-5000:]
    assert f"job {job_id}: reservation released" in log
    assert failed_after < 120, failed_after
    assert _live(cfg["ledger_url"]) == []
    assert _wait_nothing_left(job_id, WATCHDOG_S) == ""


@pytest.fixture
def private_postgres():
    try:
        server = PostgresServer().start()
    except PostgresUnavailable as err:
        pytest.skip(str(err))
    yield server
    server.stop()


def _restart_at(server: PostgresServer, pattern: str, down_seconds: float):
    """An on_line callback that restarts ``server`` (down ``down_seconds``) in the background at
    the first line matching ``pattern``, and the event it sets then."""
    restarted = threading.Event()

    def on_line(line: str) -> None:
        if not restarted.is_set() and re.search(pattern, line):
            restarted.set()
            threading.Thread(target=server.restart, kwargs={"down_seconds": down_seconds}, daemon=True).start()

    return on_line, restarted


def test_ledger_postgres_restarted_mid_training(airflow_home, two_hosts, tmp_path, private_postgres):
    """The ledger's PostgreSQL is restarted (down 12 s) while the job trains: renewals fail,
    the job runs on within its lease (30 s), the renewals succeed again, training finishes and
    the reservation is released. The job holds after epoch 3 (when the restart begins) until the
    renewal after the outage is seen, so it cannot finish before the database is back."""
    url = private_postgres.create_database()
    release = tmp_path / "release"
    restart, restarted = _restart_at(private_postgres, r"epoch 3 loss", down_seconds=12)

    def on_line(line: str) -> None:
        restart(line)
        if re.search(r"the ledger is reachable again after \d+ s; lease renewed", line):
            release.touch()

    proc, pump, lines, out, cfg = start_dag(airflow_home, two_hosts, tmp_path, "pg", on_line, gpu_count=4,
                                            ledger_url=url, lease_seconds=30,
                                            script_args=["--epochs", "6", "--hold-after-epoch", "3",
                                                         "--hold-file", str(release)])
    finish(proc, pump, timeout=600)
    log = "".join(lines)
    assert restarted.is_set()
    assert proc.returncode == 0, log[-6000:]
    assert re.search(r"the ledger is unreachable \(.*\); the job runs on while its lease lasts", log), log[-6000:]
    assert re.search(r"the ledger is reachable again after \d+ s; lease renewed", log), log[-6000:]
    found = losses(log)
    assert len(found) == 6 and found[-1] < found[0]
    assert "reservation released" in log
    assert _live(url) == []
    assert run_leftovers(log) == ""


def test_ledger_down_longer_than_the_lease_stops_the_job(airflow_home, two_hosts, tmp_path, private_postgres):
    """The ledger's PostgreSQL stays down past the lease (9 s): the job is stopped before the
    lease can run out (its GPUs may be handed to someone else), the task fails saying so, and the
    release goes through once the database is back."""
    url = private_postgres.create_database()
    on_line, _ = _restart_at(private_postgres, r"epoch 2 loss", down_seconds=20)
    proc, pump, lines, out, cfg = start_dag(airflow_home, two_hosts, tmp_path, "pg-long", on_line, gpu_count=4,
                                            ledger_url=url, lease_seconds=9, script_args=LONG_TRAINING)
    finish(proc, pump, timeout=600)
    log = "".join(lines)
    assert proc.returncode != 0
    assert re.search(r"the ledger was unreachable for \d+ s and the lease runs out in \d+ s: the workers were "
                     r"stopped", log), log[-6000:]
    # by the time the database is back the lease has passed: nothing is left to release
    assert re.search(r"no reservation left to release \(released before, or its lease had expired\)|reservation released", log), \
        log[-6000:]
    assert _live(url) == []
    assert run_leftovers(log) == ""


def _kill_dags_test(proc, pump) -> None:
    proc.send_signal(signal.SIGKILL)
    finish(proc, pump, timeout=30)


def test_task_sigkilled_mid_training_then_the_next_try(airflow_home, two_hosts, tmp_path):
    """The task's process is SIGKILLed (no on_kill, no release): each host's watchdog ends the
    job when its SSH session drops, the lease (9 s) frees the GPUs, and the next try (same job
    id, as Airflow's retries get) reserves them again and trains."""
    job_id = f"sigkill-{uuid.uuid4().hex[:8]}"
    url = new_ledger(tmp_path / 'ledger.db')
    on_line, training = _when(r"epoch 2 loss")
    proc, pump, lines, out, cfg = start_dag(airflow_home, two_hosts, tmp_path, "kill9", on_line, gpu_count=4,
                                            ledger_url=url, lease_seconds=9, job_id=job_id,
                                            script_args=LONG_TRAINING)
    try:
        assert training.wait(240), "".join(lines)[-4000:]
        assert leftovers(job_id)
    finally:
        _kill_dags_test(proc, pump)
    first = "".join(lines)
    assert _wait_nothing_left(job_id, WATCHDOG_S) == ""
    assert _reservation_rows(url) == [job_id]  # nobody released it (expired or not, the row is kept) ...
    assert _wait_for(lambda: _live(url) == [], 60), _live(url)  # ... its lease ran out

    on_line, _ = _when(r"^$")
    proc, pump, lines, out, cfg = start_dag(airflow_home, two_hosts, tmp_path, "kill9-next", on_line, gpu_count=4,
                                            ledger_url=url, lease_seconds=9, job_id=job_id,
                                            script_args=["--epochs", "3"])
    finish(proc, pump)
    log = "".join(lines)
    (tmp_path / "first-try.log").write_text(first)
    (tmp_path / "next-try.log").write_text(log)
    assert proc.returncode == 0, log[-5000:]
    assert "leftover process" not in log  # the watchdogs had ended everything already
    assert _live(url) == [] and leftovers(job_id) == ""


def test_task_sigkilled_for_good_the_dead_man_switch_stops_the_job_before_its_lease_frees_the_gpus(
        airflow_home, two_hosts, tmp_path):
    """Durable: the task's process is SIGKILLed and nothing watches the job again. The job runs on
    detached; once nobody has touched its heartbeat for the switch's time (unattended_timeout 20 s
    at most) each host's supervisor sends it SIGTERM (it saves its checkpoint), then SIGKILL after
    the grace (3 s). Sampled every 0.2 s: while any process of the job runs, its reservation is
    live (no GPU of it can be handed out); the lease frees the GPUs only after. The next try (same
    job id) finds nothing left, reserves and trains from the checkpoint.

    Not less than 20 s: with the lease at its shortest (the switch + the grace + 15 s) each
    heartbeat lets the switch wait only what the lease surely has left, which falls to half of
    unattended_timeout just before a renewal (the task renews every half of it). At 6 s that left
    the heartbeats (every 1.5 s) 1.5 s of slack, and a loaded machine stalled the watching task
    longer: the switch stopped the job while its task still ran."""
    job_id = f"deadman-{uuid.uuid4().hex[:8]}"
    url = new_ledger(tmp_path / 'ledger.db')
    ckpt = tmp_path / "ckpt"
    unattended, grace = 20, 3
    on_line, training = _when(r"epoch 3 loss")
    durable = {"durable": True, "unattended_timeout": unattended, "preemption_grace": grace, "host_timeout": 8,
               "lease_seconds": unattended + grace + 15, "checkpoint_dir": str(ckpt)}
    proc, pump, lines, out, cfg = start_dag(airflow_home, two_hosts, tmp_path, "deadman", on_line, gpu_count=4,
                                            ledger_url=url, job_id=job_id, script_args=LONG_TRAINING, **durable)
    try:
        assert training.wait(240), "".join(lines)[-4000:]
        assert procs.with_env(JOB_ENV, job_id)
    finally:
        _kill_dags_test(proc, pump)
    killed = time.monotonic()
    samples = []  # (seconds after the kill, job processes running, reservation live)
    while time.monotonic() - killed < 120:
        running = bool(procs.with_env(JOB_ENV, job_id))
        live = bool(_live(url))
        samples.append((time.monotonic() - killed, running, live))
        if not running and not live:
            break
        time.sleep(0.2)
    stopped_at = next(t for t, running, _ in samples if not running)
    freed_at = next(t for t, _, live in samples if not live)
    assert all(live for _, running, live in samples if running), samples   # never a running job without its lease
    # the switch (<= unattended after the last heartbeat), its look (1 s), the grace, the SIGKILL wait
    assert stopped_at <= unattended + 1 + grace + KILL_WAIT_S + 3, samples
    assert freed_at >= stopped_at
    run_dir = Path.home() / ".hetero-gpu" / "run" / job_id
    # the switch fired: on both hosts, or on the first only, when the job's ranks on the other host
    # ended on their own once their peers were gone (the switches of two hosts fire up to a
    # heartbeat interval apart)
    assert any((run_dir / f"{host}.deadman").exists() for host in ("node01", "node02")), sorted(run_dir.iterdir())
    host_out = "".join((run_dir / f"{h}.out").read_text() for h in ("node01", "node02"))
    assert "SIGTERM received" in host_out, host_out[-3000:]   # the signal came first: it checkpointed

    on_line, _ = _when(r"^$")
    proc, pump, lines, out, cfg = start_dag(airflow_home, two_hosts, tmp_path, "deadman-next", on_line, gpu_count=4,
                                            ledger_url=url, job_id=job_id, script_args=["--epochs", "5"],
                                            **{**durable, "lease_seconds": 120})
    finish(proc, pump)
    log = "".join(lines)
    assert proc.returncode == 0, log[-5000:]
    assert "leftover process" not in log          # the switch had stopped everything
    assert re.search(r"rank \d resumed", log), log[-5000:]   # from the checkpoint the SIGTERM saved
    assert _live(url) == [] and leftovers(job_id) == ""
    assert not run_dir.exists()


def test_every_watcher_gone_under_a_deferred_run_the_switch_stops_the_job_before_a_second_job_gets_its_gpus(
        airflow_home, two_hosts, tmp_path, tmp_path_factory):
    """Durable and deferred: the task has handed its job to the trigger (``airflow dags test``
    runs it in line, so the one process SIGKILLed is both the worker and the triggerer: nothing
    watches the job again). A second job wanting the same four GPUs waits in the queue meanwhile.
    Each host's supervisor stops the first job once nobody has touched its heartbeat for
    ``unattended_timeout`` (SIGTERM: it saves its checkpoint; SIGKILL after the grace); only then
    does the first job's lease free the GPUs, and only then is the second job admitted on them.
    Sampled every 0.2 s: a process of the first job never runs without its reservation, nor
    beside a reservation or a process of the second; the second resumes from the checkpoint."""
    job_id = f"deadman-deferred-{uuid.uuid4().hex[:8]}"
    second_id = f"{job_id}-second"
    url = new_ledger(tmp_path / 'ledger.db')
    ckpt = tmp_path / "ckpt"
    unattended, grace = 20, 5
    on_line, watched = _when(r"epoch 3 loss")
    deferred_seen = threading.Event()

    def on_first(line: str) -> None:
        if "watched from the triggerer" in line:
            deferred_seen.set()
        if deferred_seen.is_set():
            on_line(line)            # an epoch relayed by the trigger

    durable = {"durable": True, "deferrable": True, "unattended_timeout": unattended, "preemption_grace": grace,
               "host_timeout": 8, "lease_seconds": unattended + grace + 15, "checkpoint_dir": str(ckpt)}
    proc, pump, lines, out, cfg = start_dag(airflow_home, two_hosts, tmp_path, "deadman-deferred", on_first,
                                            gpu_count=4, ledger_url=url, job_id=job_id, script_args=LONG_TRAINING,
                                            **durable)
    second = None
    try:
        home_b = tmp_path_factory.mktemp("airflow-second")  # the second job's own Airflow
        migrate(airflow_env(home_b, DAGS))
        assert watched.wait(300), "".join(lines)[-4000:]
        assert "deferring: the triggerer watches it" in "".join(lines)
        assert procs.with_env(JOB_ENV, job_id)
        # the second job: not deferrable, it waits in the queue in its own worker
        second, pump2, lines2, out2, _ = start_dag(
            home_b, two_hosts, tmp_path, "deadman-second", lambda line: None, gpu_count=4, ledger_url=url,
            job_id=second_id, script_args=["--epochs", "5"], wait_for_capacity=True, capacity_poll_interval=1,
            capacity_timeout=600, **{**durable, "deferrable": False})
        with Ledger.from_url(url) as ledger:
            _wait_for(lambda: ledger.queue_entry(second_id) is not None, 240)
    finally:
        _kill_dags_test(proc, pump)
    killed = time.monotonic()
    samples = []  # (seconds after the kill, first job running, its reservation live, second live, second running)
    try:
        while time.monotonic() - killed < 300:
            running = bool(procs.with_env(JOB_ENV, job_id))
            live = {r.job_id for r in _live(url)}
            second_running = bool(procs.with_env(JOB_ENV, second_id))
            samples.append((time.monotonic() - killed, running, job_id in live, second_id in live, second_running))
            if not running and second_running:
                break
            time.sleep(0.2)
        finish(second, pump2)
    finally:
        if second is not None and second.poll() is None:
            second.kill()
    log2 = "".join(lines2)
    assert second.returncode == 0, log2[-5000:]
    stopped_at = next(t for t, running, *_ in samples if not running)
    freed_at = next(t for t, _, live, *_ in samples if not live)
    admitted_at = next(t for t, *_, second_live, _ in samples if second_live)
    assert all(live for _, running, live, *_ in samples if running), samples  # never a running job without its lease
    assert not any(running and (s_live or s_running) for _, running, _, s_live, s_running in samples), samples
    # the switch (<= unattended after the last heartbeat), its look (1 s), the grace, the SIGKILL wait
    assert stopped_at <= unattended + 1 + grace + KILL_WAIT_S + 3, samples
    assert stopped_at <= freed_at <= admitted_at, (stopped_at, freed_at, admitted_at)
    run_dir = Path.home() / ".hetero-gpu" / "run" / job_id
    # the switch fired: on both hosts, or on the first only, when the job's ranks on the other host
    # ended on their own once their peers were gone (the switches of two hosts fire up to a
    # heartbeat interval apart)
    assert any((run_dir / f"{host}.deadman").exists() for host in ("node01", "node02")), sorted(run_dir.iterdir())
    host_out = "".join((run_dir / f"{h}.out").read_text() for h in ("node01", "node02"))
    assert "SIGTERM received" in host_out, host_out[-3000:]   # the signal came first: it checkpointed
    assert re.search(r"rank \d resumed", log2), log2[-5000:]   # from the checkpoint the SIGTERM saved
    assert _live(url) == [] and leftovers(job_id) == "" and leftovers(second_id) == ""
    print(f"after the kill: the first job stopped at {stopped_at:.1f} s, its lease freed at {freed_at:.1f} s, "
          f"the second job admitted at {admitted_at:.1f} s")
