"""``kill -USR1`` on a ``hetero-gpu`` command prints every thread's stack to its stderr, and the
command goes on (docs/troubleshooting.md)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the command's own start (cli/app.py's main registers the dump before it parses), then a wait
# that names itself in the stack, until stdin closes
_PROGRAM = ("import sys; from airflow_hetero_gpu.cli.app import _stacks_on_sigusr1 as register; register()\n"
            "def waiting_for_stdin(): print('ready', flush=True); sys.stdin.read(); print('went on', flush=True)\n"
            "waiting_for_stdin()")


def test_sigusr1_prints_every_threads_stack_and_the_command_goes_on():
    proc = subprocess.Popen([sys.executable, "-c", _PROGRAM], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGUSR1)
        lines = []
        for line in proc.stderr:  # until the dump names the waiting function
            lines.append(line)
            if "waiting_for_stdin" in line:
                break
        assert any(line.startswith("Current thread") for line in lines), lines
        proc.stdin.close()  # the command was not stopped by the signal: it goes on to its end
        assert proc.stdout.read() == "went on\n"
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
