"""Carrying a preempted job's checkpoint to its new rank-0 host (``checkpoint_storage="host"``).

When ``checkpoint_dir`` is on each host's own disk, a job relaunched on other hosts would start
from scratch. Before the launch, the operator lists ``checkpoint_dir`` on every host the job ran
on and on its new rank-0 host (over the task's SSH connections: plain commands, no SFTP needed),
takes the host whose newest file is newest and, when that is not the new rank-0 host, streams
the directory's files there (``tar`` out of one connection into the other; modification times
kept). A directory whose files are the same on both (shared storage) is left alone.
``$HETERO_GPU_HOST`` in ``checkpoint_dir`` is each host's name (the launcher sets it for the job);
relative paths are taken from ``workdir``, else the login directory.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Any, Callable, Iterable

CHUNK = 1 << 20
HOST_VAR = ("${HETERO_GPU_HOST}", "$HETERO_GPU_HOST")


def host_dir(directory: str, host: str) -> str:
    for var in HOST_VAR:
        directory = directory.replace(var, host)
    return directory


def _run(client: Any, command: str) -> tuple[int, str]:
    _, out, err = client.exec_command(command, timeout=120)
    text = out.read().decode("utf-8", "replace")
    return out.channel.recv_exit_status(), text or err.read().decode("utf-8", "replace")


def _listing(client: Any, directory: str) -> dict[str, tuple[float, int]]:
    """name -> (modification time, size) of the directory's regular files (not dot files)."""
    cmd = (f"[ -d {shlex.quote(directory)} ] || exit 0; find {shlex.quote(directory)} -maxdepth 1 -type f "
           f"! -name '.*' -printf '%T@ %s %f\\n'")
    status, text = _run(client, cmd)
    files = {}
    for line in text.splitlines() if status == 0 else ():
        mtime, size, name = line.split(" ", 2)
        files[name] = (float(mtime), int(size))
    return files


def carry(job_id: str, directory: str, sources: Iterable[str], target: str, connect: Callable[[str], Any],
          log: Any) -> str | None:
    """Copy the newest checkpoint among ``sources`` to ``target`` (see the module docstring);
    returns the source host it came from, or None when nothing had to move."""
    clients: dict[str, Any] = {}
    try:
        listed: dict[str, dict[str, tuple[float, int]]] = {}
        for host in dict.fromkeys([*sources, target]):
            try:
                clients[host] = connect(host)
                listed[host] = _listing(clients[host], host_dir(directory, host))
            except Exception as err:  # noqa: BLE001 - a host gone since: its checkpoint is out of reach
                log.warning("job %s: cannot look for its checkpoint on %s: %s", job_id, host, err)
        newest = {h: max(m for m, _ in files.values()) for h, files in listed.items() if files}
        if not newest or target not in listed:
            return None
        source = max(newest, key=lambda h: (newest[h], h == target))
        if source == target or listed[source] == listed[target]:
            return None  # already there (the same files: shared storage)
        src_dir, dst_dir = host_dir(directory, source), host_dir(directory, target)
        names = " ".join(shlex.quote(n) for n in sorted(listed[source]))
        _, out, _ = clients[source].exec_command(f"tar -C {shlex.quote(src_dir)} -cf - {names}", timeout=600)
        d = shlex.quote(dst_dir)
        stdin, done, err = clients[target].exec_command(f"mkdir -p {d} && tar -C {d} -xf -",
                                                        timeout=600)
        while chunk := out.read(CHUNK):
            stdin.write(chunk)
        stdin.channel.shutdown_write()
        if out.channel.recv_exit_status() != 0 or done.channel.recv_exit_status() != 0:
            log.warning("job %s: carrying its checkpoint from %s to %s failed: %s", job_id, source, target,
                        err.read().decode("utf-8", "replace").strip()[-300:])
            return None
        log.info("job %s: carried its checkpoint (%s, %d bytes) from %s to %s, its new rank-0 host", job_id,
                 ", ".join(sorted(listed[source])), sum(s for _, s in listed[source].values()), source, target)
        return source
    finally:
        for client in clients.values():
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass


def before_launch(op: Any, job_id: str, earlier: Iterable[str], rank0: str, connect: Callable[[str], Any]) -> None:
    """With ``checkpoint_storage="host"``: carry the newest checkpoint to ``rank0`` before the launch."""
    if op.checkpoint_storage == "host" and op.checkpoint_dir:
        directory = op.checkpoint_dir
        if not posixpath.isabs(directory) and op.workdir:
            directory = posixpath.join(op.workdir, directory)
        carry(job_id, directory, earlier, rank0, connect, op.log)
