"""HeteroGpuHook over Airflow ssh connections (AIRFLOW_CONN_* env vars) to emulated hosts, real sshd."""

from __future__ import annotations

import logging
import time

import pytest
import yaml
from collect_helpers import (
    airflow_connection,
    conn_id_of,
    expected_inventory,
    set_airflow_connections,
)

from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.core.planner import plan
from airflow_hetero_gpu.errors import ConfigError
from airflow_hetero_gpu.hooks.hetero_gpu import DATAFRAME_COLUMNS, HeteroGpuHook, normalize_conn_ids
from airflow_hetero_gpu.testing.demo import H200, make_gpus, small_hosts
from cluster_fixtures import embedded_cluster, emulated_cluster  # noqa: F401
from airflow_hetero_gpu.testing.state import HostSpec

HOOK_LOGGER = "airflow_hetero_gpu.hooks.hetero_gpu"


@pytest.fixture
def hook_logs(caplog):
    caplog.set_level(logging.INFO, logger=HOOK_LOGGER)
    return caplog


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == HOOK_LOGGER]


@pytest.mark.parametrize("value, expected", [
    (["a", "b"], {"a": "a", "b": "b"}),
    ({"dgx-a1": "ssh_dgx_a1"}, {"dgx-a1": "ssh_dgx_a1"}),
    ("a, x=b", {"a": "a", "x": "b"}),
])
def test_normalize_conn_ids(value, expected):
    assert normalize_conn_ids(value) == expected


@pytest.mark.parametrize("value, message", [
    ([], "empty"), ("a,,b", "empty item"), (["a", "a"], "appears twice"), ({"bad name": "c"}, "invalid host name"),
    ({"a": ""}, "non-empty strings"),
])
def test_normalize_conn_ids_rejects(value, message):
    with pytest.raises(ValueError, match=message):
        normalize_conn_ids(value)


def test_init_only_stores(monkeypatch):
    """No connection is looked up before the hook is used (undefined ids are fine until then)."""
    hook = HeteroGpuHook(["not_defined_anywhere"], config={"weights": {"topology": 0.7}})
    assert hook._ssh_hooks == {} and hook.last_change is None and hook.last_report is None


def test_hook_collects_through_airflow_connections(emulated_cluster, monkeypatch, tmp_path, hook_logs):
    cluster = emulated_cluster(small_hosts(2, gpus=2))
    cluster.update_gpu("node02", 0, utilization_gpu=55, memory_used_mib=50000)
    conns = set_airflow_connections(monkeypatch, cluster)
    hook = HeteroGpuHook(conns, captures_dir=tmp_path / "captures", connect_timeout=5, command_timeout=10)
    inventory = hook.get_cluster()
    for host in cluster.hosts:
        got = [{k: g.to_json()[k] for k in expected_inventory(host.name, cluster.state(host.name), {})[0]}
               for g in inventory.gpus if g.host == host.name]
        assert got == expected_inventory(host.name, cluster.state(host.name), {})
    assert [h.attempts for h in hook.last_report.hosts] == [1, 1]
    assert sorted(p.name for p in (tmp_path / "captures" / "hosts").iterdir()) == ["node01", "node02"]

    frame = hook.get_dataframe(inventory)
    assert list(frame.columns) == list(DATAFRAME_COLUMNS)
    assert len(frame) == 4 and set(frame["pool"]) == {"NVIDIA A100-SXM4-80GB"}
    row = frame[(frame.host == "node02") & (frame["index"] == 0)].iloc[0]
    assert row.utilization == 0.55 and row.load == pytest.approx(50000 / 81920) and row.healthy
    assert row.reasons == []

    assert hook.test_connection() == (True, "2/2 hosts answered. node01: ok; node02: ok")
    assert any(m.startswith("GPU inventory: 4 GPUs on 2 hosts") for m in messages(hook_logs))


