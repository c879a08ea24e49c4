"""Carrying a preempted job's checkpoint to its new rank-0 host (``checkpoint_storage="host"``).

When ``checkpoint_dir`` is on each host's own disk, a job relaunched on other hosts would start
from scratch. Before the launch, the operator looks at ``checkpoint_dir`` on every host the job
ran on and on its new rank-0 host (SFTP over the task's SSH connections), takes the host whose
newest file is newest, and, when that is not the new rank-0 host, copies the directory's files
there (each into a temporary name, then renamed, modification times kept). A directory that is
the same on both (shared storage, or nothing newer) is left alone. Relative paths are taken from
``workdir`` (or the login directory): give an absolute ``checkpoint_dir``.
"""

from __future__ import annotations

import posixpath
import stat
from typing import Any, Callable, Iterable

CHUNK = 1 << 20


def _files(sftp: Any, directory: str) -> dict[str, Any]:
    try:
        entries = sftp.listdir_attr(directory)
    except OSError:
        return {}
    return {e.filename: e for e in entries if stat.S_ISREG(e.st_mode or 0) and not e.filename.startswith(".")}


def carry(job_id: str, directory: str, sources: Iterable[str], target: str, connect: Callable[[str], Any],
          log: Any) -> str | None:
    """Copy the newest checkpoint among ``sources`` to ``target`` (see the module docstring);
    returns the source host it came from, or None when nothing had to move."""
    clients: dict[str, Any] = {}
    sftps: list[Any] = []
    try:
        listed: dict[str, tuple[Any, dict[str, Any]]] = {}
        for host in dict.fromkeys([*sources, target]):
            try:
                clients[host] = connect(host)
                sftp = clients[host].open_sftp()
                sftps.append(sftp)
            except Exception as err:  # noqa: BLE001 - a host gone since: its checkpoint is out of reach
                log.warning("job %s: cannot look for its checkpoint on %s: %s", job_id, host, err)
                continue
            listed[host] = (sftp, _files(sftp, directory))
        newest = {h: max(e.st_mtime or 0 for e in files.values()) for h, (_, files) in listed.items() if files}
        if not newest:
            return None
        source = max(newest, key=lambda h: (newest[h], h == target))
        if source == target or target not in listed:
            return None
        src, files = listed[source]
        dst, there = listed[target]
        if all(n in there and there[n].st_size == e.st_size and there[n].st_mtime == e.st_mtime
               for n, e in files.items()):
            return None  # the same files: shared storage
        _mkdirs(dst, directory)
        total = 0
        for name, entry in sorted(files.items()):
            path, tmp = posixpath.join(directory, name), posixpath.join(directory, f".{name}.carry")
            with src.open(path, "rb") as fin, dst.open(tmp, "wb") as fout:
                while chunk := fin.read(CHUNK):
                    fout.write(chunk)
                    total += len(chunk)
            dst.utime(tmp, (entry.st_atime or entry.st_mtime, entry.st_mtime))
            dst.posix_rename(tmp, path)
        log.info("job %s: carried its checkpoint (%s, %d bytes) from %s to %s, its new rank-0 host",
                 job_id, ", ".join(sorted(files)), total, source, target)
        return source
    finally:
        for handle in [*sftps, *clients.values()]:
            try:
                handle.close()
            except Exception:  # noqa: BLE001
                pass


def before_launch(op: Any, job_id: str, earlier: Iterable[str], rank0: str, connect: Callable[[str], Any]) -> None:
    """With ``checkpoint_storage="host"``: carry the newest checkpoint to ``rank0`` before the launch."""
    if op.checkpoint_storage == "host" and op.checkpoint_dir:
        directory = op.checkpoint_dir
        if not posixpath.isabs(directory) and op.workdir:
            directory = posixpath.join(op.workdir, directory)
        carry(job_id, directory, earlier, rank0, connect, op.log)


def _mkdirs(sftp: Any, directory: str) -> None:
    parts = []
    head = directory
    while head not in ("", "/"):
        parts.append(head)
        head = posixpath.dirname(head)
    for path in reversed(parts):
        try:
            sftp.stat(path)
        except OSError:
            sftp.mkdir(path)
