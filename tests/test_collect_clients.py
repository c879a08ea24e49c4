"""The collector's clients: known_hosts parsed once (and again only when it changes), the same
answers as paramiko's own lookup, TCP_NODELAY on every SSH socket (paramiko factory, SSHHook)."""

from __future__ import annotations

import socket

import asyncssh
import paramiko
import pytest
from collect_helpers import set_airflow_connections

from airflow_hetero_gpu.cli.app import main
from airflow_hetero_gpu.collect.clients import HostKeyStore, paramiko_client_factory
from airflow_hetero_gpu.collect.ssh import collect_captures
from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.hooks.hetero_gpu import HeteroGpuHook
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import embedded_cluster  # noqa: F401


def _key(byte: int) -> paramiko.Ed25519Key:
    return paramiko.Ed25519Key(data=bytes.fromhex("0000000b7373682d6564323535313900000020") + bytes([byte]) * 32)


A, B, C = _key(0x11), _key(0x22), _key(0x33)


def _line(names: str, key: paramiko.PKey) -> str:
    return f"{names} {key.get_name()} {key.get_base64()}\n"


def test_keys_for_answers_what_paramikos_lookup_answers(tmp_path):
    hashed = paramiko.HostKeys.hash_host("[10.0.0.9]:2222")
    text = "".join([
        "# comment\n", "\n",
        _line("10.0.0.1", A),
        _line("10.0.0.2,[10.0.0.3]:2222", B),      # two names on one line
        _line("10.0.0.1", C),                       # a second key of the same type: the first wins
        _line(hashed, C),                           # a hashed name
        "garbage\n",                                # too few fields: skipped, as paramiko does
    ])
    path = tmp_path / "known_hosts"
    path.write_text(text)
    store, reference = HostKeyStore(path), paramiko.HostKeys(str(path))
    for name in ("10.0.0.1", "10.0.0.2", "[10.0.0.3]:2222", "10.0.0.3", "[10.0.0.9]:2222", "10.0.0.9", "nope"):
        expected = reference.lookup(name)
        got = store.keys_for(name)
        assert {k: v.get_base64() for k, v in got.items()} == \
            ({k: expected[k].get_base64() for k in expected.keys()} if expected else {}), name
    assert store.loads == 1


