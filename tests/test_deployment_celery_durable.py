"""Durable trainings across a Celery deployment whose every worker, and its triggerer, is SIGKILLed
mid-training.

The deployment of tests/test_deployment_celery.py (scheduler, dag-processor, triggerer,
api-server, two Celery workers, PostgreSQL, Redis; six emulated hosts of two GPUs, real torchrun):
six durable trainings of two GPUs train, three watched from their task in a worker and three
deferred (``deferrable=True``: watched from the triggerer, no worker slot held). Both workers
and the triggerer are SIGKILLed with every process under them (the task processes included) and
started again. Every job keeps running (the same processes on the hosts). Airflow finds the
worker tasks' heartbeats gone and retries them; each retry reattaches (one launch per job, no
resume from a checkpoint: the epochs go on) and ends `success`. The deferred tasks stay
`deferred` on their first try: the new triggerer takes their triggers over and reattaches to
their jobs, the same way. A sampler compares the ledger with the processes on the hosts every
second: no GPU is held twice, and every process runs on GPUs its job holds. Nothing is left at
the end."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.operators.hetero_train import default_job_id
from airflow_hetero_gpu.testing import procs
from airflow_hetero_gpu.testing.airflow_env import connection_env
from dag_run_helpers import DAGS, SCRIPT

pytest.importorskip("torch", reason="torch (CPU build) is needed to train the example model")
pytest.importorskip("celery", reason="could not import celery (apache-airflow-providers-celery, the test extra)")
pytest.importorskip("airflow.providers.celery", reason="could not import apache-airflow-providers-celery")
pytest.importorskip("httpx", reason="could not import httpx")

from airflow_hetero_gpu.testing.celery_deployment import CeleryDeployment  # noqa: E402
from test_deployment_celery import LEDGER_CONN_ID, Sampler, _check_command  # noqa: E402

pytestmark = pytest.mark.slow

DAG, DEFERRED_DAG = "hg_durable_test", "hg_durable_deferred_test"
# run ids (and so job ids, and each job's run directory on the hosts) of this run only: a job
# directory an earlier run left on a host (one whose watchers were killed with it) is not this
# run's, and its offsets would count as this run's heartbeats
_RUN = uuid.uuid4().hex[:6]
RUNS = tuple(f"durable-{i}-{_RUN}" for i in (1, 2, 3))  # watched from a worker; 2 GPUs each
DEFERRED = tuple(f"deferred-{i}-{_RUN}" for i in (1, 2, 3))  # watched from the triggerer: the fleet of 12 full
TIMEOUT = 900  # safety nets only


def dag_of(run_id: str) -> str:
    return DEFERRED_DAG if run_id in DEFERRED else DAG


def job_of(run_id: str) -> str:
    return default_job_id(dag_of(run_id), "train", run_id, None)


def _attempts(airflow, run_id: str) -> dict[str, str]:
    """The task's log files by try (``"1"``, ``"2"``) and, for its triggers, by
    ``"1.log.trigger.<id>"`` (one file per trigger that ran it)."""
    out: dict[str, str] = {}
    for home in airflow.log_homes().values():
        root = home / "logs" / f"dag_id={dag_of(run_id)}" / f"run_id={run_id}" / "task_id=train"
        for path in sorted(root.rglob("attempt=*.log")):
            key = path.stem.split("=", 1)[1]
            out[key] = out.get(key, "") + path.read_text(errors="replace")
    return out


def _triggers(attempts: dict[str, str]) -> list[str]:
    """The trigger logs of the first try, oldest trigger first (trigger ids grow)."""
    keys = sorted((k for k in attempts if k.startswith("1.log.trigger.")), key=lambda k: int(k.rsplit(".", 1)[1]))
    return [attempts[k] for k in keys]


def _heartbeat_epochs(job_id: str) -> int:
    """The epochs the job's last heartbeat counted as relayed: its host's output file up to the
    offset that heartbeat recorded (``<host>.relayed``, written with it)."""
    best = 0
    for relayed in (Path.home() / ".hetero-gpu" / "run" / job_id).glob("*.relayed"):
        try:
            offset = int(relayed.read_text().split()[0])
            out = relayed.with_suffix(".out").read_bytes()[:offset]
        except (OSError, ValueError, IndexError):
            continue
        best = max(best, len(re.findall(rb"epoch \d+ loss", out)))
    return best


def _hosts() -> list:
    """Six hosts of two GPUs named apart from other tests' ``node01``…: every emulated host is
    this machine, and another test's orphan sweep of its own ``node01`` reads every process's
    ``HETERO_GPU_HOST`` here (seen: it stopped this test's trainings on node01 and node02)."""
    from airflow_hetero_gpu.testing.demo import A100_80, HGX_A100_BUS, make_gpus, small_hosts
    from airflow_hetero_gpu.testing.state import HostSpec

    topo = small_hosts(1)[0].topology
    return [HostSpec(f"durable{n:02d}", make_gpus(f"durable{n:02d}", A100_80, HGX_A100_BUS[:2]), dict(topo))
            for n in range(1, 7)]


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """PostgreSQL (Airflow's metadata, the ledger), Redis (the broker), the emulated fleet."""
    from airflow_hetero_gpu.testing import EmulatedCluster, sshd_available
    from airflow_hetero_gpu.testing.postgres import PostgresServer, PostgresUnavailable
    from airflow_hetero_gpu.testing.redis_server import RedisServer, RedisUnavailable

    if not sshd_available():
        pytest.skip("OpenSSH server not installed (no sshd/ssh-keygen): apt-get install openssh-server")
    root = tmp_path_factory.mktemp("celery-durable")
    try:
        pg = PostgresServer().start()
    except PostgresUnavailable as err:
        pytest.skip(str(err))
    try:
        redis = RedisServer(root / "redis").start()
    except RedisUnavailable as err:
        pg.stop()
        pytest.skip(str(err))
    try:
        with EmulatedCluster(root / "cluster", _hosts()) as cluster:
            yield {"root": root, "pg": pg, "redis": redis, "cluster": cluster,
                   "metadata_url": pg.create_database("airflow"), "ledger_url": pg.create_database("ledger")}
    finally:
        redis.stop()
        pg.stop()


@pytest.fixture(scope="module")
def deployment(services):
    root, cluster, pg = services["root"], services["cluster"], services["pg"]
    stops = root / "stop-files"
    stops.mkdir()
    conns, ids = connection_env(cluster, inline_key=True)
    cfg = {"ssh_conn_ids": ids, "script": SCRIPT, "workdir": str(root), "gpu_count": 2,
           "script_args": ["--epochs", "1000", "--sleep", "1", "--stop-file", f"{stops}/{{{{ run_id }}}}"],
           "inventory_max_age": 3600}
    # the switch waits 10 min: with Airflow's default orphan check (every 300 s) a task lost in the
    # database's restart was retried 5 min after it was killed; this deployment checks every 15 s
    # (below), the switch stays above the default
    durable = {"durable": True, "unattended_timeout": 600, "preemption_grace": 5, "lease_seconds": 620,
               # keepalives answered within 30 s: when the six jobs end at once, the tasks that finish
               # them and the deferred ones resuming in a worker load two cores for tens of seconds
               # (8 s gave up on two hosts whose jobs had just ended); a heartbeat every 7.5 s
               "host_timeout": 30, "retry_delay_s": 1,
               # a task whose heartbeats lapse past the 20 s below while the database restarts is
               # given up and retried (the retry reattaches): a try for that, one for the workers'
               # SIGKILL, a spare
               "retries": 3}
    ledger_db = services["ledger_url"].rsplit("/", 1)[1]
    env = {
        **conns,
        f"AIRFLOW_CONN_{LEDGER_CONN_ID.upper()}": json.dumps(
            {"conn_type": "postgres", "host": "127.0.0.1", "port": pg.port, "login": "ledger", "schema": ledger_db}),
        "AIRFLOW__HETERO_GPU__LEDGER_CONN_ID": LEDGER_CONN_ID,
        "HG_TEST_CONFIG": json.dumps(cfg), "HG_TEST_DURABLE_CONFIG": json.dumps(durable),
        # a task whose worker died is noticed (and retried) after 20 s without a heartbeat
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
        # a task the scheduler queued before it died in the database's restart is handed on by the
        # next scheduler's orphan check: every 300 s by default, every 15 s here
        "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
    }
    check = subprocess.Popen(_check_command(cluster, services["ledger_url"]), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        with CeleryDeployment(root / "airflow-durable", DAGS, env, metadata_url=services["metadata_url"],
                              broker_url=services["redis"].url()) as airflow:
            out, _ = check.communicate(timeout=TIMEOUT)
            assert check.returncode == 0, out
            airflow.wait_until_ready(TIMEOUT)
            airflow.wait_for_dag(DAG, TIMEOUT)
            airflow.wait_for_dag(DEFERRED_DAG, TIMEOUT)
            airflow.stops = stops
            airflow.ledger_url = services["ledger_url"]
            yield airflow
    finally:
        if check.poll() is None:
            check.kill()


def _sigkill_worker_tree(airflow, worker: str) -> int:
    """SIGKILL a Celery worker and every process under it (its task supervisors and tasks)."""
    root = airflow.procs[worker].pid
    tree = [root, *procs.descendants(root)]
    for pid in tree:
        procs.signal_quietly(pid, signal.SIGKILL)
    return len(tree)


def test_every_celery_worker_sigkilled_every_training_reattaches(deployment, services):
    """Six trainings (three watched from workers, three deferred) live through a deploy: the
    scheduler, dag-processor and api-server restarted and the metadata database (and ledger)
    restarted under them, then one worker's warm shutdown, then every worker and the triggerer
    SIGKILLed and started again."""
    airflow = deployment
    cluster = services["cluster"]
    everything = RUNS + DEFERRED
    epoch = re.compile(r"epoch (\d+) loss")

    def epochs_in(text: str) -> list[int]:
        return [int(e) for e in epoch.findall(text)]

    killed_at: dict[str, int] = {}  # each worker-watched run's newest try when the workers were SIGKILLed

    def tries(attempts: dict[str, str]) -> list[int]:
        return sorted(int(k) for k in attempts if "trigger" not in k)

    def watched(run_id: str, after_restart: bool) -> str:
        """What the current watcher relayed: the try's log (a worker), the trigger's (deferred)."""
        attempts = _attempts(airflow, run_id)
        if run_id in DEFERRED:
            triggers = _triggers(attempts)
            return triggers[-1] if triggers and (len(triggers) >= 2 or not after_restart) else ""
        newest = max(tries(attempts), default=0)
        if after_restart and newest <= killed_at[run_id]:
            return ""
        return attempts.get(str(newest), "")

    t0 = time.monotonic()

    def step(what: str) -> None:  # the test's timeline, in its output
        print(f"{time.monotonic() - t0:6.1f} s  {what}", flush=True)

    sampler = Sampler(airflow, cluster)
    sampler.start()
    try:
        with airflow.client() as client:
            for run_id in everything:
                airflow.trigger_rest(dag_of(run_id), run_id, {}, client=client)
        airflow.wait_for(lambda: all(len(epochs_in(watched(r, False))) >= 3 for r in everything),
                         TIMEOUT, "every training past epoch 3")
        step("every training past epoch 3")
        states = {r: airflow.task_state(DEFERRED_DAG, r, "train") for r in DEFERRED}
        assert states == {r: "deferred" for r in DEFERRED}, states  # no worker slot held
        # each host's last heartbeat recorded offsets past epoch 2: the next watcher goes on from there
        airflow.wait_for(lambda: all(_heartbeat_epochs(job_of(r)) >= 2 for r in everything), TIMEOUT,
                         "a heartbeat past epoch 2 on every job's host")
        before = {r: set(procs.with_env("HETERO_GPU_JOB_ID", job_of(r))) for r in everything}
        assert all(before.values()), before
        # the rest of a deploy: the scheduler, the dag-processor and the api-server restarted
        # (SIGTERM, then started again), and the metadata database (PostgreSQL, the ledger's too)
        sampler.outage.set()  # the page and the ledger are away for moments: those samples are skipped
        for component in ("scheduler", "dag-processor", "api-server"):
            airflow.restart(component)
        # a component that exits when the database goes away is started again by its service
        # manager, as in a deployment (the scheduler does exit)
        airflow.keep_running = set(airflow.COMPONENTS)
        services["pg"].restart(down_seconds=2)
        step("the database restarted")
        airflow.wait_until_ready(TIMEOUT)
        step("the api-server and the workers answer")
        passed = {r: _heartbeat_epochs(job_of(r)) for r in everything}
        airflow.wait_for(lambda: all(_heartbeat_epochs(job_of(r)) >= passed[r] + 2 for r in everything), TIMEOUT,
                         "every job heartbeated two epochs on after the control plane's restart")
        step("every job heartbeated two epochs on")
        for run_id in everything:  # not stopped, not relaunched: the same processes, the same tries
            assert before[run_id] <= set(procs.with_env("HETERO_GPU_JOB_ID", job_of(run_id))), run_id
            assert not re.search(r"stopping job|task killed", "".join(_attempts(airflow, run_id).values())), run_id
        states = {r: airflow.task_state(dag_of(r), r, "train") for r in DEFERRED}
        assert states == {r: "deferred" for r in DEFERRED}, states
        airflow.keep_running = set()
        sampler.outage.clear()
        print(f"restarted by their service manager after the database's restart: {airflow.restarted}")
        # a worker's warm shutdown (SIGTERM to its main process, as Kubernetes and `docker stop`
        # send it): it takes no more tasks and waits for its own; the deploy's grace then runs out
        warm = airflow.workers[0]
        os.kill(airflow.procs[warm].pid, signal.SIGTERM)
        airflow.wait_for(lambda: "Warm shutdown" in airflow.component_log(warm), TIMEOUT,
                         f"{warm}'s warm shutdown")
        step(f"{warm}'s warm shutdown")
        killed_at.update({r: max(tries(_attempts(airflow, r))) for r in RUNS})
        killed = {w: _sigkill_worker_tree(airflow, w) for w in airflow.workers}
        for component in (*airflow.workers, "triggerer"):
            airflow.restart(component, signal.SIGKILL)  # the group too; then started again
        airflow.wait_for(lambda: all("reattaching" in watched(r, True) for r in RUNS), TIMEOUT,
                         "every retry reattached")
        step("every retry reattached")
        airflow.wait_for(lambda: all("watched from the triggerer" in watched(r, True) for r in DEFERRED), TIMEOUT,
                         "every deferred run's new trigger reattached")
        for run_id in everything:  # the same processes train on
            assert before[run_id] <= set(procs.with_env("HETERO_GPU_JOB_ID", job_of(run_id))), run_id
        airflow.wait_for(lambda: all(len(epochs_in(watched(r, True))) >= 2 for r in everything),
                         TIMEOUT, "every reattached training relaying new epochs")
        step("every reattached training relays new epochs")
        for run_id in everything:
            (airflow.stops / run_id).touch()
        states = {r: airflow.wait_for_state(dag_of(r), r, None, {"success", "failed"}, TIMEOUT) for r in everything}
        step("every run ended")
    finally:
        sampler.stop()
    sampler.check()
    logs = {r: _attempts(airflow, r) for r in everything}
    assert states == {r: "success" for r in everything}, {r: "".join(t.values())[-3000:] for r, t in logs.items()}
    for run_id, attempts in logs.items():
        job = job_of(run_id)
        text = "".join(attempts.values())
        assert text.count(f"job {job}: starting on") == 1, text[-3000:]          # one launch per job
        assert "resumed" not in text
        if run_id in DEFERRED:  # one try; two triggers, the second reattached
            assert {k for k in attempts if "trigger" not in k} == {"1"}, attempts.keys()
            triggers = _triggers(attempts)
            assert len(triggers) >= 2, attempts.keys()
            first, second = epochs_in(triggers[0]), epochs_in("".join(triggers[1:]))
        else:  # every try after the first reattached (one after the SIGKILL, maybe one after the restarts)
            numbers = tries(attempts)
            assert numbers[0] == 1 and numbers[-1] > killed_at[run_id] >= 1, attempts.keys()
            for n in numbers[1:]:
                assert f"job {job}: reattached on" in attempts[str(n)], (run_id, n)
            first = epochs_in(attempts["1"])
            second = [e for n in numbers[1:] for e in epochs_in(attempts[str(n)])]
        assert first[0] == 1 and second and second[0] > 1, (run_id, first, second)  # no restart from scratch
        # continuous, none lost (a line relayed after the last heartbeat may be relayed again)
        assert sorted(set(first + second)) == list(range(1, max(second) + 1)), (run_id, first, second)
    tries = airflow.query("select run_id, try_number from task_instance where dag_id = ?", DEFERRED_DAG)
    assert sorted(tries) == [(r, 1) for r in DEFERRED], tries
    # no GPU held twice; every process on GPUs its job holds (sampled every second throughout)
    assert len(sampler.samples) >= 10
    for sample in sampler.samples:
        for view in ("before", "after"):
            held = [gpu for gpus in sample[view].values() for gpu in gpus]
            assert len(held) == len(set(held)), sample
        for gpu, jobs in sample["processes"].items():
            assert len(jobs) == 1, f"GPU {gpu} used by {jobs} at once"
            (job,) = jobs
            assert gpu in sample["before"].get(job, set()) | sample["after"].get(job, set()), (gpu, job, sample)
    with Ledger.open_existing(airflow.ledger_url) as ledger:
        assert ledger.live_reservations() == []
    airflow.wait_for(lambda: not procs.with_env_marker(cluster.marker + ".", prefix=True), 120,
                     "no process left on the emulated hosts")
    print(f"killed {killed} processes and the triggerer; every job reattached")
