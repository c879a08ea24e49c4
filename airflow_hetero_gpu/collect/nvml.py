"""Collect ``query.csv`` through NVML (``pynvml``) instead of the ``nvidia-smi`` command.

Locally::

    from airflow_hetero_gpu.collect.nvml import nvml_query_csv
    text = nvml_query_csv()      # what `nvidia-smi --query-gpu=<SPEC fields> --format=csv` prints

Remotely, the SSH collector (``use_nvml=True``) runs ``python3 -`` on the host and feeds it the
agent script (:func:`agent_script`) on stdin; the agent answers one JSON object, read back with
:func:`parse_agent_reply`. A host without ``python3`` or ``pynvml``, or whose NVML cannot start,
falls back to ``nvidia-smi``. Both give the same inventory for the same GPUs.

The NVML-to-CSV code lives in :mod:`airflow_hetero_gpu.collect.nvml_agent` because that file is
sent to hosts where this package is not installed and must run there alone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

from airflow_hetero_gpu.collect import nvml_agent
from airflow_hetero_gpu.collect.nvml_agent import NvmlUnavailable, render_query_csv

__all__ = ["AGENT_COMMAND", "AgentReply", "NvmlUnavailable", "agent_command", "agent_script",
           "nvml_query_csv", "parse_agent_reply"]

#: The remote command line by default; the agent's source goes to its stdin.
AGENT_COMMAND = "python3 -"
#: An interpreter name or path: letters, digits and ``_ . + - /`` only, so it can never be
#: anything but one word on the remote shell's command line.
_INTERPRETER = re.compile(r"^/?[A-Za-z0-9_.+-]+(?:/[A-Za-z0-9_.+-]+)*$")


def agent_command(python: str = "python3") -> str:
    """The remote command that runs the agent: ``<python> -``.

    ``python`` names the host's interpreter that has ``pynvml`` (a virtualenv's
    ``/opt/gpu/bin/python``, say); it is checked to be a plain name or path (ValueError).
    """
    if not isinstance(python, str) or not _INTERPRETER.fullmatch(python):
        raise ValueError(f"NVML python {python!r} must be a command name or path "
                         "(letters, digits, '_', '.', '+', '-', '/')")
    return f"{python} -"


def nvml_query_csv(nvml: ModuleType | Any | None = None, *,
                   proc_dir: str = nvml_agent.PROC_GPUS_DIR) -> str:
    """``nvidia-smi --query-gpu=<SPEC fields> --format=csv`` text for the local GPUs, from NVML.

    ``nvml`` defaults to the ``pynvml`` module (package ``nvidia-ml-py``). Raises
    :class:`NvmlUnavailable` (one-line reason) when NVML cannot be used: no ``pynvml``, no
    driver, no GPU.
    """
    if nvml is None:
        try:
            import pynvml as nvml  # noqa: PLC0415 - imported where NVML is actually used
        except ImportError as exc:
            raise NvmlUnavailable(f"pynvml is not installed ({exc}): pip install nvidia-ml-py") from None
    return render_query_csv(nvml, proc_dir)


@lru_cache(maxsize=1)
def agent_script() -> bytes:
    """The agent's source, to pipe into ``python3 -`` on a host."""
    return Path(nvml_agent.__file__).read_bytes()


@dataclass(frozen=True)
class AgentReply:
    """What the agent answered: the CSV text, or why NVML could not be used."""

    query_csv: str | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.query_csv)


def parse_agent_reply(stdout: str) -> AgentReply:
    """Read the agent's JSON line; anything else becomes an error reply (never raises)."""
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.strip()), "")
    try:
        data = json.loads(line)
    except ValueError:
        shown = line.strip()[:120] or "no output"
        return AgentReply(None, f"unexpected agent output: {shown!r}")
    if not isinstance(data, dict):
        return AgentReply(None, "unexpected agent output: not a JSON object")
    query, error = data.get("query_csv"), data.get("error")
    if error is not None:
        return AgentReply(None, " ".join(str(error).split()))
    if not isinstance(query, str) or not query.strip():
        return AgentReply(None, "agent answered no query_csv")
    return AgentReply(query, None)
