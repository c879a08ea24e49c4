"""The parts behind a first day's clear failures, each on its own: the health sensor and its
trigger refuse a missing ledger of their own (and name the one they use), and the launch's
path check finds a missing script or workdir over real SSH on the start's connection."""

from __future__ import annotations

import asyncio

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_hetero_gpu.collect.clients import paramiko_client_factory
from airflow_hetero_gpu.collect.targets import parse_hosts_file
from airflow_hetero_gpu.launch.command import PAYLOAD_SCRIPT, Command, LaunchSpec, Torchrun
from airflow_hetero_gpu.launch.handoff import ConnectionHandoff
from airflow_hetero_gpu.launch.preflight import LaunchPathError, check_paths
from airflow_hetero_gpu.sensors.gpu_health import GpuHealthSensor
from airflow_hetero_gpu.testing.airflow_env import connection_env
from airflow_hetero_gpu.testing.demo import small_hosts
from airflow_hetero_gpu.triggers.gpu_health import GpuHealthTrigger
from cluster_fixtures import embedded_cluster  # noqa: F401


@pytest.fixture
def fleet(embedded_cluster, tmp_path, monkeypatch):  # noqa: F811
    cluster = embedded_cluster(small_hosts(2, gpus=2))
    env, ids = connection_env(cluster)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    targets = {t.host_name: t for t in parse_hosts_file(cluster.write_hosts_file(tmp_path / "hosts"))}
    return cluster, ids, targets


# --- the sensor and its trigger ---------------------------------------------------------------------------
@pytest.mark.parametrize("deferrable", [False, True])
def test_the_sensor_refuses_a_missing_ledger_of_its_own(fleet, tmp_path, deferrable):
    _, ids, _ = fleet
    typo = tmp_path / "typo" / "ledger.db"
    sensor = GpuHealthSensor(task_id="gate", ssh_conn_ids=ids, ledger_url=f"sqlite:///{typo}", min_healthy=2,
                             poke_interval=0, deferrable=deferrable)
    with pytest.raises(AirflowFailException, match=rf"^no ledger at sqlite:///{typo} \(no such file\): create it"):
        sensor.poke({}) if not deferrable else sensor.execute({})   # refused before deferring
    assert not typo.parent.exists()


def test_the_sensor_creates_the_deployments_ledger_and_names_it(fleet, tmp_path, monkeypatch, capsys):
    _, ids, _ = fleet
    path = tmp_path / "ledger.db"
    monkeypatch.setenv("AIRFLOW__HETERO_GPU__LEDGER_URL", f"sqlite:///{path}")
    sensor = GpuHealthSensor(task_id="gate", ssh_conn_ids=ids, min_healthy=2, poke_interval=0)
    sensor.poke({})
    assert path.is_file()
    assert f"ledger: sqlite:///{path}" in capsys.readouterr().out


def test_the_health_trigger_refuses_a_missing_ledger_as_a_mistake(fleet, tmp_path):
    _, ids, _ = fleet
    typo = tmp_path / "typo" / "ledger.db"
    trigger = GpuHealthTrigger(ssh_conn_ids=ids, spec={"mode_kind": "gate", "min_healthy": 2},
                               ledger_url=f"sqlite:///{typo}", poke_interval=1)

    async def first_event():
        async for event in trigger.run():
            return event.payload

    event = asyncio.run(first_event())
    assert (event["status"], event["mistake"]) == ("error", True)
    assert event["message"].startswith(f"no ledger at sqlite:///{typo} (no such file): create it with ")
    assert not typo.parent.exists()
    sensor = GpuHealthSensor(task_id="gate", ssh_conn_ids=ids, min_healthy=2)
    with pytest.raises(AirflowFailException, match="^GPU health check failed: no ledger at "):
        sensor.execute_complete({}, event)


# --- the launch's path check ------------------------------------------------------------------------------
def test_the_path_check_names_each_missing_path_and_host_on_the_starts_connections(fleet, tmp_path):
    cluster, _, targets = fleet
    factory = ConnectionHandoff(paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path))
    both = [targets["node01"], targets["node02"]]
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    before = cluster.connections_opened()

    def spec(script_path: str, workdir: str | None = None, **kw) -> LaunchSpec:
        return LaunchSpec("job-1", Torchrun(script_path, **kw), workdir=workdir)

    check_paths(spec(str(script)), both, factory)                          # there: nothing said
    check_paths(spec("train.py", workdir=str(tmp_path)), both, factory)    # relative to workdir
    with pytest.raises(LaunchPathError) as missing:
        check_paths(spec(str(tmp_path / "train_missing.py")), both, factory)
    assert str(missing.value) == (f"script {tmp_path / 'train_missing.py'}: no such file on node01, node02: nothing "
                                  "was started; the training script and workdir must exist at the same path on "
                                  "every host")
    with pytest.raises(LaunchPathError, match=rf"^workdir {tmp_path / 'nowhere'}: no such directory on node01, "):
        check_paths(spec(str(script), workdir=str(tmp_path / "nowhere")), both, factory)
    with pytest.raises(LaunchPathError, match=r"^script train\.py: no such file on node02 \(relative to the remote "
                                              r"user's home directory\)"):
        check_paths(spec("train.py"), [targets["node02"]], factory)
    # a module, the decorator's payload, a command: no file to look for
    check_paths(spec("my_pkg.train", torchrun_args=("-m",)), both, factory)
    check_paths(LaunchSpec("job-1", Torchrun(PAYLOAD_SCRIPT), payload=b"x"), both, factory)
    check_paths(LaunchSpec("job-1", Command(("no-such-program",))), both, factory)
    # every check rode on one connection a host, handed on to whatever comes next
    opened = {h: n - before[h] for h, n in cluster.connections_opened().items()}
    factory.settle()
    assert opened == {"node01": 1, "node02": 1}