def test_a_broken_line_is_a_one_line_error_naming_file_and_line(tmp_path, capsys):
    path = tmp_path / "known_hosts"
    path.write_text(_line("10.0.0.1", A) + "10.0.0.4 ssh-ed25519 not-base64!\n")
    (tmp_path / "key").write_text("")
    with pytest.raises(ValueError, match=rf"^known_hosts {path}:2: not a host key line \(Invalid base64"):
        paramiko_client_factory(tmp_path / "key", path)
    code = main(["collect", "--hosts", "10.0.0.1", "--known-hosts", str(path), "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.startswith(f"hetero-gpu collect: error: known_hosts {path}:2: ")
    assert len(err.splitlines()) == 1


def test_a_missing_file_knows_no_host(tmp_path):
    store = HostKeyStore(tmp_path / "absent")
    assert store.keys_for("10.0.0.1") == {}
    (tmp_path / "absent").write_text(_line("10.0.0.1", A))
    assert list(store.keys_for("10.0.0.1")) == ["ssh-ed25519"]  # created later: read then


def test_known_hosts_is_parsed_once_per_factory_and_again_when_it_changes(embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(6, gpus=1))
    targets = [SshTarget(h.name, h.address, h.port, cluster.user) for h in cluster.hosts]
    factory = paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)
    first = collect_captures(targets, tmp_path / "a", factory, max_parallel=3, retries=0)
    second = collect_captures(targets, tmp_path / "b", factory, max_parallel=3, retries=0)
    assert len(first.ok) == len(second.ok) == 6
    assert factory.host_keys.loads == 1  # 12 connections, one parse

    # node03's entry now holds node04's key: the changed file is read again and node03 refused
    lines = cluster.known_hosts_path.read_text().splitlines(keepends=True)
    lines[2] = lines[2].split()[0] + " " + " ".join(lines[3].split()[1:]) + "\n"
    cluster.known_hosts_path.write_text("".join(lines))
    third = collect_captures(targets, tmp_path / "c", factory, max_parallel=3, retries=2)
    assert factory.host_keys.loads == 2
    assert [h.host for h in third.failed] == ["node03"]
    assert third["node03"].reason.startswith(f"host key mismatch for 127.0.0.13:{cluster.hosts[2].port}: ")
    assert third["node03"].attempts == 1


def test_hashed_known_hosts_work_and_unknown_hosts_are_refused(embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(2, gpus=1))
    hashed = tmp_path / "known_hosts"
    first = cluster.known_hosts_path.read_text().splitlines()[0].split()
    hashed.write_text(f"{paramiko.HostKeys.hash_host(first[0])} {first[1]} {first[2]}\n")
    targets = [SshTarget(h.name, h.address, h.port, cluster.user) for h in cluster.hosts]
    report = collect_captures(targets, tmp_path / "out", paramiko_client_factory(cluster.identity_file, hashed),
                              retries=0)
    assert report["node01"].ok
    assert report["node02"].reason == (f"unknown host key for 127.0.0.12:{cluster.hosts[1].port}: "
                                       "not in known_hosts (host keys are verified)")


def _nodelay(client: paramiko.SSHClient) -> bool:
    return bool(client.get_transport().sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


def test_factory_sockets_have_tcp_nodelay(embedded_cluster):
    cluster = embedded_cluster(small_hosts(1, gpus=1))
    host = cluster.hosts[0]
    client = paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)(
        SshTarget(host.name, host.address, host.port, cluster.user))
    try:
        assert _nodelay(client)
    finally:
        client.close()


def test_sshhook_clients_have_tcp_nodelay_and_verify_host_keys(embedded_cluster, monkeypatch, tmp_path):
    cluster = embedded_cluster(small_hosts(2, gpus=1))
    conns = set_airflow_connections(monkeypatch, cluster)
    hook = HeteroGpuHook(conns, captures_dir=tmp_path / "captures", connect_timeout=5, retries=0)
    factory = hook.client_factory()
    host = cluster.hosts[0]
    client = factory(SshTarget(host.name, host.address, host.port, cluster.user), connect_timeout=5)
    try:
        assert _nodelay(client) and client.get_transport().is_active()
    finally:
        client.close()
    assert len(hook.collect().ok) == 2
    cluster.inject_fault("node02", "host_key_changed")
    refused = hook.collect()["node02"]
    assert refused.reason.startswith("host key mismatch for 127.0.0.12:") and refused.attempts == 1


def test_sshhook_connection_refused_is_a_reason_not_a_leak(embedded_cluster, monkeypatch, tmp_path):
    cluster = embedded_cluster(small_hosts(1, gpus=1))
    conns = set_airflow_connections(monkeypatch, cluster)
    cluster.inject_fault("node01", "host_down")
    hook = HeteroGpuHook(conns, captures_dir=tmp_path / "captures", connect_timeout=5, retries=1)
    result = hook.collect()["node01"]
    assert result.reason == f"connection refused (127.0.0.11:{cluster.hosts[0].port})"
    assert result.attempts == 2
    assert hook.ssh_hook("node01").host_proxy is None  # nothing left on the SSHHook


@pytest.mark.parametrize("bad", ["identity", "known_hosts"])
def test_factory_checks_its_files(tmp_path, bad):
    present = tmp_path / "present"
    present.write_text("")
    with pytest.raises(ValueError, match="does not exist"):
        if bad == "identity":
            paramiko_client_factory(tmp_path / "nope", present)
        else:
            paramiko_client_factory(present, tmp_path / "nope")


def test_the_identity_is_read_once_and_a_bad_one_is_one_line(tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    encrypted = tmp_path / "encrypted"
    encrypted.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key(passphrase="secret"))
    with pytest.raises(ValueError, match=f"^identity file '{encrypted}' is encrypted: give a key without a "
                                         "passphrase, or leave --identity-file out to use the ssh agent$"):
        paramiko_client_factory(encrypted, known)
    garbage = tmp_path / "garbage"
    garbage.write_text("not a key\n")
    with pytest.raises(ValueError, match=f"^identity file '{garbage}' is not a private key paramiko can read: "):
        paramiko_client_factory(garbage, known)
