"""Before torchrun starts: are the training script and the working directory there on every host?

A script missing on one host would otherwise start torchrun everywhere, fail on that host with
Python's ``can't open file`` many lines up in the log, and be retried. :func:`check_paths` runs
one short POSIX shell command on each chosen host, on the connection the task's start already
holds (:class:`~airflow_hetero_gpu.launch.handoff.ConnectionHandoff`: no extra key exchange),
and :class:`LaunchPathError` names every host and path that is missing, in one line.

The script is looked up as torchrun would: relative to ``workdir``, else to the remote user's
home directory. Nothing is checked for a script that is not a file path (``-m module``,
``--no-python``, the decorator's payload, which the launch itself sends) or for a ``command``
launch (its argv is the user's own business), except its ``workdir``.
"""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.launch.command import LaunchSpec, ShellWord, Torchrun

#: prints one line per problem: ``workdir <path>: <why>`` or ``script <path>: <why>``
CHECK_SCRIPT = r"""
wd=$1 script=$2
if [ -n "$wd" ]; then
  if [ ! -e "$wd" ]; then echo "workdir $wd: no such directory"; exit 0; fi
  cd "$wd" 2>/dev/null || { echo "workdir $wd: not a directory this user can enter"; exit 0; }
fi
if [ -n "$script" ]; then
  if [ ! -e "$script" ]; then echo "script $script: no such file"
  elif [ ! -f "$script" ]; then echo "script $script: not a regular file"
  elif [ ! -r "$script" ]; then echo "script $script: not readable by this user"; fi
fi
"""

#: torchrun arguments after which the "script" is not a file
_NOT_A_FILE = ("-m", "--module", "--no-python", "--no_python")


class LaunchPathError(HeteroGpuError):
    """The script or working directory is missing on a chosen host (a mistake: never retried)."""


def paths_to_check(spec: LaunchSpec) -> tuple[str, str]:
    """(workdir, script) to look for; ``""`` where there is nothing to check."""
    program = spec.program
    script = ""
    if isinstance(program, Torchrun) and not isinstance(program.script, ShellWord) \
            and not any(a in _NOT_A_FILE for a in program.torchrun_args):
        script = program.script
    return spec.workdir or "", script


def _check_host(target: SshTarget, factory: Callable[[SshTarget], Any], workdir: str, script: str,
                timeout: float) -> list[str]:
    try:
        client = factory(target)
    except Exception:  # noqa: BLE001 - unreachable: the launch itself reports that host
        return []
    try:
        command = "sh -c " + " ".join(shlex.quote(a) for a in (CHECK_SCRIPT, "hetero-gpu-check", workdir, script))
        _, stdout, _ = client.exec_command(command, timeout=timeout)
        out = stdout.read().decode("utf-8", "replace")
        stdout.channel.recv_exit_status()
    except Exception:  # noqa: BLE001 - a check that cannot run does not stop the launch
        return []
    finally:
        client.close()  # back to the start's handoff: the launch takes this connection
    return [line.strip() for line in out.splitlines() if line.startswith(("workdir ", "script "))]


def check_paths(spec: LaunchSpec, targets: Sequence[SshTarget], client_factory: Callable[[SshTarget], Any], *,
                timeout: float = 30.0, max_parallel: int = 8) -> None:
    """Raise :class:`LaunchPathError` when the script or workdir is missing on a host of ``targets``:
    ``script /x/train.py: no such file on dgx-a2, dgx-a3 (relative to the home directory …)``."""
    workdir, script = paths_to_check(spec)
    if not targets or not (workdir or script):
        return
    with ThreadPoolExecutor(max_workers=min(max_parallel, len(targets))) as pool:
        found = list(pool.map(lambda t: (t.host_name, _check_host(t, client_factory, workdir, script, timeout)),
                              targets))
    by_problem: dict[str, list[str]] = {}
    for host, problems in found:
        for problem in problems:
            by_problem.setdefault(problem, []).append(host)
    if not by_problem:
        return
    where = ""
    if script and not script.startswith("/") and any(p.startswith("script ") for p in by_problem):
        where = f" (relative to workdir {workdir})" if workdir else " (relative to the remote user's home directory)"
    parts = [f"{problem} on {', '.join(hosts)}" for problem, hosts in by_problem.items()]
    raise LaunchPathError("; ".join(parts) + where + ": nothing was started; the training script and workdir "
                          "must exist at the same path on every host")


__all__ = ["CHECK_SCRIPT", "LaunchPathError", "check_paths", "paths_to_check"]
