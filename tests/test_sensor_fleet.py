"""The health sensor over a hosts file and ONE Airflow ssh connection (a large fleet's form).

Real parts: the emulated cluster's hosts over a real sshd on loopback (the asyncssh-served
embedded fleet where worker processes are counted), a real SQLite ledger, Airflow's own
connection lookup from ``AIRFLOW_CONN_*`` variables.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from airflow.providers.common.compat.sdk import AirflowFailException

from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.sensors.gpu_health import GpuHealthSensor
from airflow_hetero_gpu.testing.demo import small_hosts
from airflow_hetero_gpu.triggers.gpu_health import GpuHealthTrigger
from cluster_fixtures import embedded_cluster, emulated_cluster  # noqa: F401
from ledger_files import new_ledger
from shard_processes import workers_of

CONN_ID = "gpu_fleet"
WAIT_S = 120.0  # safety net of the waits below; each ends on the event it waits for


def fleet_connection(monkeypatch, cluster, **extra) -> None:
    """``gpu_fleet``: the cluster's login, the port of its first host, its key, its known_hosts."""
    extra = {"key_file": str(cluster.identity_file), "known_hosts": str(cluster.known_hosts_path), **extra}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({
        "conn_type": "ssh", "host": "not-used.invalid", "port": cluster.hosts[0].port, "login": cluster.user,
        "extra": {k: v for k, v in extra.items() if v is not None}}))


def hosts_file(cluster, path: Path) -> Path:
    """The first host without a user or a port (the connection's), the others without a user."""
    first, *others = cluster.hosts
    path.write_text("# the fleet\n" + f"{first.name}={first.address}\n"
                    + "".join(h.hosts_arg(None) + "  # no user\n" for h in others), encoding="utf-8")
    return path


def sensor(path, ledger_url, **kwargs) -> GpuHealthSensor:
    args = dict(task_id="gpu_health", hosts_file=str(path), ssh_conn_id=CONN_ID, ledger_url=ledger_url,
                connect_timeout=5, command_timeout=10, retries=1, poke_interval=0)
    args.update(kwargs)
    return GpuHealthSensor(**args)


def deferred_trigger(s: GpuHealthSensor) -> GpuHealthTrigger:
    """The trigger ``s`` defers to, rebuilt from its serialized form as the triggerer does."""
    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferral:
        s.execute({})
    path, kwargs = deferral.value.trigger.serialize()
    assert path == "airflow_hetero_gpu.triggers.gpu_health.GpuHealthTrigger"
    return GpuHealthTrigger(**json.loads(json.dumps(kwargs)))


async def first_event(trigger: GpuHealthTrigger) -> dict:
    async for event in trigger.run():
        await trigger.cleanup()
        return event.payload
    raise AssertionError("the trigger ended without an event")


def collections(url: str) -> int:
    with Ledger.open_existing(url) as led:
        return len(led.collections(datetime(2000, 1, 1, tzinfo=timezone.utc)))


# --- the watch, poking and deferred -------------------------------------------------------------------
def test_poke_and_deferred_watch_a_hosts_file_through_one_connection(emulated_cluster, tmp_path,  # noqa: F811
                                                                     monkeypatch):
    hosts = small_hosts(3, gpus=2)
    hosts[0].gpus[1].ecc_uncorrected_volatile = 2
    hosts[2].xid.append({"time": 99.5, "gpu": 0, "xid": 48})
    cluster = emulated_cluster(hosts)
    fleet_connection(monkeypatch, cluster)
    path = hosts_file(cluster, tmp_path / "hosts")

    url = new_ledger(tmp_path / "poke.db")
    poking = sensor(path, url, watch_duration=0)
    try:
        poked = poking.poke({}).xcom_value
    finally:
        poking.health_watch.hook.close()
    assert poked["checks"] == 1 and collections(url) == 1
    assert [(e["host"], e["index"], e["reasons"]) for e in poked["evictions"]] == [
        ("node01", 1, ["ecc"]), ("node03", 0, ["xid-48"])]
    with Ledger.open_existing(url) as led:
        assert {str(k): v for k, v in led.evicted_map().items()} == {"node01:1": ("ecc",), "node03:0": ("xid-48",)}

    other = new_ledger(tmp_path / "deferred.db")
    deferred = sensor(path, other, watch_duration=0, deferrable=True)
    trigger = deferred_trigger(deferred)
    assert (trigger.hosts_file, trigger.ssh_conn_id, trigger.ssh_conn_ids) == (str(path), CONN_ID, None)
    event = asyncio.run(first_event(trigger))
    assert event["status"] == "success", event
    assert deferred.execute_complete({}, event) == event["result"] == poked
    assert collections(other) == 1


