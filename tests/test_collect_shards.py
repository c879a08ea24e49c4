"""A collection shared among worker processes (collect.shards) against the embedded emulated fleet:
it reads exactly as one made by one process, kept connections stay in their workers between
collections, and no worker outlives its collection, its collector or its parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from airflow_hetero_gpu.collect.clients import paramiko_client_factory
from airflow_hetero_gpu.collect.fleet import SshCollector
from airflow_hetero_gpu.collect.persistent import KeptConnections
from airflow_hetero_gpu.collect.shards import HOSTS_PER_WORKER, ShardWorkers, worker_count
from airflow_hetero_gpu.collect.targets import SshTarget, parse_hosts_file
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import embedded_cluster  # noqa: F401
from shard_processes import workers_of

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 120.0  # safety net of the waits below; each ends on the event it waits for


def _alive(pid: int) -> bool:
    """False once ``pid`` is gone or a zombie whose every thread has ended (its parent can reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" or threads > 1


def _wait_for(what, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_worker_count_follows_the_fleet_and_the_cpus():
    assert worker_count(2 * HOSTS_PER_WORKER - 1, cpus=16) == 1  # a small fleet: this process alone
    assert worker_count(2 * HOSTS_PER_WORKER, cpus=16) == 2
    assert worker_count(1000, cpus=2) == 2 and worker_count(1000, cpus=1) == 1
    assert worker_count(1000, cpus=64) == 1000 // HOSTS_PER_WORKER


def test_a_collection_shared_among_processes_reads_as_one_made_by_one_process(embedded_cluster, tmp_path,
                                                                             monkeypatch):
    cluster = embedded_cluster(small_hosts(11, gpus=2))
    cluster.inject_fault("node04", "host_down")
    targets = parse_hosts_file(cluster.write_hosts_file(tmp_path / "hosts"))
    first = targets[0]  # the same machine under a second name: not collected, said so
    targets.append(SshTarget("alias01", first.address, first.port, first.user))
    factory = paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)

    reports, seen = {}, {}
    for processes in (1, 2):
        out = tmp_path / f"out{processes}"
        collector = SshCollector(targets, factory, out_dir=out, processes=processes, max_parallel=4,
                                 connect_timeout=5, retries=1)
        assert collector.processes == processes
        seen[processes] = []
        reports[processes] = collector.collect(on_host=lambda h, p=processes: seen[p].append(h.host))
        assert workers_of(os.getpid()) == []  # a one-shot collection stops its workers
    one, shared = reports[1], reports[2]

    def outcome(report):
        return [(h.host, h.target, h.ok, h.reason, h.attempts, h.files, h.warnings, h.query_source, h.duplicate_of,
                 h.texts) for h in report.hosts]

    assert outcome(shared) == outcome(one)
    assert [h.host for h in shared.hosts] == [t.host_name for t in targets]
    assert shared["node04"].reason.startswith("connection refused") and shared["node04"].attempts == 2
    assert shared["alias01"].duplicate_of == first.host_name
    assert sorted(seen[2]) == sorted(seen[1]) == sorted(t.host_name for t in targets if t.host_name != "alias01")
    for host in ("node01", "node04", "node11"):  # the captures each worker wrote, file by file
        files = sorted(p.name for p in (tmp_path / "out2" / "hosts" / host).iterdir())
        assert files == sorted(p.name for p in (tmp_path / "out1" / "hosts" / host).iterdir())
        for name in files:
            text = (tmp_path / "out2" / "hosts" / host / name).read_text()
            if name != "error.txt":
                assert text == shared[host].texts[name]
    assert (tmp_path / "out2" / "hosts" / "node04" / "error.txt").read_text() == shared["node04"].reason + "\n"

    # Without a directory nothing is written, here or in the workers: the outputs stay in the results.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # the workers' temporary directory
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # and this process's
    collector = SshCollector(targets, factory, processes=2, max_parallel=4, connect_timeout=5, retries=1)
    in_memory = collector.collect()
    assert in_memory.out_dir is None and outcome(in_memory) == outcome(one)
    assert list(scratch.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["hosts", "out1", "out2", "tmp"]


def test_kept_connections_stay_in_their_workers_until_the_collector_is_closed(embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(10, gpus=1))
    targets = parse_hosts_file(cluster.write_hosts_file(tmp_path / "hosts"))
    kept = KeptConnections(paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path))
    collector = SshCollector(targets, kept, processes=2, connect_timeout=5, retries=2)
    try:
        assert len(collector.collect().ok) == 10
        workers = workers_of(os.getpid())
        assert len(workers) == 2  # they stay up with their connections

        before = cluster.connections_opened()
        assert cluster.drop_connections("node03") == 1
        report = collector.collect()
        opened = {h: n - before[h] for h, n in cluster.connections_opened().items()}
        assert len(report.ok) == 10
        assert opened == {h: 1 if h == "node03" else 0 for h in opened}  # the others reused theirs
        assert sorted(workers_of(os.getpid())) == sorted(workers)

        # a worker that died between collections is replaced; its hosts connect afresh
        os.kill(workers[0], signal.SIGKILL)
        assert _wait_for(lambda: not _alive(workers[0]))
        before = cluster.connections_opened()
        report = collector.collect(hosts={"node01", "node02", "node05"})
        assert [h.host for h in report.hosts if h.ok] == ["node01", "node02", "node05"], [h.reason for h in report.hosts]
        assert sum(n - before[h] for h, n in cluster.connections_opened().items()) >= 1
        assert len(workers_of(os.getpid())) == 2
    finally:
        collector.close()
    assert workers_of(os.getpid()) == []
    assert _wait_for(lambda: sum(cluster.connections().values()) == 0)  # the kept connections closed with them


# `hetero-gpu` as a terminal starts it: Ctrl-C's signal at its default (a shell without job control
# starts a background command with SIGINT ignored, and every process under it inherits that; the
# command then rightly ignores Ctrl-C too), by an exec that keeps the pid
_AS_FROM_A_TERMINAL = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                       "os.execv(sys.executable, [sys.executable, '-m', 'airflow_hetero_gpu.cli', *sys.argv[1:]])")


