"""@task.hetero_train's payload and what comes back: the payload run by a real Python process as
torchrun would start it on a host (RANK, HETERO_GPU_HOST set), its marked lines read back by
RankOutput; what cannot travel is refused before anything is reserved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

import pytest

from airflow_hetero_gpu.decorators.host_runner import CHUNK, ERROR_MARK, RESULT_MARK
from airflow_hetero_gpu.decorators.payload import PayloadError, build_payload, new_nonce
from airflow_hetero_gpu.decorators.rank_output import RankOutput, ResultMissing

THIS_FILE = str(Path(__file__).resolve())


# --- functions as a DAG file would hold them ------------------------------------------------

def echo(a, b=2, *, c="x"):
    import os

    return {"a": a, "b": b, "c": c, "rank": int(os.environ["RANK"]), "ckpt": os.environ.get("HETERO_GPU_CHECKPOINT_DIR")}


def big(n):
    return {"items": ["é" * 10 + str(i) for i in range(n)]}


def fails(message):
    import os

    if os.environ["RANK"] == "2":
        raise ValueError(message)
    return "fine"


def imports_missing():
    import hetero_gpu_no_such_module  # noqa: F401

    return 1


def returns_a_set():
    return {1, 2}


def exits(code):
    import sys

    sys.exit(code)


def uses_module_global():
    return json.dumps({})            # json comes from this file: the hosts would not have it


def uses_a_builtin_and_own_import():
    import math

    return len([math.pi])


def annotated(x: Path, y: Sequence[int] | None = None) -> RankOutput:
    return [x, y]                    # the annotations name what only this file imports


def make_closure():
    factor = 3

    def scaled(x):
        return x * factor

    return scaled


def run_rank(payload: bytes, tmp_path: Path, rank: int, host: str = "node01", argv=()) -> subprocess.CompletedProcess:
    path = tmp_path / f"{host}.payload"
    path.write_bytes(payload)
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank % 2), "HETERO_GPU_HOST": host}
    return subprocess.run([sys.executable, "-u", str(path), *argv], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)


def feed(output: RankOutput, host: str, text: str) -> list[str]:
    """Every line through RankOutput.take, as the operator's line handler does; the lines it logs."""
    logged = []
    for line in text.splitlines():
        rest, _ = output.take(host, line)
        if rest is not None:
            logged.append(rest)
    return logged


# --- the round trip ----------------------------------------------------------------------------

@pytest.mark.parametrize("rank", [0, 1])
def test_rank_0_reports_its_return_value_and_the_others_do_not(tmp_path, rank):
    nonce = new_nonce()
    payload = build_payload(echo, [{"lr": 0.1}], {"c": "ü"}, nonce)
    r = run_rank(payload, tmp_path, rank, argv=("--checkpoint-dir", "/ck/run 1"))
    assert r.returncode == 0, r.stderr
    output = RankOutput(nonce)
    assert feed(output, "node01", r.stdout) == []          # the marked lines are not logged
    if rank == 0:
        assert output.result() == {"a": {"lr": 0.1}, "b": 2, "c": "ü", "rank": 0, "ckpt": "/ck/run 1"}
    else:
        with pytest.raises(ResultMissing, match="without reporting"):
            output.result()


def test_a_large_value_comes_back_in_lines_short_enough_to_be_atomic(tmp_path):
    nonce = new_nonce()
    r = run_rank(build_payload(big, [3000], {}, nonce), tmp_path, 0)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) > 10 and all(len(line.encode()) < 4096 for line in lines)
    assert all(line.startswith(f"{RESULT_MARK}:{nonce}:") for line in lines)
    output = RankOutput(nonce)
    feed(output, "node01", r.stdout)
    assert output.result() == big(3000)
    # a part lost on the way is an error, not a wrong value
    partial = RankOutput(nonce)
    feed(partial, "node01", "\n".join(lines[:-1]))
    with pytest.raises(ResultMissing, match=f"{len(lines) - 1} of {len(lines)} parts"):
        partial.result()


def test_other_nonces_and_text_before_a_mark():
    output = RankOutput("abc")
    # a line of another try (or printed by the function itself) is logged like any other
    assert output.take("h", f"{RESULT_MARK}:zzz:0/1:bnVsbA==") == (f"{RESULT_MARK}:zzz:0/1:bnVsbA==", None)
    # another rank's unfinished output before the mark on the same line is logged; the mark is kept
    assert output.take("h", f"epoch 3{RESULT_MARK}:abc:0/1:NDI=") == ("epoch 3", None)
    assert output.result() == 42


