"""The durable operator's arguments and its handle in the task state store: bad values fail in
one line before anything is launched or reserved; a handle of another format version too."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.operators.durable import HANDLE_KEY, HANDLE_VERSION, DurableJob
from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator, default_job_id
from ledger_files import new_ledger

BASE = {"task_id": "t", "gpu_count": 2, "script": "train.py", "ssh_conn_ids": ["a"]}


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"lease_seconds": 600}, "lease_seconds 600 is shorter than unattended_timeout 900 + preemption_grace 300 + "
                                 "15 s = 1215 s: a job whose watcher is gone runs until its hosts' dead-man switch "
                                 "stops it, and its lease must not free the GPUs before; raise lease_seconds (or "
                                 "leave it unset) or lower unattended_timeout"),
        ({"lease_seconds": 60, "unattended_timeout": 40, "preemption_grace": 10},
         "lease_seconds 60 is shorter than unattended_timeout 40 + preemption_grace 10 + 15 s = 65 s: a job whose "
         "watcher is gone runs until its hosts' dead-man switch stops it, and its lease must not free the GPUs "
         "before; raise lease_seconds (or leave it unset) or lower unattended_timeout"),
        ({"unattended_timeout": -5}, "unattended_timeout: expected a number of seconds >= 1, got -5"),
        ({"unattended_timeout": "soon"}, "unattended_timeout: expected a number of seconds >= 1, got 'soon'"),
        ({"unattended_timeout": True}, "unattended_timeout: expected a number of seconds >= 1, got True"),
        ({"unattended_timeout": float("nan")}, "unattended_timeout: expected a number of seconds >= 1, got nan"),
        ({"unattended_timeout": 10 ** 9}, "unattended_timeout: expected at most 2592000 seconds (30 days), got 1000000000"),
        ({"durable": "yes"}, "durable: expected True or False, got 'yes'"),
    ],
)
def test_bad_durable_arguments_fail_in_one_line(changes, message):
    op = HeteroTrainOperator(**{**BASE, **changes})
    with pytest.raises(AirflowFailException) as err:
        op._validate()
    assert str(err.value) == message


@pytest.mark.parametrize(
    "changes, lease",
    [
        ({}, 900 + 300 + 15),                                           # the default: the switch fits
        ({"unattended_timeout": 60, "preemption_grace": 30}, 105),
        ({"durable": False}, 120),                                      # as before
        ({"durable": False, "lease_seconds": 9}, 9),
        ({"lease_seconds": 5000}, 5000),
    ],
)
def test_the_lease_defaults_to_outlive_the_switch(changes, lease):
    op = HeteroTrainOperator(**{**BASE, **changes})
    assert op._validate().lifecycle.lease_seconds == lease
    assert op.lease_seconds == changes.get("lease_seconds")  # the argument itself stays as given


class Store:
    def __init__(self, value=None):
        self.values = {} if value is None else {HANDLE_KEY: value}

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value, retention=None):
        self.values[key] = value

    def delete(self, key):
        self.values.pop(key, None)


def _context(store):
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id="t", try_number=2, map_index=-1, stats_tags={})
    return {"ti": ti, "task_state_store": store} if store is not None else {"ti": ti}


@pytest.mark.parametrize("stored", [{"version": 0, "job_id": "x"}, {"version": HANDLE_VERSION + 1},
                                    "a-job-id", {"version": HANDLE_VERSION, "job_id": "someone-else"}])
def test_a_handle_of_another_version_fails_in_one_line_and_nothing_is_reserved(tmp_path, stored):
    url = new_ledger(tmp_path / "ledger.db")
    op = HeteroTrainOperator(**{**BASE, "ledger_url": url})
    job_id = default_job_id("d", "t", "r", -1)
    if isinstance(stored, dict) and stored.get("job_id") == "x":
        stored = {**stored, "job_id": job_id}
    with pytest.raises(AirflowFailException) as err:
        op.execute(_context(Store(stored)))
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"task_state_store entry '{HANDLE_KEY}' has handle format version")
    assert "nothing was launched or reserved" in message
    with Ledger.from_url(url) as ledger:
        assert ledger.live_reservations() == []


def test_without_a_task_state_store_the_task_runs_as_before(capsys):
    op = HeteroTrainOperator(**BASE)
    job = DurableJob(op.specs.lifecycle, op.runtime, _context(None), "j")
    assert not job.on and job.read() is None
    said = [line for line in capsys.readouterr().out.splitlines() if "no task state store" in line]
    assert len(said) == 1 and "runs as before" in said[0]


def test_the_handle_is_stored_with_its_version_and_forgotten():
    op = HeteroTrainOperator(**BASE)
    store = Store()
    job = DurableJob(op.specs.lifecycle, op.runtime, _context(store), "j")
    job.launching("tok", [("node01", 0), ("node02", 1)], {"pool": "p", "gpus": []}, [("node01", 0), ("node02", 1)], 0)
    handle = store.values[HANDLE_KEY]
    assert handle["version"] == HANDLE_VERSION and handle["job_id"] == "j" and handle["launch"] == "tok"
    assert handle["hosts"] == ["node01", "node02"] and handle["reservation"]["job_id"] == "j"
    assert job.read() == handle
    job.forget()
    assert job.read() is None


def test_a_retry_that_cannot_reach_a_host_of_the_job_launches_nothing_and_releases_nothing(tmp_path, monkeypatch):
    """The handle names a host the retry cannot ask while the job's reservation lives: the job may
    still run there, so its GPUs stay held (the task's retries try again later), and nothing is
    launched. (Once the lease has run out: tests/test_preempt_unreachable.py.)"""
    from airflow.sdk.exceptions import AirflowException

    from airflow_hetero_gpu.core.model import PlanRequest
    from airflow_hetero_gpu.launch.supervisor import HostStatus
    from test_ledger_queue import LONG, fill

    url = new_ledger(tmp_path / "ledger.db")
    with Ledger.from_url(url) as led:
        fill(led)
        assert led.enqueue("j", PlanRequest(2), lease_seconds=LONG).admitted
        led.take_admission("j")
    op = HeteroTrainOperator(**{**BASE, "ledger_url": url})
    store = Store({"version": HANDLE_VERSION, "job_id": "j", "launch": "tok", "hosts": ["node01", "node02"]})
    job = DurableJob(op.specs.lifecycle, op.runtime, _context(store), "j")
    monkeypatch.setattr(job, "host_status", lambda handle: {
        "node01": HostStatus("node01", "running"), "node02": HostStatus("node02", "unknown", detail="cannot connect")})
    monkeypatch.setattr(job, "abandon", lambda handle: pytest.fail("abandoned a job that may still run"))
    with pytest.raises(AirflowException, match=r"cannot tell whether the earlier try's job still runs \(node01: "
                                               r"running; node02: unknown \(cannot connect\)\); nothing was launched"):
        job.resume()
    assert store.values[HANDLE_KEY]["launch"] == "tok"   # kept for the next try
    with Ledger.from_url(url) as led:
        assert led.get("j") is not None


def test_the_run_trigger_is_rebuilt_from_its_arguments_without_a_password(tmp_path):
    """What a triggerer restart does: the trigger's serialized arguments make the same trigger;
    a ledger named by a connection travels by name only."""
    from airflow_hetero_gpu.operators.run_phase import trigger_kwargs
    from airflow_hetero_gpu.triggers.training import TrainingRunTrigger

    op = HeteroTrainOperator(**{**BASE, "ssh_conn_ids": {"node01": "c1", "node02": "c2"}, "ledger_conn_id": "gpu_ledger",
                                "deferrable": True, "unattended_timeout": 60, "preemption_signal": "SIGUSR1",
                                "preemption_grace": 7, "cluster_config": {"weights": {"topology": 2}}})
    kwargs = trigger_kwargs(op._validate(), op.runtime, "job-1", "tok", [("node01", 0, None), ("node02", 1, None)])
    assert kwargs["ledger_conn_id"] == "gpu_ledger" and kwargs["ledger_url"] is None
    assert kwargs["lease_seconds"] == 60 + 7 + 15 and kwargs["renew_every"] == 30
    assert kwargs["preemption_signal"] == "USR1" and kwargs["ssh_conn_ids"] == {"node01": "c1", "node02": "c2"}
    trigger = TrainingRunTrigger(**kwargs)
    classpath, again = trigger.serialize()
    assert classpath == "airflow_hetero_gpu.triggers.training.TrainingRunTrigger"
    assert TrainingRunTrigger(**again).serialize() == (classpath, again)
    assert again["gpus"] == [["node01", 0, None], ["node02", 1, None]] and trigger.hosts == ["node01", "node02"]



def test_handing_the_job_to_a_trigger_notes_the_try_and_taking_it_back_drops_it():
    op = HeteroTrainOperator(**BASE)
    store = Store()
    job = DurableJob(op.specs.lifecycle, op.runtime, _context(store), "j")
    job.launching("tok", [("node01", 0)], {"pool": "p", "gpus": []}, [("node01", 0)], 0)
    job.handing_over()
    assert store.values[HANDLE_KEY]["deferred_try"] == 2 and store.values[HANDLE_KEY]["launch"] == "tok"
    job.taken_back(job.read())
    assert "deferred_try" not in store.values[HANDLE_KEY] and store.values[HANDLE_KEY]["launch"] == "tok"


def _reserved(tmp_path, lease_seconds: float) -> str:
    from airflow_hetero_gpu.core.model import PlanRequest
    from test_ledger_queue import fill

    url = new_ledger(tmp_path / "ledger.db")
    with Ledger.from_url(url) as led:
        fill(led)
        assert led.enqueue("j", PlanRequest(2), lease_seconds=lease_seconds).admitted
        led.take_admission("j")
    return url


def test_a_try_after_one_that_ended_deferred_waits_for_the_reservation_and_never_reattaches(tmp_path, monkeypatch):
    """Try 1 handed the job to a trigger and ended while deferred (cleared): try 2 does not ask the
    hosts whether it runs (it would reattach to a job the trigger's ``on_kill`` is stopping); it
    waits until the reservation is gone (here its 1 s lease runs out), then sweeps and launches
    afresh."""
    url = _reserved(tmp_path, lease_seconds=1)
    op = HeteroTrainOperator(**{**BASE, "ledger_url": url})
    store = Store({"version": HANDLE_VERSION, "job_id": "j", "launch": "tok", "hosts": ["node01"],
                   "deferred_try": 1})
    job = DurableJob(op.specs.lifecycle, op.runtime, _context(store), "j")
    monkeypatch.setattr(job, "host_status", lambda handle: pytest.fail("asked the hosts, to reattach"))
    abandoned = []

    def abandon(handle):
        with Ledger.from_url(url) as led:
            abandoned.append(led.get("j"))
        return []

    monkeypatch.setattr(job, "abandon", abandon)
    found = job.resume()
    assert found.handle is None and found.result is None           # a fresh launch
    assert abandoned == [None]                                     # swept only once the reservation was gone


def test_the_try_that_deferred_reattaches_when_its_trigger_wakes_it(tmp_path, monkeypatch):
    from airflow_hetero_gpu.launch.supervisor import HostStatus

    url = _reserved(tmp_path, lease_seconds=100_000)
    op = HeteroTrainOperator(**{**BASE, "ledger_url": url})
    store = Store({"version": HANDLE_VERSION, "job_id": "j", "launch": "tok", "hosts": ["node01"],
                   "deferred_try": 2})
    job = DurableJob(op.specs.lifecycle, op.runtime, _context(store), "j")
    monkeypatch.setattr(job, "host_status", lambda handle: {"node01": HostStatus("node01", "running")})
    monkeypatch.setattr(job, "abandon", lambda handle: pytest.fail("abandoned the job its own try deferred"))
    assert job.resume().handle["launch"] == "tok"