def _collect_cli(cluster, tmp_path) -> subprocess.Popen:
    tmp_path.mkdir()
    hosts = cluster.write_hosts_file(tmp_path / "hosts")
    return subprocess.Popen(
        [sys.executable, "-c", _AS_FROM_A_TERMINAL, "collect", "--hosts-file", str(hosts),
         "--identity-file", str(cluster.identity_file), "--known-hosts", str(cluster.known_hosts_path),
         "--out", str(tmp_path / "out"), "--command-timeout", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_ctrl_c_and_a_killed_collector_leave_no_worker_behind(embedded_cluster, tmp_path):
    """``hetero-gpu collect`` of a fleet large enough for worker processes, every nvidia-smi
    slow: SIGINT stops the command and its workers; SIGKILL of the command stops them too (each
    worker sees its parent gone)."""
    cluster = embedded_cluster(small_hosts(2 * HOSTS_PER_WORKER, gpus=1))
    for host in cluster.hosts:
        cluster.set_state(host.name, nvidia_smi_delay_s=60)
    for sig in (signal.SIGINT, signal.SIGKILL):
        proc = _collect_cli(cluster, tmp_path / sig.name)
        try:
            expected = worker_count(2 * HOSTS_PER_WORKER)
            workers = _wait_for(lambda: proc.poll() is not None or len(workers_of(proc.pid)) == expected
                                and workers_of(proc.pid))
            assert proc.poll() is None, proc.stderr.read()
            assert len(workers) == expected > 1
            proc.send_signal(sig)
            try:
                proc.wait(WAIT_S)
            except subprocess.TimeoutExpired:  # where it hangs: every thread's stack (cli/app.py)
                proc.send_signal(signal.SIGUSR1)
                time.sleep(2)
                proc.kill()
                _, err = proc.communicate()
                raise AssertionError(f"hetero-gpu collect still running {WAIT_S} s after {sig.name}:\n{err}")
            if sig == signal.SIGINT:
                assert proc.returncode == 130, proc.stderr.read()
                assert "Traceback" not in proc.stderr.read()
            assert _wait_for(lambda: not any(_alive(pid) for pid in workers)), workers
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_check_with_an_interval_keeps_the_connections_in_its_workers(embedded_cluster, tmp_path, capsys,
                                                                     monkeypatch):
    """``hetero-gpu check --interval`` over a fleet large enough for worker processes: the same
    workers do every check, one connection per host for the whole watch, and no worker is left
    when the command returns."""
    from airflow_hetero_gpu.cli.app import main

    size = 2 * HOSTS_PER_WORKER
    used = []
    run = ShardWorkers.run

    def recorded(self, *args, **kwargs):  # which worker processes each check's collection used
        result = run(self, *args, **kwargs)
        used.append(sorted(w.proc.pid for w in self._workers if w is not None))
        return result

    monkeypatch.setattr(ShardWorkers, "run", recorded)
    cluster = embedded_cluster(small_hosts(size, gpus=1))
    hosts = cluster.write_hosts_file(tmp_path / "hosts")
    before = cluster.connections_opened()
    code = main(["check", "--hosts-file", str(hosts), "--identity-file", str(cluster.identity_file),
                 "--known-hosts", str(cluster.known_hosts_path), "--ledger", f"sqlite:///{tmp_path / 'l.db'}",
                 "--interval", "0.1", "--count", "3", "--json"])
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["check"], r["collected"], r["failed"]) for r in lines] == [(1, size, 0), (2, size, 0), (3, size, 0)]
    assert len(used) == 3 and len(used[0]) == worker_count(size) > 1 and used[1] == used[2] == used[0]
    assert {h: n - before[h] for h, n in cluster.connections_opened().items()} == {h.name: 1 for h in cluster.hosts}
    assert workers_of(os.getpid()) == []
    assert _wait_for(lambda: sum(cluster.connections().values()) == 0)


