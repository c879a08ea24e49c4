"""A deferred run phase in a real deployment (api-server, scheduler with LocalExecutor,
dag-processor, triggerer as separate processes; real torchrun on two emulated hosts): the
triggerer is SIGKILLed while it watches a training, and started again. The new triggerer takes
the trigger over from the database and reattaches to the job: the same processes train on (one
launch), no line of the output is lost, and the task ends `success` on its first try."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.operators.hetero_train import default_job_id
from airflow_hetero_gpu.testing import EmulatedCluster
from airflow_hetero_gpu.testing.airflow_env import AirflowDeployment, connection_env
from airflow_hetero_gpu.testing.demo import small_hosts
from dag_run_helpers import DAGS, SCRIPT, leftovers
from ledger_files import new_ledger

pytest.importorskip("torch", reason="torch (CPU build) is needed to train the example model")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("deferred-run")
    with EmulatedCluster(root / "cluster", small_hosts(2, gpus=2)) as cluster:
        conns, ids = connection_env(cluster)
        cfg = {"ssh_conn_ids": ids, "script": SCRIPT, "ledger_url": new_ledger(root / "ledger.db"),
               "captures_dir": str(root / "captures"), "workdir": str(root), "gpu_count": 4}
        # the job holds after epoch 2 until the test has seen the new triggerer take it over
        durable = {"durable": True, "deferrable": True, "unattended_timeout": 60, "preemption_grace": 5,
                   "lease_seconds": 90, "host_timeout": 8,
                   "script_args": ["--epochs", "8", "--hold-after-epoch", "2", "--hold-file", str(root / "hold")]}
        # a job that outlives SIGTERM (it says so and goes on): only the SIGKILL after the grace ends it
        # (it ends with status 0 once ``release-<run id>`` appears in the test's directory: what lets a
        # cleared task's new try end ``success``)
        stubborn = {**durable, "script": None, "script_args": [], "command": [
            "sh", "-c", "trap 'echo TERM received; echo TERM received >&2' TERM; echo stubborn started; "
                        f"while [ ! -e {root}/release-\"$HG_RUN\" ]; do sleep 0.2; done; echo released"],
                    "env": {"HG_RUN": "{{ run_id }}"}}
        with AirflowDeployment(root / "airflow", DAGS, {
            **conns, "HG_TEST_CONFIG": json.dumps(cfg), "HG_TEST_DURABLE_CONFIG": json.dumps(durable),
            "HG_TEST_COMMAND_CONFIG": json.dumps(stubborn),
        }) as airflow:
            airflow.cfg, airflow.root = cfg, root
            yield airflow


def _trigger_logs(airflow, run_id: str, dag_id: str = "hg_durable_test", task_id: str = "train") -> list[str]:
    """The trigger log files of the task's first try (one per trigger that ran it), oldest first."""
    out = []
    for home in airflow.log_homes().values():
        root = home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        out += sorted(root.rglob("attempt=1.log.trigger.*.log"), key=lambda p: p.stat().st_mtime)
    return [p.read_text(errors="replace") for p in out]


def test_triggerer_killed_while_it_watches_a_training(deployment):
    from airflow_hetero_gpu.launch.command import JOB_ENV
    from airflow_hetero_gpu.testing import procs

    airflow = deployment
    run_id = airflow.trigger("hg_durable_test")
    job_id = default_job_id("hg_durable_test", "train", run_id)
    log = lambda: airflow.task_log("hg_durable_test", run_id, "train")  # noqa: E731
    airflow.wait_for(lambda: "holding after epoch 2" in log(), timeout=300, what="the training relayed by the trigger")
    assert airflow.task_state("hg_durable_test", run_id, "train") == "deferred"   # no worker slot held
    owner = lambda: [r[0] for r in airflow.query("select triggerer_id from trigger")]  # noqa: E731
    (old,) = airflow.wait_for(lambda: owner() if owner() and owner()[0] else None, timeout=60,
                              what="the trigger assigned to the triggerer")
    before = set(procs.with_env(JOB_ENV, job_id))
    assert before
    time.sleep(5)  # heartbeats (every 2 s) record how far the output was relayed

    airflow.restart("triggerer", signal.SIGKILL)
    airflow.wait_for(lambda: owner() and owner()[0] not in (None, old), timeout=180,
                     what="the trigger taken over by the new triggerer")
    airflow.wait_for(lambda: len(_trigger_logs(airflow, run_id)) >= 2 and "watched from the triggerer"
                     in _trigger_logs(airflow, run_id)[-1], timeout=120, what="the new trigger reattached")
    assert before <= set(procs.with_env(JOB_ENV, job_id)), "the job's processes changed"
    assert airflow.task_state("hg_durable_test", run_id, "train") == "deferred"
    (Path(airflow.root) / "hold").touch()

    state = airflow.wait_for_state("hg_durable_test", run_id, None, {"success", "failed"}, timeout=420)
    text = log()
    assert state == "success", text[-6000:] + airflow.component_log("triggerer")[-3000:]
    assert airflow.query("select try_number from task_instance where dag_id = ? and run_id = ? and task_id = ?",
                         "hg_durable_test", run_id, "train") == [(1,)]
    assert text.count(f"job {job_id}: starting on") == 1, text[-6000:]                  # one launch
    assert "leftover process" not in text and "resumed from" not in text
    epochs = [int(e) for e in re.findall(r"epoch (\d+) loss", text)]
    assert epochs == list(range(1, 9)), epochs            # no line lost (none repeated: the output paused)
    first, second = _trigger_logs(airflow, run_id)[:2]
    assert "holding after epoch 2" in first and re.search(r"epoch [3-8] loss", second)
    assert f"job {job_id}: reservation released" in text
    with Ledger.from_url(airflow.cfg["ledger_url"]) as ledger:
        assert ledger.live_reservations() == []
    assert leftovers(job_id) == ""
    assert not (Path.home() / ".hetero-gpu" / "run" / job_id).exists()


