"""Parallel SSH collection into a capture directory, against the emulated cluster (real sshd)."""

from __future__ import annotations

import json
import re
import resource
import socket
import threading
import time
from pathlib import Path

import paramiko
import pytest

from airflow_hetero_gpu.capture.query import OPTIONAL_FIELDS
from airflow_hetero_gpu.collect.ssh import (
    QUERY_FIELDS,
    atomic_write,
    classify_connect_error,
    collect_captures,
    paramiko_client_factory,
)
from airflow_hetero_gpu.collect.targets import SshTarget, parse_hosts_arg
from airflow_hetero_gpu.testing import nvsmi
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from airflow_hetero_gpu.testing.sshd import generate_key

DRIVER_GONE = ("nvidia-smi exit 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
               "driver. Make sure that the latest NVIDIA driver is installed and running.")

#: What the collector asks nvidia-smi for: the SPEC fields plus the optional health fields.
COLLECTED_FIELDS = ",".join([QUERY_FIELDS, *OPTIONAL_FIELDS])


def factory_for(cluster, **kwargs):
    return paramiko_client_factory(kwargs.pop("identity_file", cluster.identity_file),
                                   kwargs.pop("known_hosts", cluster.known_hosts_path), **kwargs)


def collect(cluster, out: Path, **kwargs):
    factory = kwargs.pop("factory", None) or factory_for(cluster)
    return collect_captures(parse_hosts_arg(cluster.hosts_arg()), out, factory, **kwargs)


def files_of(out: Path, host: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((out / "hosts" / host).iterdir())}


# ---------------------------------------------------------------------------------------------
# --hosts parsing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    ("gpu1", [SshTarget("gpu1", "gpu1", 22, None)]),
    ("alice@gpu1:2222", [SshTarget("gpu1", "gpu1", 2222, "alice")]),
    ("127.0.0.11:22022", [SshTarget("127.0.0.11", "127.0.0.11", 22022, None)]),
    ("[::1]:2222", [SshTarget("::1", "::1", 2222, None)]),
    ("bob@[::1]", [SshTarget("::1", "::1", 22, "bob")]),
    ("::1", [SshTarget("::1", "::1", 22, None)]),
    ("dgx-a1=root@127.0.0.11:22022", [SshTarget("dgx-a1", "127.0.0.11", 22022, "root")]),
    (" n1.example.com , n2:23 ", [SshTarget("n1.example.com", "n1.example.com"), SshTarget("n2", "n2", 23)]),
])
def test_parse_hosts_arg(value, expected):
    assert parse_hosts_arg(value) == expected


