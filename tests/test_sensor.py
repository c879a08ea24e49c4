"""GpuHealthSensor against the emulated cluster: real sshd, Airflow ssh connections, a SQLite ledger.

Each test pokes the sensor directly (poke mode) and looks at what a planner would see: the GPUs
available now, with the ledger's evictions and reservations applied.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_hetero_gpu.core import watch
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.sensors.gpu_health import GpuHealthSensor
from airflow_hetero_gpu.testing import procs
from airflow_hetero_gpu.testing.demo import A100_80, H200, make_gpus, small_hosts
from cluster_fixtures import embedded_cluster, emulated_cluster  # noqa: F401
from airflow_hetero_gpu.testing.state import gpu_uuid
from airflow_hetero_gpu.triggers.gpu_health import GpuHealthTrigger
from ledger_files import new_ledger

A100 = "NVIDIA A100-SXM4-80GB"
REPO = Path(__file__).resolve().parents[1]


# --- Airflow connections for the emulated hosts ------------------------------------------------------
def connection_env(cluster) -> tuple[dict[str, str], dict[str, str]]:
    """(``AIRFLOW_CONN_<ID>`` variables, host name -> conn id): conn_type ssh with the host's
    address, port, user, the client key and the host's public key (host keys are verified)."""
    host_keys = {}
    for line in cluster.known_hosts_path.read_text(encoding="utf-8").splitlines():
        where, key_type, key = line.split()[:3]
        host_keys[where] = f"{key_type} {key}"
    env, ids = {}, {}
    for host in cluster.hosts:
        conn_id = "emu_" + host.name.replace("-", "_")
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps({
            "conn_type": "ssh", "host": host.address, "port": host.port, "login": cluster.user,
            "extra": {"key_file": str(cluster.identity_file), "host_key": host_keys[f"[{host.address}]:{host.port}"]},
        })
        ids[host.name] = conn_id
    return env, ids


def _fleet_starter(make_cluster, tmp_path, monkeypatch):
    """``start(hosts) -> (cluster, conn ids, ledger url)`` with the connections in the environment."""

    def start(hosts):
        cluster = make_cluster(hosts)
        env, ids = connection_env(cluster)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return cluster, ids, new_ledger(tmp_path / 'ledger.db')

    return start


@pytest.fixture
def fleet(emulated_cluster, tmp_path, monkeypatch):  # noqa: F811
    """The emulated fleet (real sshd per host) as ``start(hosts)``."""
    return _fleet_starter(emulated_cluster, tmp_path, monkeypatch)


def sensor(ids, ledger_url, **kwargs) -> GpuHealthSensor:
    args = dict(task_id="gpu_health", ssh_conn_ids=ids, ledger_url=ledger_url, connect_timeout=3,
                command_timeout=10, retries=1, poke_interval=0)
    args.update(kwargs)
    return GpuHealthSensor(**args)


def available(s: GpuHealthSensor, ledger_url: str) -> set[str]:
    """GPUs a job could get now, as the planner sees them (the sensor's last check + the ledger)."""
    with Ledger.from_url(ledger_url) as led:
        keys = watch.available_keys(s.health_watch.cluster, led.reserved_map(), led.evicted_map())
    return {str(k) for k in keys}


def reasons(s: GpuHealthSensor) -> dict[str, tuple[str, ...]]:
    return {str(g.key): g.reasons for g in s.health_watch.cluster.gpus if g.reasons}


def logged(capfd) -> str:
    """What the task logger printed since the last read (Airflow's structlog writes to the terminal)."""
    out = capfd.readouterr()
    return out.out + out.err


def evicted(ledger_url: str) -> dict[str, tuple[str, ...]]:
    with Ledger.from_url(ledger_url) as led:
        return {str(k): v for k, v in led.evicted_map().items()}