def test_changed_host_key_is_refused_fast_through_the_hook(emulated_cluster, monkeypatch, tmp_path, hook_logs):
    cluster = emulated_cluster(small_hosts(2, gpus=1))
    conns = set_airflow_connections(monkeypatch, cluster)  # pins the original host keys
    hook = HeteroGpuHook(conns, captures_dir=tmp_path / "captures", retries=3, connect_timeout=5)
    assert len(hook.collect().ok) == 2
    cluster.inject_fault("node01", "host_key_changed")
    started = time.monotonic()
    inventory = hook.get_cluster()
    elapsed = time.monotonic() - started
    refused = hook.last_report["node01"]
    port = cluster.host("node01").port
    assert refused.reason.startswith(f"host key mismatch for 127.0.0.11:{port}: server offered ssh-ed25519 SHA256:")
    assert refused.attempts == 1 and refused.seconds < 5 and elapsed < 5
    assert [g.reasons for g in inventory.gpus] == [("unreachable",), ()]
    assert f"GPU host node01: collection failed: {refused.reason}" in messages(hook_logs)
    ok, message = hook.test_connection()
    assert not ok and message.startswith("1/2 hosts answered. node01: host key mismatch")


def test_hot_added_host_shows_up_in_the_next_collection(emulated_cluster, monkeypatch, tmp_path, hook_logs):
    """S10: a host (of a new card type) joins between two get_cluster() calls; its GPUs form a new
    pool in the second, and the change is logged."""
    first = emulated_cluster(small_hosts(2, gpus=2))
    conns = set_airflow_connections(monkeypatch, first)
    hook = HeteroGpuHook(conns, captures_dir=tmp_path / "captures")
    before = hook.get_cluster()
    assert [p.id for p in before.pools] == ["NVIDIA A100-SXM4-80GB"] and hook.last_change is None

    new = emulated_cluster([HostSpec("h200-new", make_gpus("h200-new", H200, ("19", "3B")),
                                     {"matrix": [["X", "NV18"], ["NV18", "X"]]})],
                           first_address="127.0.0.61")
    hook.ssh_conn_ids = {**conns, **set_airflow_connections(monkeypatch, new)}
    hook_logs.clear()
    after = hook.get_cluster()

    assert [p.id for p in after.pools] == ["NVIDIA A100-SXM4-80GB", "NVIDIA H200"]
    assert sorted((g.host, g.index) for g in after.gpus if g.name == "NVIDIA H200") == [("h200-new", 0), ("h200-new", 1)]
    change = hook.last_change
    assert change.added_hosts == ("h200-new",) and change.pools_added == ("NVIDIA H200",)
    logged = messages(hook_logs)
    assert "GPU inventory change: new host h200-new" in logged
    assert "GPU inventory change: new pool NVIDIA H200" in logged
    assert any(m.startswith("GPU inventory change: new GPU h200-new GPU0 (NVIDIA H200, GPU-") for m in logged)
    decision = plan(after, PlanRequest(2, "H200")).decision
    assert decision is not None and decision.hosts == ["h200-new"]


def test_missing_connection_fails_its_host_only(emulated_cluster, monkeypatch, tmp_path):
    cluster = emulated_cluster(small_hosts(1, gpus=1))
    conns = set_airflow_connections(monkeypatch, cluster)
    hook = HeteroGpuHook({**conns, "ghost": "gpu_ghost"}, captures_dir=tmp_path / "captures")
    inventory = hook.get_cluster()
    assert hook.last_report["ghost"].reason == (
        "Airflow connection 'gpu_ghost' cannot be used: The conn_id `gpu_ghost` isn't defined")
    assert inventory.host_errors == {"ghost": hook.last_report["ghost"].reason}
    assert [g.host for g in inventory.gpus] == ["node01"]


