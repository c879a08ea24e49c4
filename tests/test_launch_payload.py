"""A launch's payload: sent first on the command's stdin, kept (mode 0600) in the run directory
while the job runs, run by PAYLOAD_SCRIPT, removed at the end; the rest of stdin stays the
watchdog's. The host commands run through a real /bin/sh here, and over real sshd."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_hetero_gpu.launch import Command, LaunchSpec, Torchrun, torchrun_job
from airflow_hetero_gpu.launch.command import (
    PAYLOAD_ENV,
    PAYLOAD_SCRIPT,
    SETUP_EXIT_CODE,
    HostShare,
    build_host_command,
    build_script,
    parse_pgid_line,
)
from cluster_fixtures import emulated_cluster  # noqa: F401
from test_launch_command import local_env, script_lines
from test_launch_remote import Lines, assert_nothing_left, factory_of, new_job_id, targets_of

SHARE = [HostShare("h0", "127.0.0.1", (0,))]
# prints its payload's path, mode and text, then waits for end of file on stdin (as a job that runs)
SHOW = ("sh", "-c", 'p=$' + PAYLOAD_ENV + '; echo "$p"; stat -c %a "$p"; cat "$p"; echo; exec sleep 60')


def test_payload_script_runs_the_payload_file_and_needs_one():
    spec = LaunchSpec("job-p", Torchrun(PAYLOAD_SCRIPT, ("--checkpoint-dir", "/c d")), payload=b"print(1)\n")
    script = build_script(spec, SHARE, 0, 29500)
    lines = script_lines(script, "job-p", "h0")
    assert lines[2] == 'payload="$run_dir"/h0.payload'
    assert lines[3].startswith("(umask 077 && head -c 9 >\"$payload\") && ")
    assert lines[4] == f'export {PAYLOAD_ENV}="$payload"'
    assert ' --rdzv-conf is_host=true "$HETERO_GPU_PAYLOAD" --checkpoint-dir \'/c d\' </dev/null' in script
    assert 'rm -f "$run_dir"/h0.pgid "$payload"' in lines
    # a user's string that looks like it is quoted, never expanded
    plain = LaunchSpec("job-p", Torchrun('"$HETERO_GPU_PAYLOAD"'))
    assert "'\"$HETERO_GPU_PAYLOAD\"'" in build_script(plain, SHARE, 0, 29500)
    with pytest.raises(ValueError, match="runs the payload file, but the launch has no payload"):
        LaunchSpec("job-p", Torchrun(PAYLOAD_SCRIPT))
    with pytest.raises(ValueError, match="payload must be bytes"):
        LaunchSpec("job-p", Command(("true",)), payload="text")
    with pytest.raises(ValueError, match="set by the launcher"):
        LaunchSpec("job-p", Command(("true",)), env={PAYLOAD_ENV: "/x"})


def test_the_payload_arrives_on_stdin_and_stdin_stays_the_watchdogs(tmp_path: Path):
    payload = "héllo 'payload' $(touch /tmp/never)\nline two".encode()
    spec = LaunchSpec("job-pl", Command(SHOW), payload=payload)
    command = build_host_command(spec, SHARE, 0, 1)
    proc = subprocess.Popen(command, shell=True, env=local_env(tmp_path), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(payload + b"what the watchdog reads next\n")
        proc.stdin.flush()
        assert parse_pgid_line(proc.stdout.readline().decode()) is not None
        path = Path(proc.stdout.readline().decode().strip())
        assert path == tmp_path / ".hetero-gpu" / "run" / "job-pl" / "h0.payload"
        assert proc.stdout.readline() == b"600\n"
        assert path.read_bytes() == payload and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert proc.poll() is None                     # stdin still open: the job runs on
        proc.stdin.close()                             # the session is gone: the watchdog ends it
        assert proc.wait(timeout=30) != 0
        assert not path.exists() and not path.parent.exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_payload_cut_short_starts_nothing(tmp_path: Path):
    spec = LaunchSpec("job-short", Command(("sh", "-c", "echo ran")), payload=b"0123456789")
    r = subprocess.run(build_host_command(spec, SHARE, 0, 1), shell=True, env=local_env(tmp_path),
                       input=b"01234", capture_output=True, timeout=30)
    assert r.returncode == SETUP_EXIT_CODE and b"ran" not in r.stdout
    assert not (tmp_path / ".hetero-gpu" / "run" / "job-short" / "h0.payload").exists()


def test_a_payload_reaches_every_host_over_ssh(emulated_cluster):  # noqa: F811
    """Over real sshd, without a shared file system assumed: each host's payload is its own copy,
    run by Python from the run directory; nothing is left afterwards."""
    from airflow_hetero_gpu.testing.demo import small_hosts

    cluster = emulated_cluster(small_hosts(2, gpus=1))
    job_id = new_job_id("payload")
    code = "import os, sys\nprint('payload ran on', os.environ['HETERO_GPU_HOST'], 'from', sys.argv[0])\n"
    spec = LaunchSpec(job_id, Command((sys.executable, PAYLOAD_SCRIPT)), payload=code.encode())
    targets = targets_of(cluster)
    lines = Lines()
    job = torchrun_job(spec, [(t, (0,)) for t in targets], factory_of(cluster), rdzv_port=29500, on_line=lines)
    assert all(w.stdin == spec.payload for w in job.workers)
    result = job.run(timeout=120)
    assert result.ok
    for host in (t.host_name for t in targets):
        found = [ln for ln in result[host].tail if ln.startswith("payload ran on")]
        assert found == [f"payload ran on {host} from {os.path.expanduser('~')}/.hetero-gpu/run/{job_id}/"
                         f"{host}.payload"], result[host].tail
    assert_nothing_left(job_id)
    assert not Path(os.path.expanduser(f"~/.hetero-gpu/run/{job_id}")).exists()