# --- S11: every fault kind, hysteresis, readmission, uncordon --------------------------------------------
def test_faults_leave_the_available_set_and_come_back(fleet):
    hosts = small_hosts(5, gpus=2)
    hosts[0].gpus[0].ecc_uncorrected_volatile = 2                       # node01:0 ecc
    hosts[0].xid.append({"time": 812.5, "gpu": 1, "xid": 79})           # node01:1 xid-79 (kernel log)
    hosts[0].xid.append({"time": 813.5, "gpu": 0, "xid": 13})           # application Xid: ignored
    hosts[1].gpus[0].lost = True                                        # node02:0 lost
    hosts[1].gpus[1].temperature_c = 93                                 # node02:1 temperature (soft)
    hosts[2].gpus[0].retired_pages_pending = True                       # node03:0 retired pages
    cluster, ids, url = fleet(hosts)
    s = sensor(ids, url, watch_duration=3600, stop_when_idle=False,
               thresholds={"soft_fault_checks": 2, "readmit_after_healthy_checks": 2})
    all_gpus = {f"node0{h}:{i}" for h in range(1, 6) for i in range(2)}

    # check 1: every GPU fault leaves the available set at once; hard faults are evicted at once
    assert s.poke({}) is False
    assert reasons(s) == {"node01:0": ("ecc",), "node01:1": ("xid-79",), "node02:0": ("lost",),
                          "node02:1": ("temperature",), "node03:0": ("retired-pages-pending",)}
    assert available(s, url) == all_gpus - set(reasons(s))
    assert evicted(url) == {"node01:0": ("ecc",), "node01:1": ("xid-79",), "node02:0": ("lost",),
                            "node03:0": ("retired-pages-pending",)}
    first = s.health_watch.last
    assert sorted((e["host"], e["index"], e["reasons"][0]) for e in first.evicted) == [
        ("node01", 0, "ecc"), ("node01", 1, "xid-79"), ("node02", 0, "lost"), ("node03", 0, "retired-pages-pending")]
    assert all(e["uuid"].startswith(("GPU-", "lost-")) for e in first.evicted)

    # check 2: the host faults leave too (unreachable), the soft fault has lasted 2 checks
    cluster.inject_fault("node04", "driver_gone")
    cluster.inject_fault("node05", "host_down")
    assert s.poke({}) is False
    unreachable = {"node04:0", "node04:1", "node05:0", "node05:1"}
    assert {k for k, v in reasons(s).items() if v == ("unreachable",)} == unreachable
    assert available(s, url) == {"node03:1"}
    assert evicted(url)["node02:1"] == ("temperature",)
    assert not unreachable & set(evicted(url))  # a network blip of one check evicts no host

    # check 3: a second failed collection evicts the unreachable hosts' GPUs; the Xid, a one-off
    # event still in the kernel log, counted once: node01:1 is back after 2 healthy checks
    assert s.poke({}) is False
    assert unreachable <= set(evicted(url))
    assert "node01:1" not in evicted(url) and available(s, url) == {"node01:1", "node03:1"}

    # the faults clear (the Xid stays in the kernel log); a new one hits node03:1
    cluster.update_gpu("node01", 0, ecc_uncorrected_volatile=0)
    cluster.update_gpu("node02", 0, lost=False)
    cluster.update_gpu("node02", 1, temperature_c=40)
    cluster.update_gpu("node03", 0, retired_pages_pending=False)
    cluster.update_gpu("node03", 1, ecc_uncorrected_volatile=1)
    cluster.clear_fault("node04", "driver_gone")
    cluster.clear_fault("node05", "host_down")
    assert s.poke({}) is False
    assert reasons(s) == {"node03:1": ("ecc",)} and available(s, url) == {"node01:1"}
    # node03:1 is repaired; an operator brings it back at once (the others wait their 2 checks)
    cluster.update_gpu("node03", 1, ecc_uncorrected_volatile=0)
    done = subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", "uncordon", "node03:1", "--ledger", url],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "node03:1" not in evicted(url)

    # check 5: the second healthy check readmits the others; the old Xid still evicts nothing
    assert s.poke({}) is False
    assert evicted(url) == {} and available(s, url) == all_gpus
    assert len(s.health_watch.last.readmitted) == 8
    # the XCom record of the run: every eviction with host, index, uuid and reasons
    result = s.health_watch.result()
    assert len(result["evictions"]) == 4 + 1 + 4 + 1 and json.loads(json.dumps(result)) == result