def test_config_and_topology_go_into_the_capture_directory(emulated_cluster, monkeypatch, tmp_path):
    cluster = emulated_cluster(small_hosts(2, gpus=1))
    conns = set_airflow_connections(monkeypatch, cluster)
    topology = tmp_path / "topology.conf"
    topology.write_text("SwitchName=leaf1 Nodes=node01\nSwitchName=leaf2 Nodes=node02\n"
                        "SwitchName=spine Switches=leaf[1-2]\n")
    config = {"task_types": {"hosts": {"node0*": ["finetune"]}}}
    hook = HeteroGpuHook(conns, captures_dir=tmp_path / "captures", config=config, topology_conf=topology)
    inventory = hook.get_cluster()
    assert yaml.safe_load((tmp_path / "captures" / "cluster.yaml").read_text()) == config
    assert (tmp_path / "captures" / "topology.conf").read_text() == topology.read_text()
    assert [p.id for p in inventory.pools] == ["finetune@NVIDIA A100-SXM4-80GB"]
    assert inventory.distance(("node01", 0), ("node02", 0)) == 20

    bad = HeteroGpuHook(conns, captures_dir=tmp_path / "other", config={"weights": {"nope": 1}})
    with pytest.raises(ConfigError, match="nope"):
        bad.collect()


def test_connection_json_is_what_providers_ssh_reads(emulated_cluster, monkeypatch):
    from airflow.providers.ssh.hooks.ssh import SSHHook

    cluster = emulated_cluster(small_hosts(1, gpus=1))
    monkeypatch.setenv("AIRFLOW_CONN_PROBE", airflow_connection(cluster, "node01"))
    ssh = SSHHook(ssh_conn_id="probe")
    host = cluster.host("node01")
    assert (ssh.remote_host, ssh.port, ssh.username, ssh.key_file) == (
        host.address, host.port, cluster.user, str(cluster.identity_file))
    assert ssh.host_key is not None and not ssh.no_host_key_check
    assert conn_id_of("h200-new") == "gpu_h200_new"


def test_kept_connections_serve_the_next_collection_and_close_with_the_hook(embedded_cluster, monkeypatch,  # noqa: F811
                                                                           tmp_path):
    """keep_connections (the health trigger's and a poking sensor's hook): the second collection
    opens no connection, sees what changed on the host, and a host whose connection dropped
    between collections gets a new one, its host key verified."""
    cluster = embedded_cluster(small_hosts(3, gpus=2))
    conns = set_airflow_connections(monkeypatch, cluster)
    hook = HeteroGpuHook(conns, connect_timeout=5, command_timeout=10, keep_connections=True)
    before = cluster.connections_opened()
    assert len(hook.collect().ok) == 3
    first = {h: n - before[h] for h, n in cluster.connections_opened().items()}
    assert first == {"node01": 1, "node02": 1, "node03": 1}
    cluster.update_gpu("node02", 1, utilization_gpu=77)
    cluster.drop_connections("node03")
    assert len(hook.collect().ok) == 3
    second = {h: n - before[h] for h, n in cluster.connections_opened().items()}
    assert second == {"node01": 1, "node02": 1, "node03": 2}
    assert hook.kept_connections.reused >= 2 and hook.kept_connections.kept() == 3
    util = {(g.host, g.index): g.utilization for g in hook.load_cluster().gpus}
    assert util[("node02", 1)] == 0.77
    hook.close()
    assert hook.kept_connections is None
    hook.collect()  # after close: connections are opened afresh (and kept again)
    third = {h: n - before[h] for h, n in cluster.connections_opened().items()}
    assert third == {"node01": 2, "node02": 2, "node03": 3}
    hook.close()


def test_without_keep_connections_every_collection_connects_afresh(embedded_cluster, monkeypatch):  # noqa: F811
    cluster = embedded_cluster(small_hosts(2, gpus=2))
    hook = HeteroGpuHook(set_airflow_connections(monkeypatch, cluster), connect_timeout=5, command_timeout=10)
    before = cluster.connections_opened()
    hook.collect()
    hook.collect()
    assert {h: n - before[h] for h, n in cluster.connections_opened().items()} == {"node01": 2, "node02": 2}
    assert hook.kept_connections is None
