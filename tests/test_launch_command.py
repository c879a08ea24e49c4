"""The remote command builder: validation, torchrun argv, quoting (run through a real sh)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from airflow_hetero_gpu.launch.command import (
    LIST_JOBS_SCRIPT,
    PGID_MARKER,
    RUN_ROOT,
    Command,
    HostShare,
    LaunchSpec,
    Torchrun,
    build_commands,
    build_host_command,
    build_script,
    parse_pgid_line,
    run_dir,
    torchrun_argv,
    validate_env_name,
    validate_job_id,
)
from airflow_hetero_gpu.launch.ports import derive_port
from airflow_hetero_gpu.launch.run_files import sweep_line

SHARES = [HostShare("dgx-a", "10.0.0.1", (0, 1, 2, 3)), HostShare("rtx-b", "10.0.0.2", (1, 3))]

# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("job_id, ok", [
    ("retrain-42", True),
    ("a.b_c-D9", True),
    ("x" * 128, True),
    ("x" * 129, False),
    ("", False),
    (".", False),
    ("..", False),
    ("a/b", False),
    ("a b", False),
    ("job;rm", False),
    ("$(id)", False),
    ("job\n", False),
    ("ümlaut", False),
])
def test_job_id_validation(job_id, ok):
    if ok:
        assert validate_job_id(job_id) == job_id
    else:
        with pytest.raises(ValueError) as err:
            validate_job_id(job_id)
        assert "\n" not in str(err.value) and "invalid job id" in str(err.value)


@pytest.mark.parametrize("name, ok", [
    ("OMP_NUM_THREADS", True),
    ("_x1", True),
    ("NCCL_SOCKET_IFNAME", True),
    ("1X", False),
    ("A-B", False),
    ("A B", False),
    ("X=1", False),
    ("", False),
    ("$X", False),
    ("CUDA_VISIBLE_DEVICES", False),
    ("HETERO_GPU_JOB_ID", False),
])
def test_env_name_validation(name, ok):
    if ok:
        assert validate_env_name(name) == name
    else:
        with pytest.raises(ValueError):
            validate_env_name(name)


@pytest.mark.parametrize("kwargs, message", [
    ({"job_id": "bad id"}, "invalid job id"),
    ({"env": {"BAD-NAME": "1"}}, "invalid environment variable name"),
    ({"env": {"X": 1}}, "value must be a string"),
    ({"env": {"X": "a\0b"}}, "NUL"),
    ({"workdir": ""}, "invalid working directory"),
])
def test_launch_spec_rejects_bad_input(kwargs, message):
    base = {"job_id": "j1", "program": Command(("true",))}
    with pytest.raises(ValueError, match=message):
        LaunchSpec(**{**base, **kwargs})


@pytest.mark.parametrize("build, message", [
    (lambda: Torchrun(""), "needs a training script"),
    (lambda: Torchrun("t.py", args="--lr 1"), "list of strings"),
    (lambda: Torchrun("t.py", max_restarts=-1), "max_restarts"),
    (lambda: Torchrun("t.py", nproc_per_node=0), "nproc_per_node"),
    (lambda: Torchrun("t.py", launcher=()), "launcher"),
    (lambda: Command("echo hi"), "not one string"),
    (lambda: Command(()), "non-empty"),
    (lambda: HostShare("a b", "10.0.0.1"), "invalid host name"),
    (lambda: HostShare("a", "10.0.0.1", (0, 0)), "repeat"),
    (lambda: HostShare("a", "10.0.0.1", (-1,)), "non-negative"),
    # a MIG instance goes alone, by its real UUID form
    (lambda: HostShare("a", "10.0.0.1", (0, MIG)), "a MIG instance goes alone"),
    (lambda: HostShare("a", "10.0.0.1", (MIG, MIG.replace("7b", "7c"))), "a MIG instance goes alone"),
    (lambda: HostShare("a", "10.0.0.1", ("MIG-$(touch x)",)), "a MIG instance goes alone"),
    (lambda: HostShare("a", "10.0.0.1", ("GPU-feb88891-0321-5fef-9c87-d4af3b54259e",)), "a MIG instance goes alone"),
    (lambda: build_commands(LaunchSpec("j", Command(("true",))), SHARES, 0), "rendezvous port"),
    (lambda: build_commands(LaunchSpec("j", Command(("true",))), [SHARES[0], SHARES[0]], 29500), "twice"),
    (lambda: build_commands(LaunchSpec("j", Command(("true",))), [], 29500), "at least one host"),
])
def test_builders_reject_bad_input(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# ---------------------------------------------------------------------------------------------
# torchrun argv
# ---------------------------------------------------------------------------------------------

COMMON = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29500", "--rdzv-id", "job-7"]


@pytest.mark.parametrize("program, rank, expected", [
    (Torchrun("train.py", ("--epochs", "3")), 0,
     ["torchrun", "--nnodes", "2", "--nproc-per-node", "4", *COMMON, "--rdzv-conf", "is_host=true",
      "train.py", "--epochs", "3"]),
    (Torchrun("train.py"), 1,
     ["torchrun", "--nnodes", "2", "--nproc-per-node", "2", *COMMON, "--rdzv-conf", "is_host=false",
      "train.py"]),
    (Torchrun("/opt/t.py", max_restarts=3, nproc_per_node=1, launcher=("python3", "-m", "torch.distributed.run"),
              torchrun_args=("--monitor-interval", "1")), 1,
     ["python3", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", *COMMON,
      "--rdzv-conf", "is_host=false", "--max-restarts", "3", "--monitor-interval", "1", "/opt/t.py"]),
])
def test_torchrun_argv(program, rank, expected):
    assert torchrun_argv(program, "job-7", SHARES, rank, 29500) == expected


def test_torchrun_argv_ipv6_endpoint_and_cpu_only_host():
    shares = [HostShare("v6", "fd00::1"), HostShare("b", "fd00::2")]
    argv = torchrun_argv(Torchrun("t.py"), "j", shares, 1, 29400)
    assert argv[argv.index("--rdzv-endpoint") + 1] == "[fd00::1]:29400"
    assert argv[argv.index("--nproc-per-node") + 1] == "1"


def script_lines(script: str, job_id: str, host: str) -> list[str]:
    """The lines of a host's launch script after its first step, the removal of the host's stale
    run files of other jobs (launch/run_files.py), which spans lines of its own."""
    stale = sweep_line(job_id, host, LIST_JOBS_SCRIPT, RUN_ROOT)
    assert script.startswith(stale + "\n")
    return script[len(stale) + 1:].splitlines()


def test_script_layout():
    spec = LaunchSpec("job-7", Torchrun("train.py"), env={"OMP_NUM_THREADS": "1"}, workdir="/srv/run")
    script = build_script(spec, SHARES, 1, 29500)
    lines = script_lines(script, "job-7", "rtx-b")
    assert lines[0] == 'run_dir="$HOME"/.hetero-gpu/run/job-7'
    assert lines[2] == "cd /srv/run || exit 125"
    assert lines[3] == "export CUDA_VISIBLE_DEVICES=1,3 OMP_NUM_THREADS=1"
    assert lines[4] == "exec 3>&2 2>/dev/null 4<&0"
    assert lines[5] == "launch=$$.$(date +%s%N)"
    assert lines[6].startswith("setsid -w env HETERO_GPU_JOB_ID=job-7 HETERO_GPU_HOST=rtx-b "
                               'HETERO_GPU_NODE_RANK=1 HETERO_GPU_LAUNCH="$launch" sh -c ')
    assert '"$run_dir"/rtx-b.pgid torchrun --nnodes 2' in lines[6]
    assert lines[6].endswith(" </dev/null 4<&- &") and lines[7] == "job=$!"
    # the watchdog (the sweep script spans lines) sweeps this launch of the job on this host
    assert lines[8].startswith("{ while read -r _ <&4; do :; done; trap '' TERM; sh -c ")
    assert script.count("' hetero-gpu-watchdog job-7 rtx-b kill 100 \"$launch\" >/dev/null 2>&1; } 3>&- &\n") == 1
    tail = script[script.index("watchdog=$!"):].splitlines()
    assert tail == ["watchdog=$!", "exec 4<&-", 'wait "$job"', "status=$?", 'kill "$watchdog" 2>/dev/null',
                    'rm -f "$run_dir"/rtx-b.pgid', 'rmdir "$run_dir"', 'exit "$status"']
    command = build_host_command(spec, SHARES, 1, 29500)
    assert shlex.split(command) == ["sh", "-c", script]


def test_pgid_line_and_run_dir():
    assert parse_pgid_line(f"{PGID_MARKER}4242") == 4242
    assert parse_pgid_line(f"{PGID_MARKER}1") is None
    assert parse_pgid_line(f"{PGID_MARKER}x") is None
    assert parse_pgid_line("epoch 1 loss 0.5") is None
    assert run_dir("j-1") == ".hetero-gpu/run/j-1"


@pytest.mark.parametrize("job_id", ["a", "retrain-42", "x" * 100])
def test_derived_port_is_stable_and_in_range(job_id):
    port = derive_port(job_id, (30000, 30099))
    assert 30000 <= port <= 30099
    assert derive_port(job_id, (30000, 30099)) == port
    with pytest.raises(ValueError):
        derive_port(job_id, (10, 5))


# ---------------------------------------------------------------------------------------------
# Quoting: the generated command run by a real /bin/sh keeps every user string literal
# ---------------------------------------------------------------------------------------------

NASTY = [
    "; touch {pwned}",
    "$(touch {pwned})",
    "`touch {pwned}`",
    "' ; touch {pwned} ; '",
    '" ; touch {pwned} ; "',
    "a && touch {pwned}",
    "| touch {pwned}",
    "> {pwned}",
    "*",
    "~",
    "$HOME",
    "tab\there",
    "new\nline",
    "back\\slash",
    "",
    "-n",
]


def local_env(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def start_locally(command: str, home: Path, stderr=subprocess.PIPE) -> subprocess.Popen:
    """Start a host command here with pipes; its stdin stays open until the test closes it (end
    of file there sets off the job's watchdog, as when the SSH session is gone)."""
    return subprocess.Popen(command, shell=True, env=local_env(home), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=stderr)


def run_locally(command: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    """Run a host command here, its stdin held open as the launcher's SSH channel holds it (end
    of file there sets off the job's watchdog)."""
    env = local_env(home)
    read_end, write_end = os.pipe()
    try:
        return subprocess.run(command, shell=True, env=env, cwd=cwd, stdin=read_end, capture_output=True,
                              text=True, timeout=30)
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.fixture
def pwned(tmp_path: Path) -> Path:
    path = Path("/tmp") / f"pwned-{uuid.uuid4().hex}"
    yield path
    assert not path.exists(), f"{path} was created: a user string was run by the shell"


def printed_args(stdout: str) -> list[str]:
    """Arguments printed by ``printf '%s\\0'``, after the PGID marker line."""
    first, _, rest = stdout.partition("\n")
    assert first.startswith(PGID_MARKER)
    return rest.split("\0")[:-1]


@pytest.mark.parametrize("mode", ["torchrun", "command"])
def test_metacharacters_stay_literal(tmp_path: Path, pwned: Path, mode: str):
    args = [a.format(pwned=pwned) for a in NASTY]
    workdir = tmp_path / "work dir; $(touch x) 'q'"
    workdir.mkdir()
    if mode == "torchrun":
        program = Torchrun("train; rm -rf ~.py", tuple(args), launcher=("printf", "%s\\0"))
    else:
        program = Command(("printf", "%s\\0", *args))
    spec = LaunchSpec("job-q", program, workdir=str(workdir))
    shares = [HostShare("h0", "127.0.0.1", (0,))]
    proc = run_locally(build_host_command(spec, shares, 0, 29500), tmp_path, tmp_path)
    assert proc.returncode == 0, proc.stderr
    printed = printed_args(proc.stdout)
    if mode == "torchrun":
        assert printed[printed.index("train; rm -rf ~.py") + 1:] == args
    else:
        assert printed == args
    assert not (workdir / "x").exists()


def test_env_values_workdir_and_pid_file(tmp_path: Path, pwned: Path):
    values = {"A": f"$(touch {pwned})", "B": "it's \"quoted\"", "C": "", "D": "x\ny", "E": "~/*"}
    spec = LaunchSpec("job-env", Command(("sh", "-c", 'pwd; cat "$HOME/.hetero-gpu/run/job-env/h0.pgid"; printf "%s|" "$A" "$B" "$C" "$D" "$E" '
                                          '"$HETERO_GPU_JOB_ID" "$HETERO_GPU_HOST" "$HETERO_GPU_NODE_RANK" '
                                          '"$CUDA_VISIBLE_DEVICES" "$HETERO_GPU_NNODES" '
                                          '"$HETERO_GPU_MASTER_ADDR" "$HETERO_GPU_MASTER_PORT"')),
                      env=values, workdir=str(tmp_path))
    shares = [HostShare("h0", "10.1.1.1", (2, 5)), HostShare("h1", "10.1.1.2", (0,))]
    proc = run_locally(build_host_command(spec, shares, 0, 29555), tmp_path, Path("/"))
    assert proc.returncode == 0, proc.stderr
    marker, cwd, pid_file_text, printed = proc.stdout.split("\n", 3)
    assert cwd == str(tmp_path)
    assert pid_file_text == marker[len(PGID_MARKER):]
    assert printed.split("|")[:-1] == [values["A"], values["B"], "", "x\ny", "~/*", "job-env", "h0", "0",
                                       "2,5", "2", "10.1.1.1", "29555"]
    # Removed with the process group it named, and the job's run directory with it.
    assert not (tmp_path / ".hetero-gpu" / "run" / "job-env").exists()


MIG = "MIG-feb88891-0321-5fef-9c87-d4af3b54259e"


@pytest.mark.parametrize("device", [MIG, "MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/1/0"])
def test_a_mig_instance_is_named_by_its_uuid_in_cuda_visible_devices(tmp_path: Path, device: str):
    spec = LaunchSpec("job-mig", Command(("sh", "-c", 'printf "%s|%s" "$CUDA_VISIBLE_DEVICES" "$HETERO_GPU_NODE_RANK"')))
    proc = run_locally(build_host_command(spec, [HostShare("h0", "127.0.0.1", (device,))], 0, 1), tmp_path, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n", 1)[1] == f"{device}|0"
    torchrun = Torchrun("train.py")
    assert torchrun_argv(torchrun, "job-mig", [HostShare("h0", "127.0.0.1", (device,))], 0, 29500)[:5] == [
        "torchrun", "--nnodes", "1", "--nproc-per-node", "1"]


def test_exit_status_and_setup_errors(tmp_path: Path):
    shares = [HostShare("h0", "127.0.0.1")]
    fail = LaunchSpec("job-x", Command(("sh", "-c", "exit 7")))
    assert run_locally(build_host_command(fail, shares, 0, 1), tmp_path, tmp_path).returncode == 7
    missing = LaunchSpec("job-x", Command(("true",)), workdir=str(tmp_path / "nope"))
    proc = run_locally(build_host_command(missing, shares, 0, 1), tmp_path, tmp_path)
    assert proc.returncode == 125


def test_program_runs_in_its_own_process_group(tmp_path: Path):
    spec = LaunchSpec("job-pg", Command(("sh", "-c", "ps -o pgid= -p $$")))
    proc = run_locally(build_host_command(spec, [HostShare("h0", "127.0.0.1")], 0, 1), tmp_path, tmp_path)
    marker, pgid = proc.stdout.split("\n")[:2]
    assert int(pgid) == int(marker[len(PGID_MARKER):]) != os.getpgrp()


def test_pid_file_goes_when_the_job_is_killed_after_its_reader_is_gone(tmp_path: Path):
    """The launcher died (its end of the pipes is closed), then the job was killed: the calling
    shell must not die of SIGPIPE reporting it, and removes the pid file."""
    spec = LaunchSpec("job-k", Command(("sh", "-c", "echo started >&2; exec sleep 60")))
    command = build_host_command(spec, [HostShare("h0", "127.0.0.1")], 0, 1)
    proc = start_locally(command, tmp_path)
    try:
        pgid = parse_pgid_line(proc.stdout.readline().decode())
        assert proc.stderr.readline() == b"started\n"     # the job's stderr is the real one
        pid_file = tmp_path / ".hetero-gpu" / "run" / "job-k" / "h0.pgid"
        assert pid_file.read_text().strip() == str(pgid)
        proc.stdout.close()
        proc.stderr.close()
        os.killpg(pgid, signal.SIGTERM)
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
        assert not pid_file.exists() and not pid_file.parent.exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_watchdog_ends_the_job_when_stdin_ends(tmp_path: Path):
    """End of file on the command's stdin (the SSH session is gone) makes the watchdog end the
    job on this host: SIGTERM to its processes, found by their markers; the pid file goes."""
    import time

    spec = LaunchSpec("job-w", Command(("sh", "-c", "echo started; exec sleep 60")))
    command = build_host_command(spec, [HostShare("h0", "127.0.0.1")], 0, 1)
    proc = start_locally(command, tmp_path)
    try:
        parse_pgid_line(proc.stdout.readline().decode())
        assert proc.stdout.readline() == b"started\n"
        time.sleep(1)
        assert proc.poll() is None  # stdin open: the job runs
        began = time.monotonic()
        proc.stdin.close()
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
        assert time.monotonic() - began < 10
        assert not (tmp_path / ".hetero-gpu" / "run" / "job-w").exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_watchdog_never_ends_a_later_launch_of_the_same_job(tmp_path: Path):
    """Two launches of one job id on one host (a retry started while the first try's watchdog
    is still sweeping): each watchdog sweeps only its own launch."""
    spec = LaunchSpec("job-twice", Command(("sh", "-c", "echo started; exec sleep 60")))
    command = build_host_command(spec, [HostShare("h0", "127.0.0.1")], 0, 1)
    first, second = (start_locally(command, tmp_path, stderr=subprocess.DEVNULL) for _ in range(2))
    try:
        for proc in (first, second):
            parse_pgid_line(proc.stdout.readline().decode())
            assert proc.stdout.readline() == b"started\n"
        first.stdin.close()
        assert first.wait(timeout=20) == 128 + signal.SIGTERM
        assert second.poll() is None
        second.stdin.close()
        assert second.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()


def test_leader_recreates_a_run_directory_removed_by_another_host(tmp_path):
    """Hosts sharing a home (NFS) share the run directory; one host's clean-up may remove it
    right before another writes its pid file: the leader makes it again instead of failing."""
    import shlex
    import subprocess

    from airflow_hetero_gpu.launch.command import _LEADER

    pid_file = tmp_path / "gone" / "h.pgid"  # the directory does not exist
    script = f"exec 3>&2; sh -c {shlex.quote(_LEADER)} leader {shlex.quote(str(pid_file))} echo ran"
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "ran" and pid_file.read_text().strip().isdigit()


def test_the_signal_sweep_names_its_signal_and_refuses_anything_else():
    from airflow_hetero_gpu.launch.orphans import sweep_command

    cmd = sweep_command("job-1", "node01", kill=False, signal="USR1")
    assert cmd.endswith(" job-1 node01 signal 100 '' USR1")
    assert sweep_command("job-1", "node01", kill=True).endswith(" job-1 node01 kill 100")
    with pytest.raises(ValueError, match="signal: expected a signal name such as TERM or USR1, got 'TERM; rm'"):
        sweep_command("job-1", "node01", kill=False, signal="TERM; rm")


def test_the_sweep_signals_each_process_of_the_job_once(tmp_path):
    """A job of three processes (a shell and its child in one process group, a grandchild in a
    session of its own, as torchrun's workers are): the signal sweep sends one signal a process
    group, never a group and then its members again. torchrun's agent, signalled twice, raises its
    SignalException inside its handling of the first and prints a tangle of tracebacks."""
    from airflow_hetero_gpu.launch.command import HOST_ENV, JOB_ENV, SCOPE_ENV
    from airflow_hetero_gpu.launch.orphans import parse_sweep_output, sweep_command

    job_id, ready, calls = f"sig-{uuid.uuid4().hex[:8]}", tmp_path / "ready", tmp_path / "kill-calls"
    env = {k: v for k, v in os.environ.items() if k != SCOPE_ENV}
    env.update({JOB_ENV: job_id, HOST_ENV: "node01"})
    job = subprocess.Popen(
        ["sh", "-c", f'sleep 300 & setsid sleep 300 & touch {shlex.quote(str(ready))}; wait'],
        env=env, start_new_session=True)
    found: list = []
    clean_env = {k: v for k, v in os.environ.items() if k != SCOPE_ENV}
    try:
        deadline = time.monotonic() + 60  # until the three processes stand in their two groups
        while time.monotonic() < deadline:
            listed = subprocess.run(["sh", "-c", sweep_command(job_id, "node01", kill=False)],
                                    capture_output=True, text=True, timeout=60, env=clean_env)
            found = parse_sweep_output("node01", listed.stdout).found
            if ready.exists() and len(found) == 3 and len({p.pgid for p in found}) == 2:
                break
            time.sleep(0.1)
        groups = {p.pgid for p in found}
        assert len(found) == 3 and len(groups) == 2, found
        sh, flag, script, *args = shlex.split(sweep_command(job_id, "node01", kill=False, signal="USR1"))
        logged = f'kill() {{ echo "$*" >>{shlex.quote(str(calls))}; command kill "$@"; }}\n'
        sweep = subprocess.run([sh, flag, logged + script, *args], capture_output=True, text=True, timeout=60,
                               env=clean_env)
        assert sweep.returncode == 0, sweep.stderr
        sent = calls.read_text().splitlines()
        assert sorted(sent) == sorted(f"-s USR1 -- -{g}" for g in groups), sent  # once a group, no pid again
        assert job.wait(timeout=60) == -signal.SIGUSR1  # delivered: USR1 ends the shell
    finally:
        if job.poll() is None:
            job.kill()
        for proc in found:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