def test_a_worker_that_dies_mid_way_fails_its_hosts_with_a_reason_and_is_replaced(embedded_cluster, tmp_path):
    cluster = embedded_cluster(small_hosts(10, gpus=1))
    for host in cluster.hosts:
        cluster.set_state(host.name, nvidia_smi_delay_s=5)
    targets = parse_hosts_file(cluster.write_hosts_file(tmp_path / "hosts"))
    factory = paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)
    collector = SshCollector(targets, KeptConnections(factory), out_dir=tmp_path / "out", processes=2,
                             max_parallel=10, connect_timeout=5, command_timeout=60, retries=0)
    reports = []
    try:
        collecting = threading.Thread(target=lambda: reports.append(collector.collect()))
        before = cluster.sessions_opened()
        collecting.start()
        # every host's session is open (its nvidia-smi is running): stop the worker of node01
        assert _wait_for(lambda: all(n > before.get(h, 0) for h, n in cluster.sessions_opened().items()))
        victim = collector._workers._workers[0].proc.pid  # noqa: SLF001 - the worker that has node01
        os.kill(victim, signal.SIGKILL)
        collecting.join(WAIT_S)
        assert not collecting.is_alive()
        report = reports[0]
        lost = [t.host_name for t in targets][0::2]  # round robin: node01, node03, ...
        reason = f"collector worker process {victim} exited (status -9) before this host was collected"
        assert [(h.host, h.reason) for h in report.hosts if not h.ok] == [(name, reason) for name in lost]
        for name in lost:
            assert (tmp_path / "out" / "hosts" / name / "error.txt").read_text() == reason + "\n"

        for host in cluster.hosts:
            cluster.set_state(host.name, nvidia_smi_delay_s=0)
        report = collector.collect()  # a new worker takes node01's share
        assert [h.host for h in report.hosts if not h.ok] == []
        assert not (tmp_path / "out" / "hosts" / "node01" / "error.txt").exists()
    finally:
        collector.close()
    assert workers_of(os.getpid()) == []
