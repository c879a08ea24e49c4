"""The owners' read of the collector (``procs.txt``) answered in-process for the embedded fleet:
for each pid of the compute-apps listing, its process group and owner as ``ps -o
pid=,pgid=,user=`` prints them and the scheduler's job marker of its environment, read from this
machine's ``/proc`` (the emulated processes are real processes of the test machine). Standard
library only."""

from __future__ import annotations

import pwd

JOB_MARKER = b"HETERO_GPU_JOB_ID="


def _owner(pid: int) -> tuple[int, str] | None:
    """(process group, user name) of a live process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("utf-8", "replace")
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    pgid = int(stat[stat.rindex(")") + 2:].split()[2])
    uid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:"))
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return pgid, user


def _job(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return ""  # another user's process: not readable
    return next((e[len(JOB_MARKER):].decode("utf-8", "replace") for e in env if e.startswith(JOB_MARKER)), "")


def owners_text(apps: str) -> str:
    """What the collector's owners' read prints for ``apps`` (the compute-apps listing)."""
    out = []
    for line in apps.splitlines()[1:]:
        fields = line.split(",")
        pid = fields[1].replace(" ", "") if len(fields) > 1 else ""
        if not pid.isdigit():
            continue
        found = _owner(int(pid))
        if found is None:
            continue  # ended meanwhile: ps prints no line
        job = _job(int(pid))
        out.append(f"{int(pid)} {found[0]} {found[1]} {'job=' + job if job else ''}\n")
    return "".join(out)


__all__ = ["owners_text"]