def test_the_execute_of_a_poking_sensor_closes_its_connections(embedded_cluster, tmp_path, monkeypatch):  # noqa: F811
    cluster = embedded_cluster(small_hosts(2, gpus=1))
    fleet_connection(monkeypatch, cluster)
    s = sensor(hosts_file(cluster, tmp_path / "hosts"), new_ledger(tmp_path / "ledger.db"), watch_duration=0)
    assert s.execute({})["checks"] == 1
    kept = s.health_watch.hook.client_factory()
    assert kept.kept() == 0  # closed when the task ended
    assert s.health_watch.hook.hosts.keys() == {"node01", "node02"}


# --- worker processes of a large fleet: gone when the trigger ends ---------------------------------
def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _never_met_gate(embedded_cluster, tmp_path, monkeypatch):  # noqa: F811
    """(the emulated cluster, a ledger URL, the deferred trigger) of a gate over a 4-host fleet
    that never opens."""
    cluster = embedded_cluster(small_hosts(4, gpus=1))
    fleet_connection(monkeypatch, cluster)
    url = new_ledger(tmp_path / "ledger.db")
    gate = sensor(hosts_file(cluster, tmp_path / "hosts"), url, mode_kind="gate", min_healthy=99,
                  deferrable=True, poke_interval=0.1)
    return cluster, url, deferred_trigger(gate)


def test_the_triggers_worker_processes_end_with_it_after_the_check_in_flight(embedded_cluster, tmp_path,  # noqa: F811
                                                                              monkeypatch):
    """A gate that never opens, collected by two worker processes (a large fleet's way) that keep
    their connections. The trigger is cancelled while a slow check is in flight (or about to
    start: it then does not): cleanup returns once that check is over and the workers and their
    connections are gone."""
    cluster, url, trigger = _never_met_gate(embedded_cluster, tmp_path, monkeypatch)
    trigger.hook_kwargs["processes"] = 2  # as a fleet of 128 hosts or more gets on two CPUs

    async def run():
        task = asyncio.ensure_future(trigger.run().__anext__())
        deadline = time.monotonic() + WAIT_S
        while collections(url) < 1 and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not task.done(), task.result().payload
        workers = workers_of(os.getpid())
        for host in cluster.hosts:  # the next check is slow
            cluster.set_state(host.name, nvidia_smi_delay_s=2)
        while not trigger._check_lock.locked() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        checks_before = collections(url)
        task.cancel()
        await trigger.cleanup()
        return workers, checks_before

    workers, checks_before = asyncio.run(run())
    assert len(workers) == 2
    assert not any(_running(pid) for pid in workers), workers
    assert trigger._hook is None and not trigger._check_lock.locked() and not trigger._closer.is_alive()
    assert collections(url) in (checks_before, checks_before + 1)  # a check in flight is stored whole