def _deferred_command_run(airflow) -> tuple[str, str, callable]:
    """Trigger ``hg_command_test`` (the job that traps SIGTERM) and wait until its trigger relays
    it: (run id, job id, the trigger logs' text so far)."""
    from airflow_hetero_gpu.launch.command import JOB_ENV
    from airflow_hetero_gpu.testing import procs

    dag_id, task_id = "hg_command_test", "run"
    run_id = airflow.trigger(dag_id)
    job_id = default_job_id(dag_id, task_id, run_id)
    watched = lambda: "".join(_trigger_logs(airflow, run_id, dag_id, task_id))  # noqa: E731
    airflow.wait_for(lambda: "stubborn started" in watched() and "watched from the triggerer" in watched(),
                     timeout=300, what="the job relayed by the trigger")
    assert airflow.task_state(dag_id, run_id, task_id) == "deferred"          # no worker slot held
    assert procs.with_env(JOB_ENV, job_id)
    with Ledger.from_url(airflow.cfg["ledger_url"]) as ledger:
        assert [r.job_id for r in ledger.live_reservations()] == [job_id]
    return run_id, job_id, watched


def _released(airflow) -> bool:
    with Ledger.from_url(airflow.cfg["ledger_url"]) as ledger:
        return ledger.live_reservations() == []


def test_a_task_marked_failed_while_deferred_has_its_job_stopped_from_the_triggerer(deployment):
    """The task is marked failed through the REST API while the triggerer watches its job (no
    worker holds it): Airflow cancels the trigger as a user's action and calls its ``on_kill``,
    which sends SIGTERM on every host, waits the kill grace and SIGKILLs what is left (the job
    here traps SIGTERM and goes on), then releases the reservation. Nothing of the job is left
    on the hosts; the task stays failed."""
    from airflow_hetero_gpu.launch.command import JOB_ENV
    from airflow_hetero_gpu.testing import procs
    from airflow_hetero_gpu.triggers.training import KILL_GRACE_S

    airflow = deployment
    dag_id, task_id = "hg_command_test", "run"
    run_id, job_id, watched = _deferred_command_run(airflow)

    with airflow.client() as client:
        r = client.patch(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}",
                         json={"new_state": "failed"})
    marked = time.monotonic()
    assert r.status_code == 200, r.text
    airflow.wait_for(lambda: not procs.with_env(JOB_ENV, job_id), timeout=180, what="the job's processes gone",
                     poll=0.2)
    gone_after = time.monotonic() - marked

    airflow.wait_for(lambda: _released(airflow), timeout=120, what="the reservation released")
    text = watched()
    # the trigger's on_kill (a user's action: Airflow calls it, not the triggerer's stop)
    assert "Trigger cancelled by user action, invoking on_kill" in text, text[-4000:]
    assert f"task killed: stopping job {job_id} on every host" in text, text[-4000:]
    # the stop goes on in the triggerer's thread after Airflow stops waiting for on_kill (it cancels a
    # killed trigger again at each loop): its last lines are in the triggerer's own log
    triggerer = airflow.component_log("triggerer")
    for host in ("node01", "node02"):
        assert re.search(rf"job {re.escape(job_id)} on {host}: ended \d+ process", triggerer), triggerer[-4000:]
    assert f"job {job_id}: reservation released" in triggerer + text, triggerer[-4000:]
    # SIGTERM came first (the job logged it on every host) and did not end it: the SIGKILL after the grace did
    run_dir = Path.home() / ".hetero-gpu" / "run" / job_id
    for host in ("node01", "node02"):
        assert "TERM received" in (run_dir / f"{host}.out").read_text(errors="replace"), host
    assert gone_after >= KILL_GRACE_S, gone_after
    # each host's supervisor (not the job's: it carries no marker) sees its job gone and exits
    airflow.wait_for(lambda: leftovers(job_id) == "", timeout=60, what="nothing of the job left on the hosts")
    assert airflow.task_state(dag_id, run_id, task_id) == "failed"


def _launches(job_id: str) -> dict[str, int]:
    """The job's processes on the hosts, counted by their launch's token (``HETERO_GPU_LAUNCH``)."""
    from airflow_hetero_gpu.launch.command import JOB_ENV, LAUNCH_ENV
    from airflow_hetero_gpu.testing import procs

    out: dict[str, int] = {}
    for pid in procs.with_env(JOB_ENV, job_id):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        token = next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(f"{LAUNCH_ENV}=".encode())), "?")
        out[token] = out.get(token, 0) + 1
    return out


