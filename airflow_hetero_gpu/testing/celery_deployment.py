"""Airflow with the CeleryExecutor, every component a process "on a machine of its own".

:class:`CeleryDeployment` is an :class:`~airflow_hetero_gpu.testing.airflow_env.AirflowDeployment`
with the CeleryExecutor, a broker (Redis, :mod:`airflow_hetero_gpu.testing.redis_server`), a
metadata database that every machine reaches (PostgreSQL; also Celery's result backend), and
Celery workers (``airflow celery worker --celery-hostname NAME``). Every component — the
api-server, scheduler, dag-processor, triggerer and each worker — has its own AIRFLOW_HOME,
working directory, TMPDIR and copy of the DAGs folder under ``home/<component>``: they share
the two databases and nothing else::

    with RedisServer() as redis, CeleryDeployment(home, dags, env, metadata_url=pg_url,
                                                   broker_url=redis.url()) as airflow:
        run_id = airflow.trigger_rest("my_dag", conf={...})
        airflow.drain_worker("worker-a")      # it takes no more tasks, finishes its own, exits

A worker's task log files are in its own home (``task_logs`` says which worker wrote what).
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from airflow_hetero_gpu.testing.airflow_env import AirflowDeployment

#: the queue every task goes to (Airflow's ``[operators] default_queue``)
QUEUE = "default"


class CeleryDeployment(AirflowDeployment):
    def __init__(self, home: Path, dags_folder: Path, extra: Mapping[str, str] | None = None, *,
                 metadata_url: str, broker_url: str, workers: Sequence[str] = ("worker-a", "worker-b"),
                 concurrency: int = 4):
        self.broker_url = broker_url
        super().__init__(home, dags_folder, {
            "AIRFLOW__CELERY__BROKER_URL": broker_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{metadata_url}",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(concurrency),
            # a loaded machine may take more than the default second to publish a task
            "AIRFLOW__CELERY__OPERATION_TIMEOUT": "30",
            "AIRFLOW__CELERY__SYNC_PARALLELISM": "1",
            "AIRFLOW__CORE__PARALLELISM": "8",
            **(extra or {}),
        }, executor="CeleryExecutor", metadata_url=metadata_url)
        for name in self.COMPONENTS:  # the control plane's components, each on a machine of its own
            self.add_component(name, (name,), home=self.home / name)
        # the api-server's users file lives where the api-server runs
        api_home = self.home / "api-server"
        (api_home / "passwords.json").write_text((self.home / "passwords.json").read_text())
        self.components["api-server"].env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] = str(
            api_home / "passwords.json")
        self.workers = list(workers)
        for name in self.workers:
            self.add_component(name, ("celery", "worker", "--celery-hostname", name, "--concurrency", str(concurrency),
                                      "--queues", QUEUE, "--skip-serve-logs", "--without-mingle", "--without-gossip"),
                               home=self.home / name)
        self.stopped_workers: dict[str, int] = {}

    def wait_until_ready(self, timeout: float = 600) -> None:
        """Wait for the api-server to answer and every worker to answer a ping."""
        self.wait_for(self.api_ready, timeout, "the api-server answering")
        for worker in self.workers:
            self.wait_for(lambda: self.worker_responding(worker, 2), timeout, f"{worker} answering a ping")

    @staticmethod
    def node_name(worker: str) -> str:
        """Celery's name of a worker started with ``--celery-hostname worker``."""
        return f"celery@{worker}"

    # -- the REST API -----------------------------------------------------------------------
    def wait_for_dag(self, dag_id: str, timeout: float = 300) -> None:
        self.wait_for(lambda: self.query("select 1 from dag where dag_id = ?", dag_id), timeout,
                      f"DAG {dag_id} parsed")

    def trigger_rest(self, dag_id: str, run_id: str | None = None, conf: Mapping[str, Any] | None = None,
                     client=None) -> str:
        """Trigger a DAG run through the REST API (``POST /api/v2/dags/{dag_id}/dagRuns``)."""
        run_id = run_id or f"manual__{uuid.uuid4().hex[:12]}"
        own = client is None
        client = client or self.client()
        try:
            r = client.post(f"/api/v2/dags/{dag_id}/dagRuns",
                            json={"dag_run_id": run_id, "logical_date": None, "conf": dict(conf or {})})
        finally:
            if own:
                client.close()
        if r.status_code != 200:
            raise RuntimeError(f"triggering {dag_id} failed ({r.status_code}): {r.text[:1000]}")
        return run_id

    # -- the workers ----------------------------------------------------------------------------
    def worker_responding(self, worker: str, timeout: float = 10) -> bool:
        """Whether the worker answers a Celery ping over the broker (it consumes once it does)."""
        from celery import Celery

        app = Celery(broker=self.broker_url)
        try:
            replies = app.control.ping(destination=[self.node_name(worker)], timeout=timeout)
        finally:
            app.close()
        return any(self.node_name(worker) in reply for reply in replies)

    def drain_worker(self, worker: str, timeout: float = 60) -> None:
        """Take the worker out of service as an operator does before maintenance: it stops
        consuming the task queue (Celery's ``cancel_consumer``, confirmed by the worker's reply),
        then gets SIGTERM (Celery's warm shutdown: the tasks it runs finish, then it exits).
        Only the worker's main process is signalled, never its tasks."""
        from celery import Celery

        app = Celery(broker=self.broker_url)
        try:
            replies = app.control.cancel_consumer(QUEUE, destination=[self.node_name(worker)], reply=True,
                                                  timeout=timeout)
        finally:
            app.close()
        if not any(self.node_name(worker) in reply for reply in replies):
            raise RuntimeError(f"{worker} did not confirm that it stopped consuming {QUEUE!r}: {replies}")
        self.expected_exits.add(worker)
        os.kill(self.procs[worker].pid, signal.SIGTERM)

    def wait_worker_exit(self, worker: str, timeout: float) -> int:
        """Wait for a drained worker to exit by itself; returns its exit status."""
        proc = self.procs[worker]
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{worker} did not exit within {timeout:g} s of its warm shutdown") from None
        self.procs.pop(worker)
        self._close_log(worker)
        self.stopped_workers[worker] = code
        return code

    def workload_lines(self, worker: str, run_id: str, task_id: str) -> list[str]:
        """The worker's ``Executing workload in Celery`` log lines of one task of a run."""
        return [line for line in self.component_log(worker).splitlines()
                if "Executing workload in Celery" in line and f"run_id='{run_id}'" in line
                and f"task_id='{task_id}'" in line]