# --- mistakes: one line, no retry -----------------------------------------------------------------------
@pytest.fixture
def offline(tmp_path, monkeypatch):
    """A hosts file of two hosts nobody needs to reach, a fleet connection to them, a ledger."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    path = tmp_path / "hosts"
    path.write_text("gpu-a=10.0.0.1\ngpu-b=admin@10.0.0.2:2222\n")

    def connect(**extra):
        extra = {"known_hosts": str(known), **extra}
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({
            "conn_type": "ssh", "login": "gpu", "extra": {k: v for k, v in extra.items() if v is not None}}))

    connect()
    return connect, path, new_ledger(tmp_path / "ledger.db")


def _refused(s: GpuHealthSensor) -> str:
    with pytest.raises(AirflowFailException) as err:
        s.poke({})
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("extra, words", [
    ({"no_host_key_check": "true"}, "'no_host_key_check' extra"),
    ({"no_host_key_check": True}, "'no_host_key_check' extra"),
    ({"ignore_hostkey_verification": "true"}, "'ignore_hostkey_verification' extra"),
    ({"host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"},
     "'host_key' extra"),
    ({"allow_host_key_change": "true"}, "'allow_host_key_change' extra"),
    ({"private_key": "-----BEGIN OPENSSH PRIVATE KEY-----"}, "'key_file' extra instead of 'private_key'"),
    ({"known_hosts": "/nonexistent/known_hosts"}, "known_hosts file '/nonexistent/known_hosts' does not exist"),
])
def test_a_connection_that_cannot_verify_a_fleet_is_refused(offline, extra, words):
    connect, path, url = offline
    connect(**extra)
    message = _refused(sensor(path, url))
    assert f"Airflow connection {CONN_ID!r}" in message and words in message, message


def test_no_host_key_check_false_is_accepted(offline):
    from airflow.sdk import BaseHook

    from airflow_hetero_gpu.hooks.fleet_connection import fleet_access

    connect, _, _ = offline
    connect(no_host_key_check="false")
    access = fleet_access(BaseHook.get_connection(CONN_ID), CONN_ID)
    assert (access.user, access.port, access.key_file) == ("gpu", 22, None)


def test_hosts_file_mistakes_name_the_file_and_line(offline, tmp_path):
    _, path, url = offline
    path.write_text("gpu-a=10.0.0.1\n# fine\ngpu-b=10.0.0.2:99999\n")
    assert _refused(sensor(path, url)) == (f"{path}:3: invalid host entry 'gpu-b=10.0.0.2:99999': "
                                           "port '99999' must be a number 1-65535")
    missing = tmp_path / "nope"
    assert _refused(sensor(missing, url)) == f"hosts file {missing}: No such file or directory"

    path.write_text("gpu-a=10.0.0.1\ngpu-a=10.0.0.3\n")
    event = asyncio.run(first_event(deferred_trigger(sensor(path, url, deferrable=True))))
    assert event == {"status": "error", "mistake": True,
                     "message": f"{path}:2: host 'gpu-a' appears twice (first on line 1)"}
    with pytest.raises(AirflowFailException, match=f"^GPU health check failed: {path}:2: host 'gpu-a'"):
        GpuHealthSensor(task_id="t").execute_complete({}, event)


def test_the_hosts_take_the_connections_login_and_port_where_they_name_none(offline):
    connect, path, url = offline
    s = sensor(path, url)
    targets = s._hook().ssh_targets()
    assert {n: (t.user, t.address, t.port) for n, t in targets.items()} == {
        "gpu-a": ("gpu", "10.0.0.1", 22), "gpu-b": ("admin", "10.0.0.2", 2222)}


def test_how_the_hosts_are_named_is_checked(offline):
    connect, path, url = offline
    both = _refused(sensor(path, url, ssh_conn_ids=["gpu_a"]))
    assert "ssh_conn_ids" in both and "hosts_file" in both and "not both" in both
    assert "go together" in _refused(sensor(path, url, ssh_conn_id=None))
    assert "go together" in _refused(GpuHealthSensor(task_id="t", ssh_conn_id=CONN_ID, ledger_url=url))
    with pytest.raises(AirflowFailException, match="not both"):  # refused before deferring, too
        sensor(path, url, ssh_conn_ids="gpu_a", deferrable=True).execute({})

    missing = _refused(sensor(path, url, ssh_conn_id="no_such_conn"))
    assert missing.startswith("ssh_conn_id 'no_such_conn': the Airflow connection cannot be read"), missing
    event = asyncio.run(first_event(deferred_trigger(sensor(path, url, ssh_conn_id="no_such_conn",
                                                            deferrable=True))))
    assert event["mistake"] and event["message"].startswith("ssh_conn_id 'no_such_conn': "), event


# --- the fleet day's health watch DAG, as the day deploys it ---------------------------------------
def test_the_fleet_days_watch_dag_checks_its_hosts_file_through_one_connection(embedded_cluster,  # noqa: F811
                                                                              tmp_path):
    """``fleet_day_health_watch`` with the environment the fleet day gives its deployment (one
    connection per host for the training tasks, the hosts file and its one connection for the
    watch), its ledger here a SQLite file and its watch one check long, in ``airflow dags test``
    (the trigger runs inline): the check reaches every host of the hosts file without the
    per-host connections."""
    from types import SimpleNamespace

    from airflow_hetero_gpu.testing.airflow_env import airflow_env, dags_test, migrate
    from airflow_hetero_gpu.testing.fleet_day import DAGS, FLEET_CONN_ID, DayConfig, _environment

    hosts = small_hosts(3, gpus=2)
    hosts[1].gpus[0].ecc_uncorrected_volatile = 1
    cluster = embedded_cluster(hosts)
    path = cluster.write_hosts_file(tmp_path / "hosts")
    url = new_ledger(tmp_path / "ledger.db")
    day = _environment(DayConfig(hosts=3), cluster, SimpleNamespace(port=5432), "postgresql://unused/ledger",
                       tmp_path / "results", path)
    watch = json.loads(day["HG_FLEET_DAY"])
    assert (watch["hosts_file"], watch["fleet_conn_id"]) == (str(path), FLEET_CONN_ID)
    watch.update(watch_seconds=0, watch_interval=1)
    day.update(HG_FLEET_DAY=json.dumps(watch), AIRFLOW__HETERO_GPU__LEDGER_URL=url)
    del day["AIRFLOW__HETERO_GPU__LEDGER_CONN_ID"]
    per_host = [name for name in day if name.startswith("AIRFLOW_CONN_GPU_")]
    assert len(per_host) == 3
    for name in per_host:  # the watch must not need them (the training tasks do)
        del day[name]
    env = airflow_env(tmp_path / "airflow", DAGS, day)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                      os.environ.get("PYTHONPATH")]))
    migrate(env)
    run = dags_test("fleet_day_health_watch", env, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    assert "running trigger in line" in log and "GPU evicted: node02:0" in log, log[-4000:]
    with Ledger.open_existing(url) as led:
        assert {str(k) for k in led.evicted_map()} == {"node02:0"}
        stored = led.inventory().hosts
    assert {name: h.ok for name, h in stored.items()} == {"node01": True, "node02": True, "node03": True}


def test_the_deployments_settings_name_the_hosts_file_and_its_connection(offline, monkeypatch):
    """``[hetero_gpu] hosts_file`` and ``fleet_conn_id``: the shipped watch DAG, given no hosts,
    watches a large fleet; they win over ``[hetero_gpu] ssh_conn_ids`` for the sensor, an
    argument wins over them."""
    connect, path, url = offline
    monkeypatch.setenv("AIRFLOW__HETERO_GPU__SSH_CONN_IDS", "gpu_a")
    monkeypatch.setenv("AIRFLOW__HETERO_GPU__HOSTS_FILE", str(path))
    plain = GpuHealthSensor(task_id="t", ledger_url=url)
    assert _refused(plain) == "[hetero_gpu] hosts_file needs [hetero_gpu] fleet_conn_id: the ssh connection " \
                              "that reaches its hosts"
    monkeypatch.setenv("AIRFLOW__HETERO_GPU__FLEET_CONN_ID", CONN_ID)
    assert set(GpuHealthSensor(task_id="t", ledger_url=url)._hook().ssh_targets()) == {"gpu-a", "gpu-b"}
    assert GpuHealthSensor(task_id="t", ledger_url=url, ssh_conn_ids=["x"])._hook().hosts == {"x": "x"}
    trigger = deferred_trigger(GpuHealthSensor(task_id="t", ledger_url=url, deferrable=True))
    assert (trigger.hosts_file, trigger.ssh_conn_id, trigger.ssh_conn_ids) == (str(path), CONN_ID, None)


KILLED_TRIGGERER = '''
import asyncio, json, os, sys
from airflow_hetero_gpu.triggers.gpu_health import GpuHealthTrigger

trigger = GpuHealthTrigger(**json.loads(sys.argv[1]))

async def main():
    async for event in trigger.run():
        print("event", json.dumps(event.payload), flush=True)

asyncio.run(main())
'''


def test_a_killed_triggerer_leaves_no_worker_process(embedded_cluster, tmp_path, monkeypatch):  # noqa: F811
    """The trigger in a process of its own (as in the triggerer), its worker processes started
    from the event loop's worker thread; the process is killed (SIGKILL: no cleanup runs) after
    its first check: every worker process stops by itself."""
    import signal
    import subprocess
    import sys

    cluster, url, trigger = _never_met_gate(embedded_cluster, tmp_path, monkeypatch)
    kwargs = trigger.serialize()[1]
    kwargs["hook_kwargs"]["processes"] = 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                    os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-c", KILLED_TRIGGERER, json.dumps(kwargs)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while (collections(url) < 1 or len(workers_of(proc.pid)) < 2) and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = workers_of(proc.pid)
        assert proc.poll() is None and len(workers) == 2, (workers, proc.poll())
        proc.send_signal(signal.SIGKILL)
        proc.wait(WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_running(pid) for pid in workers), workers
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