# --- S12: replacement inside a running reservation -----------------------------------------------------
def test_watch_replaces_an_evicted_gpu_of_a_live_reservation(fleet, capfd, monkeypatch):
    from airflow.sdk.observability import stats

    counted = []
    monkeypatch.setattr(stats, "incr", lambda name, *a, **kw: counted.append((name, kw.get("tags"))))
    cluster, ids, url = fleet(small_hosts(2, gpus=2))
    s = sensor(ids, url, mode_kind="watch")
    assert s.poke({}) is False
    inventory = s.health_watch.cluster
    with Ledger.from_url(url) as led:
        a = led.reserve("job-a", inventory, PlanRequest(2, gpu_type="A100-SXM4-80GB"), team="research").decision
        b = led.reserve("job-b", inventory, PlanRequest(2)).decision
    assert [str(k) for k in a.keys] == ["node01:0", "node01:1"] and [str(k) for k in b.keys] == ["node02:0", "node02:1"]

    # a GPU of job-a turns abnormal while every other GPU is held: no replacement, the job decides
    cluster.update_gpu("node01", 1, ecc_uncorrected_volatile=3)
    capfd.readouterr()
    assert s.poke({}) is False
    [stuck] = s.health_watch.last.replacements
    assert (stuck["job_id"], stuck["host"], stuck["index"], stuck["replacement"]) == ("job-a", "node01", 1, None)
    assert "no healthy GPU of pool NVIDIA A100-SXM4-80GB can replace evicted GPU node01:1" in logged(capfd)
    # the job's event carries its team (the reservation's fleet team) as team_name and fleet_team
    assert ("hetero_gpu.gpu.replacement_failures",
            {"pool": A100, "host": "node01", "team_name": "research", "fleet_team": "research"}) in counted

    # job-b ends: the next check swaps the bad GPU for one of the same pool, in the same slot
    with Ledger.from_url(url) as led:
        led.release("job-b")
    assert s.poke({}) is False
    [swap] = s.health_watch.last.replacements
    assert swap["replacement"]["host"] == "node02" and swap["pool"] == A100
    assert ("hetero_gpu.gpu.replacements",
            {"pool": A100, "host": "node01", "team_name": "research", "fleet_team": "research"}) in counted
    with Ledger.from_url(url) as led:
        res = led.get("job-a")
        assert [str(k) for k in res.keys] == ["node01:0", f"node02:{swap['replacement']['index']}"]
        assert res.pool == A100 and led.evicted_map() == {GpuKey("node01", 1): ("ecc",)}
        led.release("job-a")

    # no watched reservation is live any more: the watch is over
    done = s.poke({})
    assert done and done.xcom_value["reason"] == "no live reservation"
    assert [(e["job_id"], e["replacement"] is None) for e in done.xcom_value["replacements"]] == [
        ("job-a", True), ("job-a", False)]
    assert [(e["host"], e["index"], e["reasons"]) for e in done.xcom_value["evictions"]] == [("node01", 1, ["ecc"])]


# --- orphans: processes of jobs that hold no reservation -------------------------------------------------
def _marked_sleep(cluster, host: str, job_id: str) -> None:
    """A process on ``host`` carrying a job's launch markers, detached from its SSH session (as
    the processes of a job whose launcher and watchdog both died)."""
    command = (f"env HETERO_GPU_JOB_ID={job_id} HETERO_GPU_HOST={host} setsid sleep 600 "
               "</dev/null >/dev/null 2>&1 &")
    subprocess.run(cluster.ssh_argv(host, command), check=True, timeout=30)


def _marked(job_id: str) -> int:
    return len(procs.with_env("HETERO_GPU_JOB_ID", job_id))


