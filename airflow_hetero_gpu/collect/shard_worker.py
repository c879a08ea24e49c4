"""A collector worker process (:mod:`.shards`): collections asked for on stdin, results on stdout.

``python -m airflow_hetero_gpu.collect.shard_worker PARENT_PID``. Each request names the client
factory (the arguments of :func:`~.clients.paramiko_client_factory`, and whether its connections
are kept), the targets, the capture directory and the options of
:func:`~.ssh.collect_captures`, which runs them; every host's result is sent as soon as the host
is done, then ``done`` (or ``error`` with what the collection raised). Kept connections stay
open from one request to the next and are closed when the input closes. The worker exits when
its parent is gone (checked every second) and ignores SIGINT (its parent stops it).
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
from typing import Any, Sequence

from airflow_hetero_gpu.collect.clients import paramiko_client_factory
from airflow_hetero_gpu.collect.persistent import KeptConnections
from airflow_hetero_gpu.collect.ssh import collect_captures



def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(1)
        threading.Event().wait(1.0)


def _error(exc: BaseException) -> BaseException:
    try:
        pickle.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001 - an exception that does not pickle is sent as its text
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def serve(stdin: Any, stdout: Any) -> None:
    """The worker's loop: one collection per request until the input closes."""
    lock = threading.Lock()

    def send(message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with lock:
            try:
                stdout.write(data)
                stdout.flush()
            except BrokenPipeError:  # the parent is gone: nobody to collect for
                os._exit(1)

    factory: Any = None
    try:
        while True:
            try:
                _, spec, keep, targets, out_dir, options = pickle.load(stdin)
            except EOFError:
                return
            try:
                if factory is None:
                    factory = paramiko_client_factory(*spec)
                    if keep:
                        factory = KeptConnections(factory)
                collect_captures(targets, out_dir, factory, on_host=lambda r: send(("host", r)), **options)
            except Exception as exc:  # noqa: BLE001 - the parent raises it
                send(("error", _error(exc)))
                continue
            send(("done", None))
    finally:
        if isinstance(factory, KeptConnections):
            factory.close()


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the parent named by ``PARENT_PID`` (the first argument) until its input closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops its workers
    parent = int((sys.argv[1:] if argv is None else argv)[0])  # gone already if getppid() differs
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    logging.disable(logging.CRITICAL)  # each host's outcome goes back to the parent, which reports it
    stdin, stdout = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the results' stream
    serve(stdin, stdout)


if __name__ == "__main__":
    main()
