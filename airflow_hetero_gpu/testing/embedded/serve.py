"""``python -m airflow_hetero_gpu.testing.embedded serve FLEET.json``: the server process.

Reads a fleet file (written by :class:`~.cluster.EmbeddedCluster`: user, home, client keys,
software PATH, hosts with address, port, host-key file, state file, ``bin/`` and marker), starts
a listener per host, then prints one JSON line on stdout, the ready signal::

    {"event": "ready", "pid": 1234, "ports": {"node0001": 40123, ...}, "seconds": 1.9}

and serves until stdin reaches end-of-file or SIGTERM/SIGINT comes; then it closes every
listener and connection and kills every process it started. Meanwhile each line on stdin is a
control request answered by one line on stdout (same ``id``)::

    {"id": 1, "op": "fault", "host": "node0001", "kind": "hang", "on": true}   -> {"id": 1, "ok": true}
    {"id": 2, "op": "drop", "host": "node0001"}                   -> {"id": 2, "ok": true, "dropped": 1}
    {"id": 3, "op": "connections"}   -> {"id": 3, "ok": true, "connections": {...}, "opened": {...}, "sessions": {...}}
    {"id": 4, "op": "cpu"}                 -> {"id": 4, "ok": true, "self": 1.2, "children": 0.3}

A request that cannot be met gets ``{"id": N, "ok": false, "error": "one line"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import signal
import sys
import time
from typing import Any, Sequence

from airflow_hetero_gpu.testing.embedded.server import EmbeddedHost, Fleet, kill_processes, load_client_keys

#: Faults that act on the server (the others are state faults the fake tools read, or files).
SERVER_FAULTS = ("host_down", "hang", "sshd_killed", "host_key_changed")
#: Faults the embedded server cannot emulate (use the real-sshd cluster for them).
UNSUPPORTED_FAULTS = ("network_silent",)
_BATCH = 200


class FleetServer:
    """The hosts of one fleet file and the control requests that change them."""

    def __init__(self, fleet: Fleet):
        keys = load_client_keys(fleet.client_keys)
        self.hosts = {entry.name: EmbeddedHost(fleet, entry, keys) for entry in fleet.hosts}

    async def start(self) -> None:
        hosts = list(self.hosts.values())
        for first in range(0, len(hosts), _BATCH):
            await asyncio.gather(*(h.listen() for h in hosts[first:first + _BATCH]))

    async def close(self) -> None:
        hosts = list(self.hosts.values())
        await asyncio.gather(*(h.close(kill=False) for h in hosts), return_exceptions=True)
        kill_processes(hosts)

    def ports(self) -> dict[str, int]:
        return {name: host.port for name, host in self.hosts.items()}

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "cpu":
            own = resource.getrusage(resource.RUSAGE_SELF)
            kids = resource.getrusage(resource.RUSAGE_CHILDREN)
            return {"self": own.ru_utime + own.ru_stime, "children": kids.ru_utime + kids.ru_stime}
        if op == "connections":
            return {"connections": {name: len(h.connections) for name, h in self.hosts.items()},
                    "opened": {name: h.opened for name, h in self.hosts.items()},
                    "sessions": {name: h.sessions for name, h in self.hosts.items()}}
        host = self.hosts.get(request.get("host", ""))
        if host is None:
            raise ValueError(f"no emulated host {request.get('host')!r}")
        if op == "drop":
            return {"dropped": host.drop_connections()}
        if op == "fault":
            await self._fault(host, str(request.get("kind")), bool(request.get("on")))
            return {}
        raise ValueError(f"unknown request {op!r}")

    async def _fault(self, host: EmbeddedHost, kind: str, on: bool) -> None:
        if kind == "host_down":
            if on:
                await host.stop_listening()
                host.drop_connections()
                host.kill_processes()
            else:
                await host.listen()
        elif kind == "sshd_killed":  # sessions drop, what they started runs on (stdin at EOF)
            if on:
                await host.stop_listening()
                host.drop_connections()
            else:
                await host.listen()
        elif kind == "hang":  # new connections hang before the banner; open ones keep working
            if on:
                await host.go_silent()
            else:
                await host.stop_listening()
                await host.listen()
        elif kind == "host_key_changed":  # restarted with another key: everything it ran ends
            listening = host.acceptor is not None
            host.rekey(on)
            await host.stop_listening()
            host.drop_connections()
            host.kill_processes()
            if listening:
                await host.listen()
        else:
            raise ValueError(f"fault {kind!r} is not applied by the embedded server")


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def _serve(fleet: Fleet) -> int:
    started = time.monotonic()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = FleetServer(fleet)
    try:
        await server.start()
        _reply({"event": "ready", "pid": os.getpid(), "ports": server.ports(),
                "seconds": round(time.monotonic() - started, 3)})
        reader = asyncio.StreamReader(limit=1 << 20)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        stopping = asyncio.ensure_future(stop.wait())
        while True:
            reading = asyncio.ensure_future(reader.readline())
            await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not reading.done():
                reading.cancel()
                break
            line = reading.result()
            if not line:
                break
            try:
                request = json.loads(line)
                answer = await server.handle(request)
                _reply({"id": request.get("id"), "ok": True, **answer})
            except Exception as exc:  # noqa: BLE001 - every failure is a one-line answer
                rid = request.get("id") if isinstance(locals().get("request"), dict) else None
                _reply({"id": rid, "ok": False, "error": " ".join(str(exc).split()) or type(exc).__name__})
        stopping.cancel()
    finally:
        await server.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_hetero_gpu.testing.embedded",
                                     description="Serve an emulated GPU fleet over SSH (asyncssh).")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the hosts of a fleet file until stdin closes")
    serve.add_argument("fleet", help="the fleet file (JSON) written by EmbeddedCluster")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # HETERO_GPU_EMU_DEBUG=1: asyncssh's own log (connections, requests) into the server log
    debug = bool(os.environ.get("HETERO_GPU_EMU_DEBUG"))
    logging.getLogger("asyncssh").setLevel(logging.DEBUG if debug else logging.ERROR)
    try:
        with open(args.fleet, encoding="utf-8") as fh:
            fleet = Fleet.from_json(json.load(fh))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: fleet file {args.fleet}: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(fleet))
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