@pytest.mark.parametrize("value, bad", [
    ("gpu1,", ""),
    ("gpu1:0", "gpu1:0"),
    ("gpu1:70000", "gpu1:70000"),
    ("gpu1:ssh", "gpu1:ssh"),
    ("[::1", "[::1"),
    ("[gpu1]:22", "[gpu1]:22"),
    ("[::1]x", "[::1]x"),
    ("bad host", "bad host"),
    ("us er@h", "us er@h"),
    ("a/b", "a/b"),
    ("x=y=z", "x=y=z"),
    ("bad name=h", "bad name=h"),
    ("@h", "@h"),
])
def test_parse_hosts_arg_rejects_bad_entries(value, bad):
    with pytest.raises(ValueError, match=re.escape(f"invalid --hosts entry {bad!r}")) as info:
        parse_hosts_arg(value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("value, message", [
    ("", "--hosts is empty"),
    ("n1,alice@n1:23", "host 'n1' appears twice"),
])
def test_parse_hosts_arg_rejects_bad_lists(value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_hosts_arg(value)


# ---------------------------------------------------------------------------------------------
# Classification of connect errors
# ---------------------------------------------------------------------------------------------

T = SshTarget("n1", "127.0.0.11", 2222, "root")
KEY = paramiko.Ed25519Key(data=bytes.fromhex(
    "0000000b7373682d6564323535313900000020" + "11" * 32))
OTHER = paramiko.Ed25519Key(data=bytes.fromhex(
    "0000000b7373682d6564323535313900000020" + "22" * 32))


def _banner_timeout() -> paramiko.SSHException:
    try:
        try:
            raise socket.timeout()
        except socket.timeout:
            raise paramiko.SSHException("Error reading SSH protocol banner")
    except paramiko.SSHException as exc:
        return exc


@pytest.mark.parametrize("exc, elapsed, reason, retryable", [
    (paramiko.ssh_exception.NoValidConnectionsError({("127.0.0.11", 2222): ConnectionRefusedError(111, "x")}),
     0.0, "connection refused (127.0.0.11:2222)", True),
    (socket.timeout("timed out"), 3.0, "timeout connecting to 127.0.0.11:2222 after 3s", False),
    (_banner_timeout(), 3.0, "timeout: no SSH handshake from 127.0.0.11:2222 within 3s", False),
    (paramiko.SSHException("No existing session"), 2.9, "timeout: no SSH handshake from 127.0.0.11:2222 "
                                                        "within 3s", False),
    (paramiko.SSHException("Error reading SSH protocol banner"), 0.1,
     "connection closed by 127.0.0.11:2222 before the SSH banner (sshd's MaxStartups refuses "
     "unauthenticated connections beyond its limit: lower max_parallel behind a shared sshd)", True),
    (OSError(24, "Too many open files"), 0.0, "cannot connect to 127.0.0.11:2222: too many open files "
     f"in this process (limit {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}, hard limit "
     f"{resource.getrlimit(resource.RLIMIT_NOFILE)[1]}): lower --max-parallel / max_parallel or raise "
     "the limit (ulimit -n)", False),
    (paramiko.SSHException("Server '[127.0.0.11]:2222' not found in known_hosts"), 0.1,
     "unknown host key for 127.0.0.11:2222: not in known_hosts (host keys are verified)", False),
    (paramiko.BadHostKeyException("127.0.0.11", KEY, OTHER), 0.1,
     f"host key mismatch for 127.0.0.11:2222: server offered ssh-ed25519 {KEY.fingerprint}, "
     f"known_hosts has ssh-ed25519 {OTHER.fingerprint}", False),
    (paramiko.AuthenticationException("Authentication failed."), 0.1,
     "authentication failed for root@127.0.0.11:2222: Authentication failed.", False),
    (EOFError(), 0.1, "connection to 127.0.0.11:2222 lost: EOFError", True),
])
def test_classify_connect_error(exc, elapsed, reason, retryable):
    failure = classify_connect_error(exc, T, 3.0, elapsed)
    assert (str(failure), failure.retryable) == (reason, retryable)


# ---------------------------------------------------------------------------------------------
# Collection against real sshd
# ---------------------------------------------------------------------------------------------


def test_collects_every_demo_host_in_parallel(emulated_cluster, tmp_path):
    cluster = emulated_cluster()
    out = tmp_path / "captures"
    report = collect(cluster, out, max_parallel=8, connect_timeout=5, command_timeout=10)
    assert [(h.host, h.ok, h.reason) for h in report.hosts] == [(h.name, True, None) for h in cluster.hosts]
    for host in cluster.hosts:
        state = cluster.state(host.name)
        expected_xid = nvsmi.journal_text(state, "NVRM: Xid")
        assert files_of(out, host.name) == {
            "query.csv": nvsmi.query_gpu(state, COLLECTED_FIELDS, "csv")[0],
            "topo.txt": nvsmi.topo_text(state),
            "xid.log": expected_xid,
            "apps.csv": nvsmi.query_compute_apps(state, "gpu_uuid,pid,used_memory,process_name", "csv")[0],
            "procs.txt": "",
        }
    assert "Xid (PCI:0000:bb:00): 48" in (out / "hosts" / "hgx-h200" / "xid.log").read_text()
    # The hosts were worked on at the same time, not one after the other.
    assert report.seconds < 0.8 * sum(h.seconds for h in report.hosts)
    json.dumps(report.as_dict())


FAILURE_TABLE = [
    # host, fault, reason (PORT is replaced by the host's port), attempts
    ("node01", "host_down", "connection refused (127.0.0.11:PORT)", 3),
    ("node02", "driver_gone", DRIVER_GONE, 1),
    ("node03", "no_devices", "nvidia-smi exit 6: No devices were found", 1),
    ("node04", "nvidia_smi_missing", "nvidia-smi: command not found", 1),
    ("node05", None, None, 1),
]


def test_failing_hosts_get_error_txt_and_do_not_stop_the_others(emulated_cluster, tmp_path):
    cluster = emulated_cluster(small_hosts(len(FAILURE_TABLE), gpus=1))
    for host, fault, _, _ in FAILURE_TABLE:
        if fault:
            cluster.inject_fault(host, fault)
    out = tmp_path / "captures"
    report = collect(cluster, out, connect_timeout=5, command_timeout=10, retries=2)
    for host, fault, reason, attempts in FAILURE_TABLE:
        result = report[host]
        expected = reason.replace("PORT", str(cluster.host(host).port)) if reason else None
        assert (result.ok, result.reason, result.attempts) == (fault is None, expected, attempts)
        if fault:
            assert files_of(out, host) == {"error.txt": expected + "\n"}
        else:
            assert sorted(files_of(out, host)) == ["apps.csv", "procs.txt", "query.csv", "topo.txt", "xid.log"]


def test_hung_host_times_out_within_the_connect_timeout(emulated_cluster, tmp_path):
    cluster = emulated_cluster(small_hosts(2, gpus=1))
    cluster.inject_fault("node01", "hang")
    report = collect(cluster, tmp_path / "out", connect_timeout=1.0, command_timeout=10)
    hung = report["node01"]
    assert not hung.ok and hung.reason.startswith("timeout: no SSH handshake from 127.0.0.11:")
    assert hung.attempts == 1 and hung.seconds < 2.0
    assert report["node02"].ok


def test_slow_command_times_out_within_the_command_timeout(emulated_cluster, tmp_path):
    cluster = emulated_cluster(small_hosts(2, gpus=1))
    cluster.set_state("node01", nvidia_smi_delay_s=60)
    # 4 s: room for node02's three commands (a shell and a Python fake each) on a busy machine
    report = collect(cluster, tmp_path / "out", connect_timeout=5, command_timeout=4.0)
    slow = report["node01"]
    assert slow.reason == "timeout: 'nvidia-smi --query-gpu' did not finish within 4s"
    assert slow.attempts == 1 and slow.seconds < 8.0
    assert report["node02"].ok


def test_changed_host_key_is_refused_fast_without_retry(emulated_cluster, tmp_path):
    cluster = emulated_cluster(small_hosts(2, gpus=1))
    cluster.inject_fault("node01", "host_key_changed")
    report = collect(cluster, tmp_path / "out", retries=3)
    refused = report["node01"]
    assert refused.reason.startswith(f"host key mismatch for 127.0.0.11:{cluster.host('node01').port}: "
                                     "server offered ssh-ed25519 SHA256:")
    assert refused.attempts == 1 and refused.seconds < 2.0
    assert report["node02"].ok


def test_unknown_host_key_is_refused(emulated_cluster, tmp_path):
    cluster = emulated_cluster(small_hosts(2, gpus=1))
    partial = tmp_path / "known_hosts"
    partial.write_text(cluster.known_hosts_path.read_text().splitlines()[1] + "\n")
    report = collect(cluster, tmp_path / "out", factory=factory_for(cluster, known_hosts=partial), retries=3)
    assert report["node01"].reason.startswith("unknown host key for 127.0.0.11:")
    assert report["node01"].attempts == 1
    assert report["node02"].ok


def test_authentication_failure_is_not_retried(emulated_cluster, tmp_path):
    cluster = emulated_cluster(small_hosts(1, gpus=1))
    generate_key(tmp_path / "stranger", "stranger")
    report = collect(cluster, tmp_path / "out", factory=factory_for(cluster, identity_file=tmp_path / "stranger"))
    result = report["node01"]
    assert result.reason.startswith(f"authentication failed for {cluster.user}@127.0.0.11:")
    assert result.attempts == 1


def test_failed_host_keeps_last_good_capture_and_recovers(emulated_cluster, tmp_path):
    cluster = emulated_cluster(small_hosts(1, gpus=2))
    out = tmp_path / "out"
    assert collect(cluster, out).hosts[0].ok
    good = files_of(out, "node01")
    cluster.inject_fault("node01", "host_down")
    assert not collect(cluster, out, retries=0).hosts[0].ok
    failed = files_of(out, "node01")
    assert failed.pop("error.txt").startswith("connection refused")
    assert failed == good
    cluster.clear_fault("node01", "host_down")
    cluster.update_gpu("node01", 1, utilization_gpu=88)
    assert collect(cluster, out).hosts[0].ok
    recovered = files_of(out, "node01")
    assert "error.txt" not in recovered
    assert ", 88 %," in recovered["query.csv"]


def test_lost_gpu_is_kept_in_query_csv_with_a_warning(emulated_cluster, tmp_path):
    cluster = emulated_cluster(small_hosts(1, gpus=2))
    cluster.update_gpu("node01", 0, lost=True)
    result = collect(cluster, tmp_path / "out").hosts[0]
    line = "Unable to determine the device handle for GPU 0000:07:00.0: Unknown Error"
    assert result.ok and result.warnings == [f"nvidia-smi exit 255: {line}"]
    query = (tmp_path / "out" / "hosts" / "node01" / "query.csv").read_text().splitlines()
    assert query[0] == line and query[1].startswith("index, uuid, name") and query[2].startswith("1, GPU-")


@pytest.mark.parametrize("faults, read_kernel_log, xid_file, warning", [
    (["journal_denied"], True, True, None),                      # falls back to dmesg
    (["journal_denied", "dmesg_denied"], True, False,
     "kernel log not readable: dmesg: read kernel buffer failed: Operation not permitted"),
    ([], False, False, None),
])
def test_kernel_log_reading(emulated_cluster, tmp_path, faults, read_kernel_log, xid_file, warning):
    cluster = emulated_cluster(small_hosts(1, gpus=1))
    cluster.add_xid("node01", 0, 79, time=1017.123457)
    for fault in faults:
        cluster.inject_fault("node01", fault)
    result = collect(cluster, tmp_path / "out", read_kernel_log=read_kernel_log).hosts[0]
    assert result.ok and result.warnings == ([warning] if warning else [])
    xid = tmp_path / "out" / "hosts" / "node01" / "xid.log"
    assert xid.exists() == xid_file
    if xid_file:
        assert xid.read_text().startswith("[ 1017.123457] NVRM: Xid (PCI:0000:07:00): 79,")


def test_max_parallel_bounds_open_connections(emulated_cluster, tmp_path):
    cluster = emulated_cluster(small_hosts(5, gpus=1))
    base = factory_for(cluster)
    lock = threading.Lock()
    counts = {"open": 0, "peak": 0}

    def counting_factory(target):  # no connect_timeout keyword: also a supported factory shape
        client = base(target)
        with lock:
            counts["open"] += 1
            counts["peak"] = max(counts["peak"], counts["open"])
        close = client.close

        def counted_close():
            with lock:
                counts["open"] -= 1
            close()
        client.close = counted_close
        return client

    report = collect(cluster, tmp_path / "out", factory=counting_factory, max_parallel=2)
    assert all(h.ok for h in report.hosts)
    assert counts == {"open": 0, "peak": 2}


# ---------------------------------------------------------------------------------------------
# Small units
# ---------------------------------------------------------------------------------------------


def test_atomic_write_replaces_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "h" / "query.csv"
    atomic_write(target, "one\n")
    atomic_write(target, "two\n")
    assert target.read_text() == "two\n"
    assert [p.name for p in target.parent.iterdir()] == ["query.csv"]


def test_atomic_write_syncs_only_when_asked_and_a_collector_without_a_directory_passes_none(tmp_path, monkeypatch):
    """A file written for a temporary directory need not reach the disk; a collector given no
    directory asks for none (each host's outputs stay in its result: test_collect_shards.py), a
    directory the user named gets its files durably."""
    import os

    from airflow_hetero_gpu.collect import fleet

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    atomic_write(tmp_path / "a.txt", "a\n", durable=False)
    assert synced == [] and (tmp_path / "a.txt").read_text() == "a\n"
    atomic_write(tmp_path / "b.txt", "b\n")
    assert len(synced) == 1

    calls = []
    monkeypatch.setattr(fleet, "collect_captures", lambda targets, out, factory, **kw: calls.append((out, kw)))
    factory = lambda *a, **k: None  # noqa: E731 - never called: collect_captures is replaced
    fleet.SshCollector([SshTarget("a", "127.0.0.1")], factory).collect()
    fleet.SshCollector([SshTarget("a", "127.0.0.1")], factory, out_dir=tmp_path / "kept").collect()
    assert [out for out, _ in calls] == [None, tmp_path / "kept"]
    assert all(kw.get("durable", True) for _, kw in calls)  # collect_captures' default: durable


def test_factory_checks_its_files(tmp_path):
    with pytest.raises(ValueError, match="known_hosts file .* does not exist"):
        paramiko_client_factory(known_hosts=tmp_path / "nope")
    with pytest.raises(ValueError, match="identity file .* does not exist"):
        paramiko_client_factory(identity_file=tmp_path / "nope")


def test_bad_collection_arguments(tmp_path):
    targets = [SshTarget("a", "127.0.0.1"), SshTarget("a", "127.0.0.2")]
    with pytest.raises(ValueError, match="duplicate host names"):
        collect_captures(targets, tmp_path, lambda t: None)
    with pytest.raises(ValueError, match="max_parallel"):
        collect_captures(targets[:1], tmp_path, lambda t: None, max_parallel=0)


def test_no_targets_is_an_empty_report(tmp_path):
    report = collect_captures([], tmp_path / "out", lambda t: None)
    assert report.hosts == [] and (tmp_path / "out" / "hosts").is_dir()


def test_unexpected_factory_error_becomes_a_reason(tmp_path):
    def broken(target):
        raise RuntimeError("key file unreadable\nsecond line")
    started = time.monotonic()
    report = collect_captures([SshTarget("a", "127.0.0.1")], tmp_path, broken, retries=3)
    assert report.hosts[0].reason == "cannot connect to 127.0.0.1:22: RuntimeError: key file unreadable"
    assert report.hosts[0].attempts == 1 and time.monotonic() - started < 0.5  # no retry, no backoff
