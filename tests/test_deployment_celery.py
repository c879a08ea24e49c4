"""A multi-machine deployment, tested on one machine: Airflow with the CeleryExecutor.

PostgreSQL holds Airflow's metadata (and Celery's results) in one database and the ledger in
another; Redis on loopback is the broker. The api-server, scheduler, dag-processor, triggerer
and two Celery workers (``--celery-hostname worker-a`` / ``worker-b``) are separate processes,
each with its own AIRFLOW_HOME, working directory, TMPDIR and copy of the DAGs folder: they share
the two databases and nothing else (no capture directory anywhere; the ssh connections carry
their key as text). The fleet is four emulated hosts of two GPUs behind real sshd; the trainings
are real torchrun (CPU, gloo).

1. ``hetero-gpu check`` fills the ledger's inventory, as the health watch would;
2. four runs of ``hg_train_test`` start at once, asking for 4, 2, 2 and 2 GPUs of the 8: three
   fit, one waits for capacity deferred in the triggerer;
3. while they run, a thread samples the ledger's live reservations, the training processes on
   the hosts and the cluster page's JSON (served by the api-server, behind its login): no GPU is
   ever held by two jobs, every process runs on GPUs its job holds, and the page shows every
   job's reservation as the ledger has it;
4. the worker that started the waiting task is taken out of service (it stops consuming, finishes
   its trainings and exits); the running trainings are then let finish, the trigger fires, and
   the wait resumes on the other worker, which trains and succeeds;
5. every run succeeds; no process is left on the hosts, no reservation in the ledger.

Each training runs until the test creates its stop file (``--stop-file``), so every step waits
for an event (a ledger row, a task state, a page answer, a log line), never for time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.operators.hetero_train import default_job_id
from airflow_hetero_gpu.testing import EmulatedCluster, procs, sshd_available
from airflow_hetero_gpu.testing.airflow_env import connection_env
from airflow_hetero_gpu.testing.demo import small_hosts
from airflow_hetero_gpu.testing.postgres import PostgresServer, PostgresUnavailable
from airflow_hetero_gpu.testing.redis_server import RedisServer, RedisUnavailable
from dag_run_helpers import DAGS, SCRIPT, losses

pytest.importorskip("torch", reason="torch (CPU build) is needed to train the example model")
pytest.importorskip("celery", reason="could not import celery (apache-airflow-providers-celery, the test extra)")
pytest.importorskip("airflow.providers.celery", reason="could not import apache-airflow-providers-celery (the test extra)")
httpx = pytest.importorskip("httpx", reason="could not import httpx")

from airflow_hetero_gpu.testing.celery_deployment import CeleryDeployment  # noqa: E402  (needs celery)

pytestmark = pytest.mark.slow

DAG = "hg_train_test"
GPUS = {"celery-1": 4, "celery-2": 2, "celery-3": 2, "celery-4": 2}  # 10 of 8 GPUs: one run must wait
FLEET_GPUS = 8
PAGE_API = "/hetero-gpu/api/cluster"
LEDGER_CONN_ID = "hetero_gpu_ledger"
TIMEOUT = 900  # safety nets only: every wait ends on an event


def job_of(run_id: str) -> str:
    return default_job_id(DAG, "train", run_id, None)


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """PostgreSQL (Airflow's metadata, the ledger), Redis (the broker), the emulated fleet."""
    if not sshd_available():
        pytest.skip("OpenSSH server not installed (no sshd/ssh-keygen): apt-get install openssh-server")
    root = tmp_path_factory.mktemp("celery")
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
        with EmulatedCluster(root / "cluster", small_hosts(4, gpus=2)) as cluster:
            yield {"root": root, "pg": pg, "redis": redis, "cluster": cluster,
                   "metadata_url": pg.create_database("airflow"), "ledger_url": pg.create_database("ledger")}
    finally:
        redis.stop()
        pg.stop()


def _check_command(cluster, ledger_url: str) -> list[str]:
    """One health check of the fleet storing its collection in the ledger (what the watch does)."""
    return [sys.executable, "-m", "airflow_hetero_gpu.cli", "check", "--ledger", ledger_url,
            "--hosts", cluster.hosts_arg(), "--identity-file", str(cluster.identity_file),
            "--known-hosts", str(cluster.known_hosts_path)]


@pytest.fixture(scope="module")
def deployment(services):
    root, cluster, pg = services["root"], services["cluster"], services["pg"]
    stops = root / "stop-files"
    stops.mkdir()
    conns, ids = connection_env(cluster, inline_key=True)  # no key file needed where tasks run
    cfg = {"ssh_conn_ids": ids, "script": SCRIPT, "workdir": str(root),
           "gpu_count": "{{ dag_run.conf['gpus'] }}",
           # trains until the test creates the run's stop file (1000 epochs: a safety net)
           "script_args": ["--epochs", "1000", "--sleep", "1", "--stop-file", f"{stops}/{{{{ run_id }}}}"],
           "wait_for_capacity": True, "deferrable": True, "capacity_poll_interval": 1, "capacity_timeout": TIMEOUT,
           "inventory_max_age": 3600}
    ledger_db = services["ledger_url"].rsplit("/", 1)[1]
    env = {
        **conns,
        f"AIRFLOW_CONN_{LEDGER_CONN_ID.upper()}": json.dumps(
            {"conn_type": "postgres", "host": "127.0.0.1", "port": pg.port, "login": "ledger", "schema": ledger_db}),
        "AIRFLOW__HETERO_GPU__LEDGER_CONN_ID": LEDGER_CONN_ID,
        "HG_TEST_CONFIG": json.dumps(cfg),
    }
    assert not any("CAPTURES_DIR" in key for key in env) and "captures_dir" not in cfg
    # the inventory first, collected while Airflow migrates its database
    check = subprocess.Popen(_check_command(cluster, services["ledger_url"]), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        with CeleryDeployment(root / "airflow", DAGS, env, metadata_url=services["metadata_url"],
                              broker_url=services["redis"].url()) as airflow:
            out, _ = check.communicate(timeout=TIMEOUT)
            assert check.returncode == 0, out
            assert "4 host(s) collected, 0 failed" in out, out
            airflow.wait_until_ready(TIMEOUT)
            airflow.wait_for_dag(DAG, TIMEOUT)
            airflow.stops = stops
            airflow.ledger_url = services["ledger_url"]
            yield airflow
    finally:
        if check.poll() is None:
            check.kill()


# --- the sampler ---------------------------------------------------------------------------------
def gpu_processes(cluster) -> dict[tuple[str, int], set[str]]:
    """(host, GPU index) -> the job ids of the processes running there now (from /proc: every
    process a launch starts carries HETERO_GPU_JOB_ID, HETERO_GPU_HOST and CUDA_VISIBLE_DEVICES,
    and the emulated host's marker; other tests' processes on this machine are not ours)."""
    found: dict[tuple[str, int], set[str]] = {}
    ours = f"{cluster.marker}.".encode()
    for pid in procs.all_pids():
        try:
            raw = (procs.PROC / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        env = dict(e.split(b"=", 1) for e in raw.split(b"\0") if b"=" in e)
        job, host, devices = env.get(b"HETERO_GPU_JOB_ID"), env.get(b"HETERO_GPU_HOST"), env.get(b"CUDA_VISIBLE_DEVICES")
        if job and host and devices and env.get(b"HETERO_GPU_EMU_MARKER", b"").startswith(ours):
            for index in devices.decode().split(","):
                found.setdefault((host.decode(), int(index)), set()).add(job.decode())
    return found


def _held(ledger: Ledger) -> dict[str, set[tuple[str, int]]]:
    return {r.job_id: {(g.host, g.index) for g in r.gpus} for r in ledger.live_reservations()}


class Sampler(threading.Thread):
    """Every second: the ledger's live reservations, the processes on the hosts, the ledger again,
    and the cluster page's JSON. Checks are made at the end over every sample."""

    def __init__(self, airflow: CeleryDeployment, cluster):
        super().__init__(daemon=True, name="ledger-sampler")
        self.airflow = airflow
        self.cluster = cluster
        self.samples: list[dict] = []
        self.page_seen: dict[str, set[tuple[str, int]]] = {}  # job -> GPUs the page showed it holding
        self.ledger_seen: dict[str, set[tuple[str, int]]] = {}
        self.process_seen: dict[str, set[tuple[str, int]]] = {}  # job -> GPUs its processes ran on
        self.page_facts: dict | None = None
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self._halt = threading.Event()
        #: while set (a test restarts the api-server or the databases), a sample that cannot be
        #: taken is skipped and counted, not an error
        self.outage = threading.Event()
        self.skipped = 0

    def run(self) -> None:
        try:
            with Ledger.open_existing(self.airflow.ledger_url) as ledger:
                client = None
                try:
                    while not self._halt.is_set():
                        try:
                            client = client or self.airflow.client()
                            self.sample(ledger, client)
                        except Exception:
                            if not self.outage.is_set():
                                raise
                            self.skipped += 1
                            if client is not None:
                                client.close()
                            client = None
                        self._halt.wait(1.0)
                finally:
                    if client is not None:
                        client.close()
        except BaseException as err:  # reported by check() in the test's thread
            self.error = err

    def sample(self, ledger: Ledger, client) -> None:
        before = _held(ledger)
        running = gpu_processes(self.cluster)
        after = _held(ledger)
        r = client.get(PAGE_API)
        r.raise_for_status()
        facts = r.json()
        page = {res["job_id"]: {(g["host"], g["index"]) for g in res["gpus"]} for res in facts["reservations"]}
        with self.lock:
            self.samples.append({"before": before, "processes": running, "after": after, "page": page})
            self.page_facts = facts
            for job, gpus in (*before.items(), *after.items()):
                self.ledger_seen.setdefault(job, set()).update(gpus)
            for job, gpus in page.items():
                self.page_seen.setdefault(job, set()).update(gpus)
            for gpu, jobs in running.items():
                for job in jobs:
                    self.process_seen.setdefault(job, set()).add(gpu)

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the sampler failed: {self.error!r}") from self.error

    def seen_running(self, job: str) -> bool:
        """Whether a sample saw the job's training processes and the page showing its reservation."""
        self.check()
        with self.lock:
            return bool(self.page_seen.get(job)) and bool(self.process_seen.get(job))

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


# --- the scenario ----------------------------------------------------------------------------------
def test_four_runs_on_two_celery_workers_share_the_fleet_through_the_ledger(deployment, services):
    airflow = deployment
    cluster = services["cluster"]
    with httpx.Client(base_url=airflow.base_url, timeout=60) as anonymous:
        assert anonymous.get(PAGE_API).status_code == 401  # the page is behind Airflow's login

    sampler = Sampler(airflow, cluster)
    sampler.start()
    try:
        with airflow.client() as client:  # four runs at once
            for run_id, gpus in GPUS.items():
                airflow.trigger_rest(DAG, run_id, {"gpus": gpus}, client=client)

        # three trainings hold GPUs, one task waits deferred for capacity
        deferred, running = airflow.wait_for(lambda: _settled(airflow), TIMEOUT, "every training placed or deferred")
        assert deferred, f"no run waited for capacity: {running}"
        assert sum(GPUS[r] for r in running) + GPUS[deferred[0]] > FLEET_GPUS
        airflow.wait_for(lambda: all(sampler.seen_running(job_of(r)) for r in running), TIMEOUT,
                         "the running jobs' processes, and their reservations on the cluster page")

        # the worker that deferred the waiting task goes out of service; its trainings finish
        waiting = deferred[0]
        (starter,) = [w for w, text in airflow.task_logs(DAG, waiting, "train").items() if "deferring until one can" in text]
        assert starter in airflow.workers
        other = next(w for w in airflow.workers if w != starter)
        airflow.drain_worker(starter)
        for run_id in running:
            (airflow.stops / run_id).touch()

        # the capacity wait fires when GPUs free up and resumes on the worker still in service
        pending = set(deferred)
        while pending:
            ready = airflow.wait_for(
                lambda: [r for r in pending if sampler.seen_running(job_of(r))],
                TIMEOUT, f"{sorted(pending)} training and shown on the page")
            for run_id in ready:
                (airflow.stops / run_id).touch()
                pending.discard(run_id)

        states = {r: airflow.wait_for_state(DAG, r, None, {"success", "failed"}, TIMEOUT) for r in GPUS}
        exit_code = airflow.wait_worker_exit(starter, TIMEOUT)
    finally:
        sampler.stop()
    sampler.check()

    logs = {r: airflow.task_logs(DAG, r, "train") for r in GPUS}
    assert states == {r: "success" for r in GPUS}, {r: "".join(t.values())[-3000:] for r, t in logs.items()}

    # no GPU was ever held by two jobs; every process ran on GPUs its job held
    assert len(sampler.samples) >= 5
    for sample in sampler.samples:
        for view in ("before", "after"):
            held = [gpu for gpus in sample[view].values() for gpu in gpus]
            assert len(held) == len(set(held)), sample
        for gpu, jobs in sample["processes"].items():
            assert len(jobs) == 1, f"GPU {gpu} used by {jobs} at once"
            (job,) = jobs
            assert gpu in sample["before"].get(job, set()) | sample["after"].get(job, set()), (gpu, job, sample)
    # the ledger held each job's GPUs, its processes ran there, and the page showed them
    jobs = {job_of(r): r for r in GPUS}
    assert set(sampler.ledger_seen) == set(jobs)
    for job, run_id in jobs.items():
        assert len(sampler.ledger_seen[job]) == GPUS[run_id]
        assert sampler.page_seen.get(job) == sampler.ledger_seen[job], (job, sampler.page_seen, sampler.ledger_seen)
        assert sampler.process_seen.get(job) == sampler.ledger_seen[job], (job, sampler.process_seen)
    page = sampler.page_facts
    assert page["sources"]["captures"]["status"] == "ok" and len(page["gpus"]) == FLEET_GPUS, page["sources"]

    # the wait was deferred by one worker and resumed on the other
    parts = logs[waiting]
    assert "deferring until one can" in parts[starter]
    assert "deferring until one can" not in parts.get(other, ""), parts
    resumed = parts[other]
    assert f"job {job_of(waiting)}: reservation released" in resumed and losses(resumed), resumed[-3000:]
    assert airflow.workload_lines(starter, waiting, "train") and airflow.workload_lines(other, waiting, "train")
    assert exit_code == 0, airflow.component_log(starter)[-3000:]
    ran_on = {r: sorted(w for w, text in logs[r].items() if "reservation released" in text) for r in GPUS}
    print(f"deferred {waiting} on {starter}, resumed on {other}; trainings ran on {ran_on}")

    # the triggerer watched the job's queue entry (its log lines go beside the task's)
    assert re.search(rf"job {re.escape(job_of(waiting))}: (head of the queue|\d+\w\w in the queue)",
                     parts.get("triggerer", "")), parts.keys()

    # each training ran on a worker and planned from the ledger's inventory (nothing collected)
    for run_id, parts in logs.items():
        text = "".join(t for w, t in parts.items() if w in airflow.workers)
        assert "inventory from the ledger: 4 host(s)" in text and "collected now" not in text, text[-3000:]
        assert set(parts) <= {*airflow.workers, "triggerer"}, parts.keys()

    # nothing left: no reservation, no process on the emulated hosts
    with Ledger.open_existing(airflow.ledger_url) as ledger:
        assert ledger.live_reservations() == []
    airflow.wait_for(lambda: not procs.with_env_marker(cluster.marker + ".", prefix=True), 120,
                     "no process left on the emulated hosts")


def _live_jobs(airflow: CeleryDeployment) -> set[str]:
    with Ledger.open_existing(airflow.ledger_url) as ledger:
        return {r.job_id for r in ledger.live_reservations()}


def _settled(airflow: CeleryDeployment):
    """(deferred runs, running runs) once every training task is deferred or holds its GPUs."""
    live = _live_jobs(airflow)
    states = {r: airflow.task_state(DAG, r, "train") for r in GPUS}
    deferred = sorted(r for r, s in states.items() if s == "deferred")
    running = sorted(r for r, s in states.items() if s == "running" and job_of(r) in live)
    failed = [r for r, s in states.items() if s in ("failed", "upstream_failed")]
    if failed:
        raise AssertionError(f"{failed} failed: {airflow.task_log(DAG, failed[0], 'train')[-3000:]}")
    return (deferred, running) if len(deferred) + len(running) == len(GPUS) else None
