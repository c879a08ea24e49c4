"""One rank of a ``@task.hetero_train`` function, on a GPU host.

This file travels to the hosts as the job's payload (see :mod:`airflow_hetero_gpu.decorators.payload`):
its source, then one ``PAYLOAD = "..."`` line (the function's source, where it was defined, its
pickled arguments, the launch's nonce: JSON, zlib, base64) and a ``__main__`` block calling
:func:`main`. torchrun starts it once per local rank with the hosts' own Python; it needs only
the standard library (``airflow_hetero_gpu`` need not be installed on the hosts) and whatever
the function itself imports.

Each rank defines the function from its source (its decorators of Airflow removed, its line
numbers those of the DAG file, so tracebacks point at the DAG file's lines, its annotations left
unevaluated), loads the arguments and calls it. Then:

- global rank 0 (``RANK``) writes its return value as JSON, base64-encoded, on stdout in lines
  ``HETERO_GPU_RESULT:<nonce>:<i>/<n>:<chunk>`` (each one ``write``, short enough to be atomic on
  a pipe, so that the other local ranks' output cannot split it); a value JSON cannot hold is an
  error;
- a rank whose function raised (or whose arguments could not be loaded) prints the traceback on
  stderr, then one ``HETERO_GPU_ERROR:<nonce>:<json>`` line (host, rank, what it was doing, the
  traceback's last line, where in the DAG file, a missing module's name, the Python that ran it)
  and exits with status 1.

Only the launcher that generated the nonce takes these lines; other output is the job's log.
"""

import __future__
import ast
import base64
import json
import linecache
import os
import pickle
import sys
import time
import traceback
import zlib

RESULT_MARK = "HETERO_GPU_RESULT"
ERROR_MARK = "HETERO_GPU_ERROR"
CHECKPOINT_ENV = "HETERO_GPU_CHECKPOINT_DIR"
#: base64 characters per result line: with the mark and nonce well under PIPE_BUF (4096).
CHUNK = 3000
#: the decorators Airflow's TaskFlow puts on a task function; others are kept
TASK_DECORATORS = ("task", "setup", "teardown")
_ERROR_TEXT = 1200


def _decorator_name(node):
    if isinstance(node, ast.Call):
        node = node.func
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def define(spec):
    """The function of ``spec`` (keys ``source``, ``name``, ``filename``, ``lineno``), defined
    in a namespace of its own with its DAG file's line numbers and without TaskFlow decorators."""
    tree = ast.parse(spec["source"], filename=spec["filename"])
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == spec["name"]]
    if not functions:
        raise ValueError("no function %r in the source sent" % spec["name"])
    node = functions[0]
    node.decorator_list = [d for d in node.decorator_list
                           if _decorator_name(d).split(".")[0] not in TASK_DECORATORS]
    tree.body = [node]
    ast.increment_lineno(tree, spec["lineno"] - 1)
    # tracebacks show the DAG file's lines even where the file is not on the host
    lines = [""] * (spec["lineno"] - 1) + spec["source"].splitlines(True)
    linecache.cache[spec["filename"]] = (sum(map(len, lines)), None, lines, spec["filename"])
    namespace = {"__name__": "__hetero_train__", "__builtins__": __builtins__}
    # annotations stay unevaluated (they may name what only the DAG file imports)
    flags = __future__.annotations.compiler_flag
    exec(compile(tree, spec["filename"], "exec", flags=flags, dont_inherit=True), namespace)
    return namespace[spec["name"]]


def _emit(fd, text):
    os.write(fd, (text + "\n").encode("utf-8"))


def _missing_module(exc):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            return exc.name
        exc = exc.__cause__ or exc.__context__
    return None


def report(nonce, phase, exc, filename, rank, host):
    """The traceback on stderr, then the one-line error record."""
    sys.stdout.flush()
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_globals is globals():
        tb = tb.tb_next  # from the function's own frame on: this runner is not the user's code
    traceback.print_exception(type(exc), exc, tb)
    sys.stderr.flush()
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if f.filename == filename] or frames
    where = "%s:%d in %s" % (own[-1].filename, own[-1].lineno, own[-1].name) if own else None
    record = {"host": host, "rank": rank, "local_rank": os.environ.get("LOCAL_RANK"), "phase": phase,
              "error": last[:_ERROR_TEXT], "where": where and where[-300:],
              "missing_module": _missing_module(exc), "python": sys.executable[-200:], "at": time.time()}
    _emit(2, "%s:%s:%s" % (ERROR_MARK, nonce, json.dumps(record)))


def emit_result(nonce, value):
    """Rank 0's return value, as JSON in base64 chunks on stdout (TypeError/ValueError when JSON
    cannot hold it)."""
    text = json.dumps(value)
    data = base64.b64encode(text.encode("utf-8")).decode("ascii")
    chunks = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [""]
    sys.stdout.flush()
    for i, chunk in enumerate(chunks):
        _emit(1, "%s:%s:%d/%d:%s" % (RESULT_MARK, nonce, i, len(chunks), chunk))


def _checkpoint_dir(argv):
    for i, arg in enumerate(argv[:-1]):
        if arg == "--checkpoint-dir":
            return argv[i + 1]
    return None


def main(blob, argv=None):
    """Run this rank; the process's exit status."""
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(zlib.decompress(base64.b64decode(blob)).decode("utf-8"))
    nonce = spec["nonce"]
    rank = int(os.environ.get("RANK", "0"))
    host = os.environ.get("HETERO_GPU_HOST") or os.uname()[1]
    checkpoint = _checkpoint_dir(argv)
    if checkpoint:
        os.environ[CHECKPOINT_ENV] = checkpoint
    phase = "defining the function"
    try:
        func = define(spec)
        phase = "loading its arguments"
        args, kwargs = pickle.loads(base64.b64decode(spec["args"]))
        phase = "running"
        value = func(*args, **kwargs)
        if rank == 0:
            phase = "returning its value"
            try:
                emit_result(nonce, value)
            except (TypeError, ValueError) as exc:
                raise TypeError("rank 0's return value cannot travel as JSON (%s): return a dict, list, "
                                "string, number, boolean or None" % exc) from None
    except SystemExit as exc:
        if exc.code in (None, 0):
            return 0 if rank != 0 else _none_result(nonce)
        report(nonce, phase, exc, spec["filename"], rank, host)
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:
        report(nonce, phase, exc, spec["filename"], rank, host)
        return 1
    return 0


def _none_result(nonce):
    emit_result(nonce, None)
    return 0
