"""The shell subset the embedded server answers in-process: what it takes on, and that it prints
byte for byte what bash prints running the same line with the fake tools' scripts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_hetero_gpu.collect.command import together_line
from airflow_hetero_gpu.collect.gather import QUERY_COMMAND, TOPO_COMMAND, XID_COMMAND
from airflow_hetero_gpu.testing.cluster import PACKAGE_ROOT, SYSTEM_PATH
from airflow_hetero_gpu.testing.demo import demo_hosts, small_hosts
from airflow_hetero_gpu.testing.embedded.shell import STATUS_WORD, Simple, parse, run_script
from airflow_hetero_gpu.testing.fake_tools import set_nvidia_smi_present, write_tool_scripts
from airflow_hetero_gpu.testing.state import write_state

# ---------------------------------------------------------------------------------------------
# What is answered in-process, and what goes to a real shell
# ---------------------------------------------------------------------------------------------

PLANS = [
    # (command line, [(connector, [(argv, stdout, stderr), ...]), ...]) or None: bash runs it
    ("nvidia-smi -L", [("", [(("nvidia-smi", "-L"), "out", "err")])]),
    ("nvidia-smi topo -m", [("", [(("nvidia-smi", "topo", "-m"), "out", "err")])]),
    (XID_COMMAND, [("", [(("journalctl", "-k", "-q", "--no-pager", "-g", "NVRM: Xid"), "out", "null")]),
                   ("||", [(("dmesg",), "out", "err"), (("grep", "NVRM: Xid"), "out", "err")])]),
    ("nvidia-smi -L 2>&1", [("", [(("nvidia-smi", "-L"), "out", "out")])]),
    ("nvidia-smi -L >&2", [("", [(("nvidia-smi", "-L"), "err", "err")])]),
    ("nvidia-smi -L 2>&1 >/dev/null", [("", [(("nvidia-smi", "-L"), "null", "out")])]),
    ("nvidia-smi -L >/dev/null 2>&1", [("", [(("nvidia-smi", "-L"), "null", "null")])]),
    # a digit apart from '>' is an argument, not a descriptor
    ("nvidia-smi -i 2 >/dev/null", [("", [(("nvidia-smi", "-i", "2"), "null", "err")])]),
    ("nvidia-smi -L </dev/null; dmesg", [("", [(("nvidia-smi", "-L"), "out", "err")]),
                                         (";", [(("dmesg",), "out", "err")])]),
    ("nvidia-smi -L;", [("", [(("nvidia-smi", "-L"), "out", "err")])]),
    ("nvidia-smi -L && dmesg | grep -F '|'", [("", [(("nvidia-smi", "-L"), "out", "err")]),
                                              ("&&", [(("dmesg",), "out", "err"), (("grep", "-F", "|"), "out", "err")])]),
    ('nvidia-smi "--query-gpu=index,name" --format=csv', [("", [(("nvidia-smi", "--query-gpu=index,name",
                                                                  "--format=csv"), "out", "err")])]),
    ("nvidia-smi -L; printf '\\n%s %s\\n' M $? >&2", [
        ("", [(("nvidia-smi", "-L"), "out", "err")]),
        (";", [(("printf", "\\n%s %s\\n", "M", STATUS_WORD), "err", "err")])]),
    ("echo hi", None),                        # not an emulated tool
    ("printf '%d\\n' 1", None),               # a conversion other than %s
    ("printf '\\t'", None),                   # an escape other than \\n
    ("printf", None),
    ("nvidia-smi -L | printf x", None),       # printf in a pipeline
    ("nvidia-smi -i $?", None),               # $? outside printf
    ("printf '%s' $?x", None),
    ("/usr/bin/nvidia-smi -L", None),         # a path: the shell would run that file
    ("nvidia-smi -L $X", None),               # expansion
    ('nvidia-smi -L "$X"', None),
    ("nvidia-smi -L `id`", None),
    ("nvidia-smi -L &", None),                # background job
    ("nvidia-smi -L > /tmp/out", None),       # a file
    ("nvidia-smi -L 3>/dev/null", None),
    ("nvidia-smi -L | sort", None),           # only grep reads a pipe here
    ("grep x", None),                         # grep would read the session's stdin
    ("dmesg | grep x file", None),            # grep reading a file
    ("dmesg | grep '[[:digit:]]'", None),     # character classes
    ("FOO=1 nvidia-smi -L", None),            # an assignment
    ("nvidia-smi '-L", None),                 # unbalanced quote
    ("nvidia-smi -L ;; dmesg", None),
    ("nvidia-smi -L |", None),
    ("(nvidia-smi -L)", None),
    ("nvidia-smi -L # comment", None),
    ("nvidia-smi *", None),
    ("nvidia-smi -L\ndmesg", None),
    ("", None),
]


@pytest.mark.parametrize("line, expected", PLANS)
def test_parse(line, expected):
    script = parse(line)
    if expected is None:
        assert script is None
    else:
        assert script is not None
        assert [(conn, [(s.argv, s.stdout, s.stderr) for s in pipeline]) for conn, pipeline in script.items] \
            == [(conn, [tuple(c) for c in pipeline]) for conn, pipeline in expected]
        assert all(isinstance(s, Simple) for _, pipeline in script.items for s in pipeline)


# ---------------------------------------------------------------------------------------------
# The same bytes as bash with the tools' scripts
# ---------------------------------------------------------------------------------------------

def _host(tmp_path: Path, state: dict) -> tuple[Path, Path]:
    bin_dir = tmp_path / "bin"
    write_tool_scripts(bin_dir, sys.executable, PACKAGE_ROOT)
    state_file = tmp_path / "state.json"
    write_state(state_file, state)
    return bin_dir, state_file


def _bash(line: str, bin_dir: Path, state_file: Path) -> tuple[int, bytes, bytes]:
    env = {"PATH": ":".join((str(bin_dir), *SYSTEM_PATH)), "HETERO_GPU_EMU_STATE": str(state_file),
           "HOME": os.path.expanduser("~"), "LANG": "C"}
    done = subprocess.run(["bash", "-c", line], capture_output=True, env=env, timeout=60, check=False)
    return done.returncode, done.stdout, done.stderr


H200 = demo_hosts()[4]  # hgx-h200: an Xid 48 in its kernel log, ECC errors on GPU 5

SAME_AS_BASH = [
    # (state changes, faults, command line)
    ({}, [], QUERY_COMMAND),
    ({}, [], TOPO_COMMAND),
    ({}, [], XID_COMMAND),
    ({}, ["journal_denied"], XID_COMMAND),                       # falls back to dmesg
    ({}, ["journal_denied", "dmesg_denied"], XID_COMMAND),       # neither readable
    ({"xid": []}, [], XID_COMMAND),                              # no Xid: exit 1, no output
    ({}, ["driver_gone"], "nvidia-smi -L 2>&1"),                 # both streams, in order
    ({}, ["driver_gone"], "nvidia-smi -L >/dev/null"),
    ({}, ["no_devices"], "nvidia-smi topo -m"),
    ({}, [], "nvidia-smi --query-gpu=index,bogus --format=csv"),  # exit 2, message on stdout
    ({}, [], "nvidia-smi -L | grep -c H200"),
    ({}, [], "nvidia-smi -L | grep -v 'GPU 1:' | grep -i uuid"),
    ({}, [], "nvidia-smi -L | grep -E 'GPU (3|5):'"),
    ({}, [], "nvidia-smi -L | grep -q 'GPU 9:'"),
    ({}, [], "nvidia-smi -L; dmesg && journalctl -k"),
    ({}, ["nvidia_smi_missing"], "nvidia-smi -L"),               # the shell's own message, 127
    ({}, ["nvidia_smi_missing"], "nvidia-smi -L 2>/dev/null || dmesg"),
    ({}, [], "printf '%s-%s\\n' a b c; printf 'x\\\\y %% %s\\n'; printf '%s'"),
    ({}, [], "nvidia-smi --query-gpu=index,bogus --format=csv; printf '%s\\n' $? $?"),
    # the collector's one-session read: every command's output, then a marker with its status
    ({}, [], together_line([QUERY_COMMAND, TOPO_COMMAND, XID_COMMAND], "HGPU-0123456789abcdef")),
    ({}, ["journal_denied", "dmesg_denied"], together_line([TOPO_COMMAND, XID_COMMAND], "HGPU-0")),
    ({}, ["nvidia_smi_missing"], together_line([QUERY_COMMAND, XID_COMMAND], "HGPU-1")),
]


@pytest.mark.parametrize("changes, faults, line", SAME_AS_BASH)
def test_in_process_prints_what_bash_prints(tmp_path, changes, faults, line):
    state = dict(H200.to_state(), **changes)
    state["faults"] = faults
    bin_dir, state_file = _host(tmp_path, state)
    if "nvidia_smi_missing" in faults:
        set_nvidia_smi_present(bin_dir, present=False, system_path=SYSTEM_PATH)
    script = parse(line)
    assert script is not None, line
    assert run_script(script, state) == _bash(line, bin_dir, state_file)


def test_state_is_read_per_call_not_cached():
    state = small_hosts(1, gpus=2)[0].to_state()
    script = parse("nvidia-smi -L")
    first = run_script(script, state)
    state["gpus"] = state["gpus"][:1]
    second = run_script(script, state)
    assert first[1].count(b"GPU ") == 2 and second[1].count(b"GPU ") == 1


def test_the_process_read_prints_what_bash_prints(tmp_path):
    """The collector's read of the GPUs' processes: the listing, then each process's owner, group
    and job marker, read from real processes of this machine (one of a job, one of another user
    when the tests run as root, one that has ended)."""
    import subprocess as sp

    from airflow_hetero_gpu.collect.processes import APPS_TOGETHER, PROCS_TOGETHER

    job = sp.Popen(["sleep", "300"], env={**os.environ, "HETERO_GPU_JOB_ID": "job-7"})
    other = sp.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sleep", "300"]
                     if os.geteuid() == 0 else ["sleep", "300"])
    try:
        line = together_line([TOPO_COMMAND, APPS_TOGETHER, PROCS_TOGETHER], "HGPU-0123456789abcdef")
        gpus = H200.to_state()["gpus"]
        gpus[0]["processes"] = [{"pid": job.pid, "name": "python", "memory_mib": 900},
                                {"pid": other.pid, "name": "python3", "memory_mib": 1632},
                                {"pid": 4194000, "name": "gone", "memory_mib": 1}]  # above any live pid here
        for changes, faults in (({"gpus": gpus}, []), ({}, []), ({"gpus": gpus}, ["nvidia_smi_missing"])):
            state = dict(H200.to_state(), **changes)
            state["faults"] = faults
            bin_dir, state_file = _host(tmp_path / str(len(faults)) / str(len(changes)), state)
            if faults:
                set_nvidia_smi_present(bin_dir, present=False, system_path=SYSTEM_PATH)
            script = parse(line)
            assert script is not None
            got = run_script(script, state)
            assert got == _bash(line, bin_dir, state_file)
            if changes and not faults:
                assert f"{job.pid} ".encode() in got[1] and b" job=job-7\n" in got[1]
    finally:
        for p in (job, other):
            p.kill()
            p.wait()