@pytest.mark.serial  # the sweep stops every orphaned job of the machine, other tests' too
def test_watch_stops_processes_of_jobs_without_a_reservation(fleet, capfd):
    """With sweep_orphans, each check stops on every host the processes of jobs the ledger has
    no live reservation for, and leaves the processes of live jobs alone; without it (the
    default), nothing is touched."""
    import time

    cluster, ids, url = fleet(small_hosts(2, gpus=2))
    plain = sensor(ids, url, mode_kind="watch", stop_when_idle=False, watch_duration=3600)
    assert plain.poke({}) is False
    with Ledger.from_url(url) as led:
        assert led.reserve("live-job", plain.health_watch.cluster, PlanRequest(2)).decision is not None
    for host in ("node01", "node02"):
        _marked_sleep(cluster, host, "dead-job")
    _marked_sleep(cluster, "node02", "live-job")
    deadline = time.monotonic() + 60  # the detached processes exist once they exec'd with the markers
    while (_marked("dead-job"), _marked("live-job")) != (2, 1) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (_marked("dead-job"), _marked("live-job")) == (2, 1)

    assert plain.poke({}) is False  # sweep_orphans is off by default
    assert (_marked("dead-job"), _marked("live-job")) == (2, 1) and plain.health_watch.last.orphans == []

    s = sensor(ids, url, mode_kind="watch", stop_when_idle=False, watch_duration=3600, sweep_orphans=True)
    capfd.readouterr()
    assert s.poke({}) is False
    assert (_marked("dead-job"), _marked("live-job")) == (0, 1)
    assert [(o["host"], o["job_id"], o["processes"], o["left"]) for o in s.health_watch.last.orphans] == [
        ("node01", "dead-job", 1, 0), ("node02", "dead-job", 1, 0)]
    text = logged(capfd)
    assert "stopped 1 orphaned process(es) of job dead-job on node01: it holds no live reservation" in text
    assert s.health_watch.result()["orphans_stopped"] == s.health_watch.last.orphans

    with Ledger.from_url(url) as led:
        led.release("live-job")
    assert s.poke({}) is False  # now the live job's process is an orphan too
    assert _marked("live-job") == 0
    assert [(o["host"], o["job_id"]) for o in s.health_watch.last.orphans] == [("node02", "live-job")]


# --- the gate: a healthy pool ---------------------------------------------------------------------------
def test_gate_waits_for_enough_healthy_gpus_of_a_type(fleet):
    hosts = small_hosts(1, gpus=4)
    hosts[0].gpus[1].ecc_uncorrected_volatile = 1
    hosts[0].gpus[2].ecc_uncorrected_volatile = 1
    cluster, ids, url = fleet(hosts)
    s = sensor(ids, url, mode_kind="gate", min_healthy=3, gpu_type="A100-SXM4-80GB")
    assert s.poke({}) is False
    assert s.health_watch.last.gate["met"] is False
    assert s.health_watch.last.gate["pools"][0]["available"] == 2
    cluster.update_gpu("node01", 1, ecc_uncorrected_volatile=0)
    with Ledger.from_url(url) as led:
        led.uncordon("node01", 1)
    done = s.poke({})
    assert done and done.xcom_value["reason"] == "gate met"
    assert done.xcom_value["gate"]["pool"] == A100 and done.xcom_value["gate"]["request"]["gpus"] == 3


def test_gate_arguments_are_checked_at_run_time():
    s = GpuHealthSensor(task_id="g", ssh_conn_ids=["x"], mode_kind="gate", min_healthy=0)
    with pytest.raises(Exception, match="min_healthy: must be at least 1"):
        s.poke({})
    with pytest.raises(Exception, match="mode_kind: expected 'gate' or 'watch'"):
        GpuHealthSensor(task_id="w", ssh_conn_ids=["x"], mode_kind="wait").poke({})