class _Sampler(threading.Thread):
    """Every 0.2 s: the job's processes by launch, and whether the ledger holds its reservation."""

    def __init__(self, ledger_url: str, job_id: str):
        super().__init__(daemon=True)
        self.ledger_url, self.job_id = ledger_url, job_id
        self.samples: list[tuple[float, dict[str, int], bool]] = []
        self.done = threading.Event()

    def run(self) -> None:
        with Ledger.from_url(self.ledger_url) as ledger:
            while not self.done.is_set():
                launches = _launches(self.job_id)
                held = ledger.get(self.job_id) is not None
                self.samples.append((time.monotonic(), launches, held))
                self.done.wait(0.2)


def test_a_task_cleared_while_deferred_has_its_job_stopped_and_its_new_try_launches_afresh(deployment):
    """The task is cleared through the REST API while the triggerer watches its job. Airflow sets
    the task instance's state to none and drops its trigger; the triggerer cancels the trigger as a
    user's action and calls its ``on_kill`` (SIGTERM, the kill grace, SIGKILL: the job traps
    SIGTERM; then the reservation released). The task's new try reads the handle the first try
    stored, finds that job stopped, and launches afresh: a second launch on GPUs no process of the
    first job holds any more, which ends ``success``. Sampled every 0.2 s: never the processes of
    both launches at once, never a process of the job without its reservation."""
    airflow = deployment
    dag_id, task_id = "hg_command_test", "run"
    run_id, job_id, watched = _deferred_command_run(airflow)
    (first,) = _launches(job_id)
    sampler = _Sampler(airflow.cfg["ledger_url"], job_id)
    sampler.start()
    try:
        with airflow.client() as client:
            r = client.post(f"/api/v2/dags/{dag_id}/clearTaskInstances", json={
                "dry_run": False, "dag_run_id": run_id, "task_ids": [task_id], "only_failed": False})
        assert r.status_code == 200, r.text
        assert [ti["task_id"] for ti in r.json()["task_instances"]] == [task_id], r.text
        # the new try's launch: processes of another launch token
        second = airflow.wait_for(lambda: [t for t in _launches(job_id) if t != first] or None, timeout=300,
                                  what="the new try's launch", poll=0.2)[0]
        assert airflow.query("select try_number from task_instance where dag_id = ? and run_id = ? and task_id = ?",
                             dag_id, run_id, task_id) == [(2,)]
        airflow.wait_for(lambda: any(second in launches for _, launches, _ in sampler.samples), timeout=60,
                         what="the sampler seeing the second launch", poll=0.2)
        # the new try deferred, and the scheduler has handled its worker's exit on deferring: a
        # job that ends (and so wakes the task) before then meets Airflow 3.3's race that fails a
        # task resumed before that stale exit is handled (apache/airflow#72716; durability.md)
        deferred_exit = re.compile(
            rf"Received executor event with state \w+ for task instance TaskInstanceKey\(dag_id='{dag_id}', "
            rf"task_id='{task_id}', run_id='{run_id}', try_number=2,")
        airflow.wait_for(lambda: deferred_exit.search(airflow.component_log("scheduler")), timeout=300,
                         what="the scheduler handling the new try's exit on deferring", poll=0.5)
        (Path(airflow.root) / f"release-{run_id}").touch()
        state = airflow.wait_for_state(dag_id, run_id, task_id, {"success", "failed"}, timeout=300)
    finally:
        sampler.done.set()
        sampler.join(10)
    log = airflow.task_log(dag_id, run_id, task_id)
    triggerer = airflow.component_log("triggerer")
    assert state == "success", log[-6000:] + triggerer[-3000:]
    text = watched()
    assert "Trigger cancelled by user action, invoking on_kill" in text, text[-4000:]
    assert f"task killed: stopping job {job_id} on every host" in text, text[-4000:]
    assert log.count(f"job {job_id}: starting on") == 2, log[-6000:]                    # a second launch
    # the new try started before the trigger's stop, or beside it: it never reattached, it waited for the stop
    assert "reattaching" not in log, log[-6000:]
    assert f"job {job_id}: try 1 handed it to a trigger and ended while deferred" in log, log[-6000:]
    # never both launches' processes at once (no GPU held twice), never a process without the reservation
    both = [s for s in sampler.samples if first in s[1] and second in s[1]]
    assert not both, both[:3]
    unheld = [s for s in sampler.samples if s[1] and not s[2]]
    assert not unheld, unheld[:3]
    # the first launch's processes were gone before the second's appeared
    last_first = max(t for t, launches, _ in sampler.samples if first in launches)
    first_second = min(t for t, launches, _ in sampler.samples if second in launches)
    assert last_first < first_second
    airflow.wait_for(lambda: _released(airflow), timeout=120, what="the reservation released")
    airflow.wait_for(lambda: leftovers(job_id) == "", timeout=60, what="nothing of the job left on the hosts")
