"""``EmbeddedCluster``: an emulated GPU fleet served by one (or a few) asyncssh server processes.

The same interface as :class:`~airflow_hetero_gpu.testing.cluster.EmulatedCluster` (hosts with
name/address/port, ``user``, ``identity_file``, ``known_hosts_path``, ``hosts_arg()``, the state
and fault methods, start/stop, a context manager), but no ``sshd`` and no process per host: one
server process (:mod:`.serve`) listens on every host's loopback address with that host's own
ed25519 host key, answers the collector's commands in-process with the fake tools, and runs every
other command as a real local process. That is what lets this machine serve 1,000 hosts::

    with EmbeddedCluster(tmp_path, scale_hosts(1000)) as fleet:
        fleet.write_hosts_file(tmp_path / "hosts")     # for hetero-gpu collect --hosts-file
        fleet.inject_fault("node0007", "hang")
        fleet.drop_connections("node0008")

The server runs in its own process (``processes`` of them, hosts split between them), so its CPU
does not compete with the caller's interpreter; :meth:`start` returns when every server has
printed its ready line (an event, with ``start_timeout`` as the safety net).
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import asyncssh

from airflow_hetero_gpu.testing.cluster_base import PACKAGE_ROOT, SYSTEM_PATH, ClusterBase
from airflow_hetero_gpu.testing.embedded.serve import SERVER_FAULTS, UNSUPPORTED_FAULTS
from airflow_hetero_gpu.testing.fake_tools import set_nvidia_smi_present
from airflow_hetero_gpu.testing.hoststate import EmulatedHost
from airflow_hetero_gpu.testing.state import HostSpec, validate_state


class EmbeddedServerError(RuntimeError):
    """A server process could not start or did not answer; the message carries its log."""


def write_key_pair(path: Path, comment: str) -> str:
    """Write a new ed25519 key pair (OpenSSH format, mode 600); return the public key line."""
    key = asyncssh.generate_private_key("ssh-ed25519", comment=comment)
    path.write_bytes(key.export_private_key())
    path.chmod(0o600)
    public = key.export_public_key().decode().strip()
    path.with_name(path.name + ".pub").write_text(public + "\n", encoding="utf-8")
    return public


def _write_first_state(path: Path, state: dict[str, Any]) -> None:
    """The first version of a host's state: validated, compact, written before any reader runs
    (later changes go through ``write_state``, atomically)."""
    validate_state(state)
    path.write_text(json.dumps(state, sort_keys=True) + "\n", encoding="utf-8")


class _ServerProcess:
    """One ``serve`` process: its pipes, its ready line and its answers."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str]):
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         env=env, text=True, bufsize=1, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        threading.Thread(target=self._read, daemon=True, name="embedded-server-reader").start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def log_tail(self, limit: int = 2000) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return "(no server output)"
        return " | ".join(text[-limit:].splitlines()) or "(no server output)"

    def _next(self, deadline: float, what: str) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise EmbeddedServerError(f"embedded SSH server (pid {self.proc.pid}) gave no {what} "
                                      f"in time: {self.log_tail()}") from None
        if line is None:
            self.proc.wait(timeout=10)
            raise EmbeddedServerError(f"embedded SSH server exited with status {self.proc.returncode}: "
                                      f"{self.log_tail()}")
        return json.loads(line)

    def wait_ready(self, timeout: float) -> dict[str, int]:
        message = self._next(time.monotonic() + timeout, "ready signal")
        if message.get("event") != "ready":
            raise EmbeddedServerError(f"embedded SSH server: unexpected first line {message!r}")
        return {str(k): int(v) for k, v in message["ports"].items()}

    def request(self, op: str, timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
        with self._lock:
            rid = next(self._ids)
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(json.dumps({"id": rid, "op": op, **fields}) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                raise EmbeddedServerError(f"embedded SSH server is gone: {self.log_tail()}") from None
            deadline = time.monotonic() + timeout
            while True:
                answer = self._next(deadline, f"answer to {op!r}")
                if answer.get("id") == rid:
                    break
        if not answer.get("ok"):
            raise EmbeddedServerError(f"embedded SSH server: {op}: {answer.get('error')}")
        return answer

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # end-of-file: the server closes everything and exits
            except OSError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)


class EmbeddedCluster(ClusterBase):
    """N emulated GPU hosts behind ``processes`` asyncssh server processes; a context manager."""

    def __init__(self, root: Path | str, hosts: Sequence[HostSpec], *,
                 first_address: str = "127.0.0.11", start_timeout: float = 60.0,
                 python: str | None = None, training_stack: bool = True, processes: int = 1):
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        super().__init__(root, hosts, first_address=first_address, start_timeout=start_timeout,
                         python=python, training_stack=training_stack)
        self.processes = min(processes, len(hosts))
        self._servers: list[_ServerProcess] = []
        self._server_of: dict[str, _ServerProcess] = {}

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> "EmbeddedCluster":
        """Write keys and states, start the server processes and wait for their ready lines."""
        if self._started:
            return self
        try:
            fleets = self._prepare()
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
            for number, fleet_file in enumerate(fleets):
                self._servers.append(_ServerProcess(
                    [self.python, "-m", "airflow_hetero_gpu.testing.embedded", "serve", str(fleet_file)],
                    self.root / f"server-{number}.log", env))
            deadline = time.monotonic() + self.start_timeout
            ports: dict[str, int] = {}
            for server in self._servers:
                got = server.wait_ready(max(0.0, deadline - time.monotonic()))
                ports.update(got)
                self._server_of.update(dict.fromkeys(got, server))
            self.hosts = [EmulatedHost(h.name, h.address, ports[h.name], h.directory) for h in self.hosts]
            self._write_known_hosts()
            self._write_summary()
            self._started = True
            for spec in self.specs:
                for fault in spec.faults:
                    if fault in SERVER_FAULTS:
                        self._apply_process_fault(spec.name, fault, on=True)
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare(self) -> list[Path]:
        self._make_dirs()
        client_pub = write_key_pair(self.identity_file, f"hetero-gpu-emulated-client@{self.marker}")
        self.hosts, self._host_keys = [], {}
        entries: list[dict[str, Any]] = []
        for number, (spec, address) in enumerate(zip(self.specs, self._addresses), start=1):
            host = self._host_directory(spec, address, 0)
            self.hosts.append(host)
            _write_first_state(host.state_file, spec.to_state())
            key_file = host.directory / "ssh_host_ed25519_key"
            self._host_keys[spec.name] = write_key_pair(key_file, f"{spec.name}@hetero-gpu-emulated")
            entries.append({"name": spec.name, "address": address, "port": 0, "host_key": str(key_file),
                            "state": str(host.state_file), "bin_dir": str(host.bin_dir),
                            "marker": f"{self.marker}.{number}"})
        files = []
        for number in range(self.processes):
            fleet = {"user": self.user, "home": os.path.expanduser("~"), "client_keys": [client_pub],
                     "path_tail": [*self._software_path(), *SYSTEM_PATH], "hosts": entries[number::self.processes]}
            path = self.root / f"fleet-{number}.json"
            path.write_text(json.dumps(fleet) + "\n", encoding="utf-8")
            files.append(path)
        return files

    def _summary_extra(self) -> dict[str, Any]:
        return {"server": "embedded"}

    def stop(self) -> None:
        """Stop every server (which kills what it ran) and any straggler by marker; idempotent."""
        for server in self._servers:
            server.stop()
        self._servers, self._server_of = [], {}
        self._kill_stragglers()

    def server_pids(self) -> list[int]:
        """The pids of the server processes (for CPU accounting)."""
        return [s.proc.pid for s in self._servers if s.proc.poll() is None]

    # -- what only the embedded server can say or do -------------------------------------------

    def _server(self, name: str) -> _ServerProcess:
        self.host(name)  # KeyError naming the hosts
        if not self._started:
            raise EmbeddedServerError("the embedded cluster is not started")
        return self._server_of[name]

    def drop_connections(self, name: str) -> int:
        """Close the host's open SSH connections at once (new ones are accepted); returns how many."""
        return int(self._server(name).request("drop", host=name)["dropped"])

    def connections(self) -> dict[str, int]:
        """Open SSH connections per host, now."""
        counts: dict[str, int] = {}
        for server in self._servers:
            counts.update(server.request("connections")["connections"])
        return counts

    def connections_opened(self) -> dict[str, int]:
        """SSH connections accepted per host since the fleet started (closed ones included)."""
        return self._counts("opened")

    def sessions_opened(self) -> dict[str, int]:
        """SSH sessions (exec channels) opened per host since the fleet started."""
        return self._counts("sessions")

    def _counts(self, key: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for server in self._servers:
            counts.update(server.request("connections")[key])
        return counts

    def server_cpu_seconds(self) -> float:
        """CPU seconds used so far by the servers and the processes they ran and reaped."""
        total = 0.0
        for server in self._servers:
            answer = server.request("cpu")
            total += float(answer["self"]) + float(answer["children"])
        return total

    # -- faults --------------------------------------------------------------------------------

    def _check_fault(self, kind: str) -> None:
        super()._check_fault(kind)
        if kind in UNSUPPORTED_FAULTS:
            raise ValueError(f"fault {kind!r} is not supported by the embedded SSH server; "
                             "use EmulatedCluster (real sshd) for it")

    def _apply_process_fault(self, name: str, kind: str, *, on: bool) -> None:
        if kind == "nvidia_smi_missing":
            set_nvidia_smi_present(self.host(name).bin_dir, present=not on, system_path=SYSTEM_PATH)
        elif kind in SERVER_FAULTS:
            self._server(name).request("fault", host=name, kind=kind, on=on)


__all__ = ["EmbeddedCluster", "EmbeddedServerError", "write_key_pair"]