# --- optional rules on an older driver, hot-add (S10), metrics -------------------------------------------
def test_older_driver_new_gpus_and_metrics(fleet, capfd, monkeypatch):
    from airflow.sdk.observability import stats

    recorded = []
    monkeypatch.setattr(stats, "gauge", lambda name, value, **kw: recorded.append(("gauge", name, value, kw)))
    monkeypatch.setattr(stats, "incr", lambda name, *a, **kw: recorded.append(("incr", name, kw)))
    monkeypatch.setattr(stats, "timing", lambda name, *a, **kw: None)
    hosts = small_hosts(2, gpus=2)
    hosts[0].gpus[1].hw_slowdown = True
    hosts[1].gpus[0].remapped_rows_failure = True
    cluster, ids, url = fleet(hosts)
    # node01 runs a driver that knows neither row remapping nor the new name of the slowdown flag
    cluster.set_state("node01", unknown_query_fields=["remapped_rows.pending", "remapped_rows.failure",
                                                      "clocks_event_reasons.hw_slowdown"])
    s = sensor(ids, url, captures_dir=None)
    capfd.readouterr()
    assert s.poke({}) is False
    assert "nvidia-smi does not know remapped_rows.pending" in logged(capfd)
    header = (s.health_watch.hook.captures_path / "hosts" / "node01" / "query.csv").read_text().splitlines()[0]
    # the fields it does not know are left out, the other health fields still asked for
    assert "remapped_rows" not in header and "clocks_event_reasons.hw_slowdown" in header.split(", ")
    assert reasons(s) == {"node01:1": ("hw-slowdown",), "node02:0": ("row-remap-failure",)}
    assert evicted(url) == {"node02:0": ("row-remap-failure",)}  # hw-slowdown is soft: 1 of 3
    assert ("incr", "hetero_gpu.gpu.evictions",
            {"tags": {"pool": A100, "host": "node02", "reason": "row-remap-failure"}}) in recorded
    assert ("gauge", "hetero_gpu.pool.NVIDIA_A100-SXM4-80GB.healthy_gpus", 2.0, {}) in recorded
    assert ("gauge", "hetero_gpu.pool.evicted_gpus", 1.0, {"tags": {"pool": A100}}) in recorded

    # a new card appears on node02: the next check re-partitions and says what is new
    new = make_gpus("node02", H200, ["9A"])[0].to_state()
    new.update(index=2, uuid=gpu_uuid("node02", 2))
    cluster.add_gpu("node02", new)
    assert s.poke({}) is False
    assert s.health_watch.last.changes == [f"new GPU node02 GPU2 (NVIDIA H200, {gpu_uuid('node02', 2)})",
                                           "new pool NVIDIA H200"]
    assert "GPU inventory change: new pool NVIDIA H200" in logged(capfd)
    assert "node02:2" in available(s, url)


# --- the trigger decides like poke mode -------------------------------------------------------------------
def test_trigger_gives_the_same_result_as_poke_mode(fleet, tmp_path):
    hosts = small_hosts(2, gpus=2)
    hosts[0].gpus[1].ecc_uncorrected_volatile = 2
    hosts[1].xid.append({"time": 99.5, "gpu": 0, "xid": 48})
    cluster, ids, url = fleet(hosts)
    poke_sensor = sensor(ids, url, watch_duration=0)
    poked = poke_sensor.poke({}).xcom_value

    other = new_ledger(tmp_path / 'other.db')
    deferred = sensor(ids, other, watch_duration=0, deferrable=True)
    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferral:
        deferred.execute({})
    trigger = deferral.value.trigger
    path, kwargs = trigger.serialize()
    assert path == "airflow_hetero_gpu.triggers.gpu_health.GpuHealthTrigger"
    rebuilt = GpuHealthTrigger(**json.loads(json.dumps(kwargs)))

    async def first_event():
        async for event in rebuilt.run():
            await rebuilt.cleanup()
            return event.payload

    event = asyncio.run(first_event())
    assert event["status"] == "success"
    assert deferred.execute_complete({}, event) == event["result"]
    assert event["result"] == poked
    assert [(e["host"], e["index"], e["reasons"]) for e in poked["evictions"]] == [
        ("node01", 1, ["ecc"]), ("node02", 0, ["xid-48"])]


# --- connections kept between checks ----------------------------------------------------------------
@pytest.fixture
def embedded_fleet(embedded_cluster, tmp_path, monkeypatch):  # noqa: F811
    """Like ``fleet``, on the embedded server, which counts the connections it accepts."""
    return _fleet_starter(embedded_cluster, tmp_path, monkeypatch)


def _opened(cluster, before):
    return {h: n - before[h] for h, n in cluster.connections_opened().items()}


def test_a_poking_sensor_keeps_its_connections_between_pokes(embedded_fleet):
    cluster, ids, url = embedded_fleet(small_hosts(2, gpus=2))
    before = cluster.connections_opened()
    s = sensor(ids, url)
    assert s.poke({}) is False and s.poke({}) is False
    assert _opened(cluster, before) == {"node01": 1, "node02": 1}
    assert s.health_watch.hook.kept_connections.kept() == 2
    s.health_watch.hook.close()
    rescheduled = sensor(ids, url, mode="reschedule")
    assert rescheduled._hook().keep_connections is False  # each poke is a new process


