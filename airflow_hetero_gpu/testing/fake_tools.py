"""Entry points of the fake ``nvidia-smi``, ``dmesg`` and ``journalctl`` of an emulated host.

Each emulated host's ``bin/`` holds three tiny scripts (written by :func:`write_tool_scripts`)
whose shebang is the Python that created the cluster; they call :func:`main` here with the tool
name. The host state is found through ``$HETERO_GPU_EMU_STATE`` (sshd's ``SetEnv`` puts it there).
Standard library only: this runs once per remote command.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Sequence, TextIO

from airflow_hetero_gpu.testing import nvsmi
from airflow_hetero_gpu.testing.nvsmi.apps import query_compute_apps
from airflow_hetero_gpu.testing.state import read_state

STATE_ENV = "HETERO_GPU_EMU_STATE"
TOOLS = ("nvidia-smi", "dmesg", "journalctl")



#: The longest an emulated nvidia-smi waits for its ``nvidia_smi_wait_for`` file.
WAIT_FOR_LIMIT_S = 600.0


def _wait_for(path: object) -> None:
    """A driver stuck until a test releases it: wait for the file ``path`` to exist."""
    if not path:
        return
    gate = Path(str(path))
    deadline = time.monotonic() + WAIT_FOR_LIMIT_S
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)

def _emit(stdout: TextIO, text: str) -> None:
    stdout.write(text)
    stdout.flush()


def nvidia_smi(argv: Sequence[str], state: dict, out: TextIO, err: TextIO) -> int:
    """The fake ``nvidia-smi``: the plain table (no arguments), ``--query-gpu``, ``-L``,
    ``topo -m``; faults from the state."""
    query: str | None = None
    fmt: str | None = None
    ids: str | None = None
    mode: str | None = None
    args = list(argv)
    i = 0
    try:
        while i < len(args):
            arg = args[i]
            if arg.startswith("--query-gpu="):
                query, mode = arg.split("=", 1)[1], "query"
            elif arg.startswith("--query-compute-apps="):
                query, mode = arg.split("=", 1)[1], "apps"
            elif arg == "--query-gpu" and i + 1 < len(args):
                query, mode = args[i + 1], "query"
                i += 1
            elif arg.startswith("--format="):
                fmt = arg.split("=", 1)[1]
            elif arg == "--format" and i + 1 < len(args):
                fmt = args[i + 1]
                i += 1
            elif arg.startswith("--id="):
                ids = arg.split("=", 1)[1]
            elif arg in ("-i", "--id") and i + 1 < len(args):
                ids = args[i + 1]
                i += 1
            elif arg in ("-L", "--list-gpus"):
                mode = "list"
            elif arg == "topo" and i + 1 < len(args) and args[i + 1] in ("-m", "--matrix"):
                mode = "topo"
                i += 1
            else:
                raise nvsmi.QueryError(nvsmi.INVALID_ARGS + "\n\n")
            i += 1
        if not args:
            mode = "table"
        if mode is None or (mode in ("query", "apps") and fmt is None):
            raise nvsmi.QueryError(nvsmi.INVALID_ARGS + "\n\n")
        if mode == "query":
            # Fields and format are checked before the driver is asked anything.
            for name in (query or "").split(","):
                if name.strip():
                    nvsmi.canonical_field(name)
            nvsmi.parse_format(fmt or "")
    except nvsmi.QueryError as exc:
        _emit(out, str(exc))
        return exc.returncode

    delay = float(state.get("nvidia_smi_delay_s") or 0)
    if delay > 0:
        time.sleep(delay)  # a slow or stuck driver, for command-timeout tests
    _wait_for(state.get("nvidia_smi_wait_for"))
    faults = set(state.get("faults", []))
    if "driver_gone" in faults:
        # Real captures show this text on stdout (followed by an empty line) and on stderr.
        _emit(out, nvsmi.DRIVER_NOT_LOADED + "\n\n")
        _emit(err, nvsmi.DRIVER_NOT_LOADED + "\n\n")
        return nvsmi.RC_DRIVER_NOT_LOADED
    if "no_devices" in faults or not state.get("gpus"):
        _emit(out, nvsmi.NO_DEVICES + "\n")
        return nvsmi.RC_NOT_FOUND

    if mode == "apps":
        try:
            text, rc = query_compute_apps(state, query or "", fmt or "")
        except nvsmi.QueryError as exc:
            text, rc = str(exc), exc.returncode
    elif mode == "query":
        text, rc = nvsmi.query_gpu(state, query or "", fmt or "", ids)
    elif mode == "list":
        text, rc = nvsmi.list_gpus(state)
    elif mode == "table":
        text, rc = nvsmi.table_text(state), nvsmi.RC_OK
    else:
        text, rc = nvsmi.topo_text(state), nvsmi.RC_OK
    _emit(out, text)
    return rc


def dmesg(argv: Sequence[str], state: dict, out: TextIO, err: TextIO) -> int:
    """The fake ``dmesg`` (options are accepted and ignored)."""
    if "dmesg_denied" in state.get("faults", []):
        _emit(err, "dmesg: read kernel buffer failed: Operation not permitted\n")
        return 1
    _emit(out, nvsmi.dmesg_text(state))
    return 0


def journalctl(argv: Sequence[str], state: dict, out: TextIO, err: TextIO) -> int:
    """The fake ``journalctl``: ``-k``/``--dmesg`` with ``-g PATTERN``; other options ignored."""
    args = list(argv)
    kernel = any(a in ("-k", "--dmesg") for a in args)
    pattern = None
    quiet = any(a in ("-q", "--quiet") for a in args)
    for i, arg in enumerate(args):
        if arg in ("-g", "--grep") and i + 1 < len(args):
            pattern = args[i + 1]
        elif arg.startswith("--grep="):
            pattern = arg.split("=", 1)[1]
    if "journal_denied" in state.get("faults", []):
        _emit(err, "No journal files were opened due to insufficient permissions.\n")
        return 1
    text = nvsmi.journal_text(state, pattern) if kernel else ""
    if not text:
        if not quiet:
            _emit(out, "-- No entries --\n")
        # journalctl exits 1 when --grep matched nothing.
        return 1 if pattern else 0
    _emit(out, text)
    return 0


HANDLERS = {"nvidia-smi": nvidia_smi, "dmesg": dmesg, "journalctl": journalctl}


def main(tool: str, argv: Sequence[str] | None = None) -> int:
    """Run one fake tool against the state named by ``$HETERO_GPU_EMU_STATE``."""
    argv = sys.argv[1:] if argv is None else argv
    path = os.environ.get(STATE_ENV)
    if not path:
        sys.stderr.write(f"{tool}: emulated host: ${STATE_ENV} is not set\n")
        return 255
    state = read_state(path)
    return HANDLERS[tool](argv, state, sys.stdout, sys.stderr)


def write_tool_scripts(bin_dir: Path, python: str, package_root: Path) -> None:
    """Write the ``nvidia-smi``, ``dmesg`` and ``journalctl`` scripts into ``bin_dir``.

    The shebang is ``python -IS`` (isolated, no site): the fakes need only the standard library
    and this package, found through ``package_root`` put first on ``sys.path``.
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        script = bin_dir / tool
        script.write_text(
            f"#!{python} -IS\n"
            "import sys\n"
            f"sys.path.insert(0, {str(package_root)!r})\n"
            "from airflow_hetero_gpu.testing.fake_tools import main\n"
            f"sys.exit(main({tool!r}))\n",
            encoding="utf-8",
        )
        script.chmod(0o755)


def set_nvidia_smi_present(bin_dir: Path, *, present: bool,
                           system_path: Sequence[str] = ("/usr/local/bin", "/usr/bin", "/bin")) -> None:
    """Put the host's fake ``nvidia-smi`` back, or park it (the ``nvidia_smi_missing`` fault).

    While parked, where a real ``nvidia-smi`` sits further down ``PATH`` (``system_path``), a shim
    answers what the shell says when the command is missing, so the real one never answers.
    """
    script = bin_dir / "nvidia-smi"
    parked = bin_dir / ".nvidia-smi.parked"
    if present:
        if parked.exists():
            os.replace(parked, script)
        return
    if script.exists():
        os.replace(script, parked)
    if any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in system_path):
        script.write_text("#!/bin/sh\necho \"sh: 1: nvidia-smi: not found\" >&2\nexit 127\n", encoding="utf-8")
        script.chmod(0o755)