@pytest.mark.parametrize("function, args, rank, phase, error, missing", [
    (fails, ["loss diverged"], 2, "running", "ValueError: loss diverged", None),
    (imports_missing, [], 1, "running", "ModuleNotFoundError: No module named 'hetero_gpu_no_such_module'",
     "hetero_gpu_no_such_module"),
    (returns_a_set, [], 0, "returning its value", "TypeError: rank 0's return value cannot travel as JSON "
     "(Object of type set is not JSON serializable): return a dict, list, string, number, boolean or None", None),
    (exits, [4], 1, "running", "SystemExit: 4", None),
])
def test_a_failing_rank_reports_host_rank_and_the_tracebacks_last_line(tmp_path, function, args, rank, phase,
                                                                       error, missing):
    nonce = new_nonce()
    r = run_rank(build_payload(function, args, {}, nonce), tmp_path, rank, host="node02")
    assert r.returncode != 0
    assert "Traceback (most recent call last)" in r.stderr     # the whole traceback goes to the log
    output = RankOutput(nonce)
    logged = feed(output, "node02", r.stderr)
    assert not any(ERROR_MARK in line for line in logged)
    (err,) = output.errors
    assert (err.host, err.rank, err.phase, err.error, err.missing_module) == ("node02", rank, phase, error, missing)
    message = output.failure_message(function.__name__, "job-1")
    assert message.startswith(f"job job-1: function {function.__name__!r} failed on node02, rank {rank}")
    assert error in message
    if missing:
        assert f"has no module {missing!r}: install it on every host of the pool" in message
        assert sys.executable in message


def test_tracebacks_point_at_the_dag_files_lines(tmp_path):
    nonce = new_nonce()
    r = run_rank(build_payload(fails, ["x"], {}, nonce), tmp_path, 2)
    raise_line = next(i for i, line in enumerate(Path(THIS_FILE).read_text().splitlines(), 1)
                      if "raise ValueError(message)" in line)
    assert f'File "{THIS_FILE}", line {raise_line}, in fails' in r.stderr
    assert "raise ValueError(message)" in r.stderr              # the source line, though not on the host
    assert r.stderr.startswith("Traceback (most recent call last):\n" f'  File "{THIS_FILE}"')  # no runner frame
    output = RankOutput(nonce)
    feed(output, "node01", r.stderr)
    assert output.errors[0].where == f"{THIS_FILE}:{raise_line} in fails"


def test_the_first_failure_leads_and_the_others_follow():
    output = RankOutput("n")
    for host, rank, error in [("node02", 3, "ValueError: boom"), ("node01", 0, "RuntimeError: peer closed"),
                              ("node01", 1, "RuntimeError: peer closed")]:
        record = {"host": host, "rank": rank, "phase": "running", "error": error}
        output.take(host, f"{ERROR_MARK}:n:{json.dumps(record)}")
    message = output.failure_message("train", "j")
    assert message.startswith("job j: function 'train' failed on node02, rank 3: ValueError: boom; after it: "
                              "node01, rank 0: RuntimeError: peer closed; node01, rank 1: RuntimeError: peer closed")
    output.new_run()   # a restart on a new GPU set forgets the earlier launch's errors
    assert output.failure_message("train", "j") is None


def test_lines_from_many_reader_threads():
    output = RankOutput("n")
    value = {"k": list(range(5000))}
    import base64

    data = base64.b64encode(json.dumps(value).encode()).decode()
    chunks = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]
    noise = [threading.Thread(target=lambda: [output.take("node02", f"epoch {i}") for i in range(2000)])
             for _ in range(3)]
    for t in noise:
        t.start()
    for i, chunk in enumerate(chunks):
        output.take("node01", f"{RESULT_MARK}:n:{i}/{len(chunks)}:{chunk}")
    for t in noise:
        t.join()
    assert output.result() == value


# --- what cannot travel ------------------------------------------------------------------------

@pytest.mark.parametrize("function, args, kwargs, message", [
    (uses_module_global, [], {}, "uses json from its DAG file; on the hosts it has only its arguments"),
    (make_closure(), [1], {}, "uses factor from the enclosing function"),
    (lambda x: x, [1], {}, "must be defined with def"),
    (echo, [threading.Lock()], {}, "positional argument 0 of 'echo' cannot travel to the hosts (pickle: "),
    (echo, [1], {"c": (lambda: 1)}, "argument 'c' of 'echo' cannot travel to the hosts"),
])
def test_what_cannot_travel_is_refused_with_its_name(function, args, kwargs, message):
    with pytest.raises(PayloadError) as err:
        build_payload(function, args, kwargs, "n")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_builtins_and_own_imports_are_fine(tmp_path):
    nonce = new_nonce()
    r = run_rank(build_payload(uses_a_builtin_and_own_import, [], {}, nonce), tmp_path, 0)
    output = RankOutput(nonce)
    feed(output, "node01", r.stdout)
    assert r.returncode == 0 and output.result() == 1


def test_annotations_are_not_evaluated_on_the_hosts(tmp_path):
    nonce = new_nonce()
    r = run_rank(build_payload(annotated, ["p"], {}, nonce), tmp_path, 0)
    assert r.returncode == 0, r.stderr
    output = RankOutput(nonce)
    feed(output, "node01", r.stdout)
    assert output.result() == ["p", None]