def test_the_trigger_keeps_its_connections_between_checks_and_closes_them(embedded_fleet):
    """A gate that the first check cannot meet (5 healthy GPUs asked, 4 there); once the first
    check is in the ledger a fifth GPU appears; the check that sees it meets the gate. Every
    check ran on the connections of the first."""
    cluster, ids, url = embedded_fleet(small_hosts(2, gpus=2))
    before = cluster.connections_opened()
    deferred = sensor(ids, url, mode_kind="gate", min_healthy=5, deferrable=True, poke_interval=0.2)
    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferral:
        deferred.execute({})
    trigger = GpuHealthTrigger(**json.loads(json.dumps(deferral.value.trigger.serialize()[1])))

    def checks_stored() -> int:
        try:
            with Ledger.open_existing(url) as led:
                return len(led.collections(datetime(2000, 1, 1, tzinfo=timezone.utc)))
        except Exception:  # noqa: BLE001 - not created yet
            return 0

    async def run():
        events = trigger.run()
        task = asyncio.ensure_future(events.__anext__())
        for _ in range(1200):  # the first check in the ledger (a safety net of 120 s)
            if checks_stored() >= 1 or task.done():
                break
            await asyncio.sleep(0.1)
        new = make_gpus("node02", A100_80, ["9A"])[0].to_state()
        new.update(index=2, uuid=gpu_uuid("node02", 2))
        cluster.add_gpu("node02", new)
        event = await asyncio.wait_for(task, 120)
        hook = trigger._hook
        kept = hook.kept_connections.kept()
        await trigger.cleanup()
        return event.payload, hook, kept

    event, hook, kept = asyncio.run(run())
    assert event["status"] == "success" and event["result"]["gate"]["met"], event
    assert _opened(cluster, before) == {"node01": 1, "node02": 1}
    assert checks_stored() >= 2 and kept == 2
    assert trigger._hook is None and hook.kept_connections is None  # closed when the trigger ended


def test_registered_with_the_provider():
    import importlib

    from airflow_hetero_gpu import get_provider_info

    info = get_provider_info()
    modules = {kind: [m for entry in info[kind] for m in entry["python-modules"]] for kind in ("sensors", "triggers")}
    assert "airflow_hetero_gpu.sensors.gpu_health" in modules["sensors"]
    assert "airflow_hetero_gpu.triggers.gpu_health" in modules["triggers"]
    assert importlib.import_module("airflow_hetero_gpu.sensors.gpu_health").GpuHealthSensor is GpuHealthSensor
    assert importlib.import_module("airflow_hetero_gpu.triggers.gpu_health").GpuHealthTrigger is GpuHealthTrigger


def test_reschedule_mode_keeps_the_run_record_in_the_ledger(fleet, tmp_path):
    """Every reschedule is a new process, maybe on another worker: the run's record is in the
    ledger, not in a directory (no captures_dir given)."""
    from types import SimpleNamespace

    hosts = small_hosts(1, gpus=2)
    hosts[0].gpus[0].temperature_c = 95
    cluster, ids, url = fleet(hosts)
    ti = SimpleNamespace(dag_id="d", task_id="gpu_health", run_id="manual__1", map_index=-1)

    def fresh():  # every reschedule is a new process with a new operator object
        return sensor(ids, url, mode="reschedule", captures_dir=None, watch_duration=3600,
                      thresholds={"soft_fault_checks": 2})

    def record():
        with Ledger.from_url(url) as led:
            return led.watch_run_state("d/gpu_health/manual__1/-1")

    assert fresh().poke({"ti": ti}) is False
    assert record()["checks"] == 1
    second = fresh()
    assert second.poke({"ti": ti}) is False
    assert second.health_watch.checks == 2
    assert [(e["host"], e["index"], e["reasons"]) for e in second.health_watch.evictions] == [
        ("node01", 0, ["temperature"])]
    third = fresh()
    third.watch_duration = 0
    done = third.poke({"ti": ti})
    assert done and done.xcom_value["checks"] == 3 and len(done.xcom_value["evictions"]) == 1
    assert record() is None


