"""Find and end the processes an emulated host started (Linux ``/proc``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of a process, or None when it is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2])


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def all_pids() -> list[int]:
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]


def descendants(root: int) -> dict[int, int]:
    """Every live descendant of ``root`` -> its depth below root (children are 1)."""
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        st = _stat(pid)
        if st is not None:
            children.setdefault(st[1], []).append(pid)
    found: dict[int, int] = {}
    frontier = [(root, 0)]
    while frontier:
        pid, depth = frontier.pop()
        for child in children.get(pid, []):
            if child not in found:
                found[child] = depth + 1
                frontier.append((child, depth + 1))
    return found


def command_line(pid: int) -> bytes:
    """The process's argv joined by NULs (b"" when it is gone or unreadable)."""
    try:
        return (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def signal_quietly(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid``; a process that is already gone is no error."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def with_env(name: str, value: str, *, prefix: bool = False) -> list[int]:
    """Processes whose environment holds ``name=value`` (or a value starting with ``value`` when
    ``prefix``)."""
    needle = f"{name}={value}".encode()
    found = []
    for pid in all_pids():
        try:
            env = (PROC / str(pid) / "environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        entries = env.split(b"\0")
        if any(e.startswith(needle) for e in entries) if prefix else needle in entries:
            found.append(pid)
    return found


def with_env_in(name: str, values: set[str]) -> list[int]:
    """Processes whose environment sets ``name`` to one of ``values`` (one scan of /proc)."""
    needles = {f"{name}={value}".encode() for value in values}
    found = []
    for pid in all_pids():
        try:
            env = (PROC / str(pid) / "environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if not needles.isdisjoint(env.split(b"\0")):
            found.append(pid)
    return found


def with_env_marker(marker: str, *, prefix: bool = False) -> list[int]:
    """Processes an emulated host started: ``HETERO_GPU_EMU_MARKER=<marker>`` (or a prefix)."""
    return with_env("HETERO_GPU_EMU_MARKER", marker, prefix=prefix)


def kill_all(pids_by_depth: dict[int, int], timeout: float = 3.0) -> list[int]:
    """SIGKILL the given processes and their process groups, deepest first; wait for them.

    Our own process group is never signalled. Returns the pids still alive at the deadline.
    """
    own_pgid = os.getpgrp()
    for pid in sorted(pids_by_depth, key=lambda p: -pids_by_depth[p]):
        st = _stat(pid)
        if st is None:
            continue
        pgid = st[2]
        try:
            if pgid > 1 and pgid != own_pgid:
                os.killpg(pgid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout
    left = [p for p in pids_by_depth if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left = [p for p in left if alive(p)]
    release_stale_pyenv_lock()
    return left


def release_stale_pyenv_lock(root: str | os.PathLike[str] | None = None) -> bool:
    """Remove pyenv's rehash lock when no ``pyenv rehash`` runs any more; True when removed.

    The emulated hosts are this machine: their shells read this account's ``~/.bashrc`` (as sshd's
    do), which on a pyenv machine runs ``pyenv init -`` and with it ``pyenv rehash``, which holds
    ``$PYENV_ROOT/shims/.pyenv-shim`` while it runs. A shell SIGKILLed there by an emulated host's
    death leaves the lock behind, and every later shell of every emulated host (and of this
    machine) then waits 60 s for it. A real host's death takes its own disk's lock with it, so
    emulating one must not leave it on the others: whoever kills an emulated host's processes
    calls this afterwards."""
    base = Path(root) if root is not None else Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    lock = base / "shims" / ".pyenv-shim"
    if not lock.exists():
        return False
    for pid in all_pids():
        cmd = command_line(pid)
        if b"pyenv" in cmd and b"rehash" in cmd and alive(pid):
            return False  # a rehash holds it, or is about to
    try:
        lock.unlink()
    except FileNotFoundError:
        return False
    return True
