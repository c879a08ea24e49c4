"""Carrying a preempted job's checkpoint to its new hosts (``checkpoint_storage="host"``).

When ``checkpoint_dir`` is on each host's own disk, a job relaunched on other hosts would start
from scratch. Before the launch, the operator lists ``checkpoint_dir`` on every host the job ran
on and on its new hosts (over the task's SSH connections: plain commands, no SFTP needed), takes
the host whose newest file is newest and streams the directory's files to each new host that
lacks them (``tar`` out of one connection into the other; modification times kept): the
rendezvous, not the operator, decides which host runs rank 0, the rank that loads it. Files that
are the same on both sides (shared storage) are left alone. ``$HETERO_GPU_HOST`` in
``checkpoint_dir`` is each host's name (the launcher sets it for the job); relative paths are
taken from ``workdir``, else the login directory.
"""

from __future__ import annotations

import shlex
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

if TYPE_CHECKING:
    from airflow_hetero_gpu.operators.runtime import Runtime
    from airflow_hetero_gpu.operators.specs import LifecycleSpec, ProgramSpec

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


def carry(job_id: str, directory: str, sources: Iterable[str], targets: Sequence[str],
          connect: Callable[[str], Any], log: Any, keepalive: Callable[[], None] = lambda: None) -> str | None:
    """Copy the newest checkpoint among ``sources`` and ``targets`` to every host of ``targets``
    that lacks it (see the module docstring); returns the host it came from, or None when
    nothing had to move. ``keepalive`` is called between chunks (the job's lease: a large
    checkpoint may take longer to copy than the lease lasts)."""
    clients: dict[str, Any] = {}
    try:
        listed: dict[str, dict[str, tuple[float, int]]] = {}
        for host in dict.fromkeys([*sources, *targets]):
            try:
                clients[host] = connect(host)
                listed[host] = _listing(clients[host], host_dir(directory, host))
            except Exception as err:  # noqa: BLE001 - a host gone since: its checkpoint is out of reach
                log.warning("job %s: cannot look for its checkpoint on %s: %s", job_id, host, err)
        newest = {h: max(m for m, _ in files.values()) for h, files in listed.items() if files}
        if not newest:
            return None
        source = max(newest, key=lambda h: (newest[h], h in targets))
        todo = [h for h in targets if h in listed and listed[h] != listed[source]]  # same files: shared storage
        for target in todo:
            if not _copy(clients[source], host_dir(directory, source), clients[target], host_dir(directory, target),
                         sorted(listed[source]), keepalive):
                log.warning("job %s: carrying its checkpoint from %s to %s failed", job_id, source, target)
                return None
        if todo:
            log.info("job %s: carried its checkpoint (%s, %d bytes) from %s to %s, its new hosts (the rendezvous "
                     "decides which of them runs rank 0)", job_id, ", ".join(sorted(listed[source])),
                     sum(s for _, s in listed[source].values()), source, ", ".join(todo))
        return source if todo else None
    finally:
        for client in clients.values():
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass


def _copy(src: Any, src_dir: str, dst: Any, dst_dir: str, names: list[str], keepalive: Callable[[], None]) -> bool:
    """Stream ``names`` from ``src_dir`` on one host into ``dst_dir`` on another (``tar``)."""
    files = " ".join(shlex.quote(n) for n in names)
    _, out, _ = src.exec_command(f"tar -C {shlex.quote(src_dir)} -cf - {files}", timeout=600)
    d = shlex.quote(dst_dir)
    stdin, done, _ = dst.exec_command(f"mkdir -p {d} && tar -C {d} -xf -", timeout=600)
    while chunk := out.read(CHUNK):
        stdin.write(chunk)
        keepalive()
    stdin.channel.shutdown_write()
    return out.channel.recv_exit_status() == 0 and done.channel.recv_exit_status() == 0


def before_launch(program: ProgramSpec, lifecycle: LifecycleSpec, runtime: Runtime, job_id: str,
                  earlier: Iterable[str], hosts: Sequence[str], connect: Callable[[str], Any]) -> None:
    """With ``checkpoint_storage="host"``: carry the newest checkpoint to the job's ``hosts``."""
    directory = program.carried_checkpoint_dir()
    if directory is None:
        return
    last = [time.monotonic()]

    def keepalive() -> None:  # renew the lease every third of it while the copy runs
        now = time.monotonic()
        if now - last[0] >= lifecycle.lease_seconds / 3:
            runtime.ledger.renew(job_id, lifecycle.lease_seconds)
            runtime.lease_from = last[0] = now

    carry(job_id, directory, earlier, hosts, connect, runtime.log, keepalive)
    started = time.monotonic()  # taken before the call: the lease surely lasts from here
    runtime.ledger.renew(job_id, lifecycle.lease_seconds)  # the launch starts with a whole lease
    runtime.lease_from = started