# --- hetero-gpu check: the same check without Airflow ---------------------------------------------
def test_the_check_command_records_what_the_sensor_records(fleet, tmp_path, capsys):
    """One fault sequence, checked by a sensor into one ledger and by `hetero-gpu check` into
    another at each step: the same evictions and readmissions, the same stored inventory."""
    from datetime import datetime, timezone

    from airflow_hetero_gpu.cli.app import main

    cluster, ids, sensor_url = fleet(small_hosts(2, gpus=2))
    check_url = f"sqlite:///{tmp_path / 'check-ledger.db'}"
    s = sensor(ids, sensor_url, mode_kind="watch", stop_when_idle=False, watch_duration=3600,
               thresholds={"soft_fault_checks": 2, "readmit_after_healthy_checks": 2})
    (tmp_path / "cluster.yaml").write_text("thresholds:\n  soft_fault_checks: 2\n  readmit_after_healthy_checks: 2\n")
    argv = ["check", "--ledger", check_url, "--hosts", cluster.hosts_arg(), "--identity-file",
            str(cluster.identity_file), "--known-hosts", str(cluster.known_hosts_path),
            "--config", str(tmp_path / "cluster.yaml"), "--connect-timeout", "3", "--command-timeout", "10",
            "--retries", "1"]
    codes = []

    def both():
        assert s.poke({}) is False
        codes.append(main(argv))

    both()  # all clean
    cluster.update_gpu("node01", 1, ecc_uncorrected_volatile=2)
    both()  # ecc: hard, evicted at once
    cluster.update_gpu("node01", 1, ecc_uncorrected_volatile=0)
    both()
    both()  # two clean checks: readmitted
    cluster.update_gpu("node02", 0, temperature_c=95)
    both()
    both()  # soft fault: evicted at its second check
    cluster.update_gpu("node02", 0, temperature_c=40)
    cluster.add_xid("node02", 1, 79)
    both()  # a new Xid line evicts once
    both()
    both()  # the same line again is not new: both come back after two clean checks
    out = capsys.readouterr().out
    assert codes == [0] * 9
    assert "evicted node01:1 (ecc)" in out and "readmitted node01:1" in out and "evicted node02:1 (xid-79)" in out

    since = datetime(2000, 1, 1, tzinfo=timezone.utc)

    def records(url):
        with Ledger.from_url(url) as led:
            events = [(e.kind, e.host, e.index, e.reasons) for e in led.gpu_events(since)]
            inv = led.inventory()
            return events, led.evicted_map(), {h: r.files for h, r in inv.hosts.items()}

    by_sensor, by_check = records(sensor_url), records(check_url)
    assert by_sensor == by_check
    assert [k for k, *_ in by_sensor[0]] == ["evicted", "readmitted", "evicted", "evicted", "readmitted",
                                             "readmitted"]
    assert by_sensor[1] == {}
    with Ledger.from_url(check_url) as led:
        assert {r.collector.split(" on ")[0] for r in led.inventory().hosts.values()} == {"hetero-gpu check"}
    with Ledger.from_url(sensor_url) as led:
        assert {r.collector.split(" on ")[0] for r in led.inventory().hosts.values()} == {"GpuHealthSensor"}


def test_the_check_command_says_when_nothing_could_be_collected(fleet, tmp_path, capsys):
    from airflow_hetero_gpu.cli.app import main

    cluster, _ids, _url = fleet(small_hosts(1, gpus=2))
    cluster.inject_fault("node01", "host_down")
    code = main(["check", "--ledger", f"sqlite:///{tmp_path / 'l.db'}", "--hosts", cluster.hosts_arg(),
                 "--identity-file", str(cluster.identity_file), "--known-hosts", str(cluster.known_hosts_path),
                 "--connect-timeout", "3", "--retries", "0"])
    assert code == 4
    assert "0 host(s) collected, 1 failed" in capsys.readouterr().out
    code = main(["check", "--ledger", f"sqlite:///{tmp_path / 'l.db'}", "--hosts", "bad host!"])
    assert code == 2
