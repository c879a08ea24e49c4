"""An emulated heterogeneous GPU cluster: real sshd per host, fake ``nvidia-smi`` behind it.

Each host gets its own loopback address (127.0.0.11, .12, ...), its own ``sshd`` on a free high
port with its own ed25519 host key, and a state file its fake tools read. One client key per
cluster is authorised on every host, and ``known_hosts`` lists every host key, so clients can
verify host keys exactly as they would in production::

    with EmulatedCluster(tmp_path, demo_hosts()) as cluster:
        host = cluster.hosts[0]
        cluster.update_gpu(host.name, 3, ecc_uncorrected_volatile=2)
        cluster.inject_fault("gpu-box", "hang")
"""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import secrets
import shutil
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Iterable, Sequence

from airflow_hetero_gpu.testing import procs
from airflow_hetero_gpu.testing.fake_tools import write_tool_scripts
from airflow_hetero_gpu.testing.sshd import Sshd, SshdError, free_port, generate_key
from airflow_hetero_gpu.testing.state import (
    FAULTS,
    GPU_KEYS,
    STATE_FILE,
    HostSpec,
    current_uptime,
    read_state,
    write_state,
)

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
#: Faults that act on processes or files rather than on what the fake tools read.
PROCESS_FAULTS = ("host_down", "hang", "host_key_changed", "sshd_killed", "network_silent")


@dataclass(frozen=True)
class EmulatedHost:
    """Where one emulated host answers."""

    name: str
    address: str
    port: int
    directory: Path

    @property
    def state_file(self) -> Path:
        return self.directory / STATE_FILE

    @property
    def bin_dir(self) -> Path:
        return self.directory / "bin"

    def hosts_arg(self, user: str | None = None, *, named: bool = True) -> str:
        """This host in ``[NAME=][USER@]HOST:PORT`` form (the ``--hosts`` syntax)."""
        name = f"{self.name}=" if named else ""
        return f"{name}{user + '@' if user else ''}{self.address}:{self.port}"


class EmulatedCluster:
    """N emulated GPU hosts, each behind its own real ``sshd``; a context manager."""

    def __init__(self, root: Path | str, hosts: Sequence[HostSpec], *,
                 first_address: str = "127.0.0.11", start_timeout: float = 10.0,
                 python: str | None = None, training_stack: bool = True, sshd_log_level: str = "ERROR"):
        names = [h.name for h in hosts]
        if len(set(names)) != len(names):
            raise ValueError(f"host names must be unique: {names}")
        if not hosts:
            raise ValueError("an emulated cluster needs at least one host")
        self.root = Path(root).resolve()
        self.specs = list(hosts)
        self.start_timeout = start_timeout
        self.python = python or sys.executable
        # Real GPU hosts have the training software (python3 with torch, torchrun) on PATH; the
        # emulated ones get the bin directory of the interpreter that runs the cluster.
        self.training_stack = training_stack
        #: sshd's LogLevel; "VERBOSE" logs every connection (see :meth:`connections`)
        self.sshd_log_level = sshd_log_level
        base = ipaddress.IPv4Address(first_address)
        self._addresses = [str(base + i) for i in range(len(hosts))]
        for addr in self._addresses:
            if ipaddress.IPv4Address(addr) not in ipaddress.IPv4Network("127.0.0.0/8"):
                raise ValueError(f"address {addr} is outside 127.0.0.0/8")
        self.marker = secrets.token_hex(8)
        self.hosts: list[EmulatedHost] = []
        self._sshd: dict[str, Sshd] = {}
        self._host_keys: dict[str, str] = {}
        self._silenced: dict[str, list[int]] = {}
        self._started = False

    # -- paths and identity --------------------------------------------------------------------

    @property
    def user(self) -> str:
        """The login name clients use (the user running the cluster)."""
        return pwd.getpwuid(os.geteuid()).pw_name

    @property
    def identity_file(self) -> Path:
        return self.root / "client" / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.root / "known_hosts"

    @property
    def authorized_keys_path(self) -> Path:
        return self.root / "authorized_keys"

    def host(self, name: str) -> EmulatedHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no emulated host {name!r}; hosts: {', '.join(h.name for h in self.hosts)}")

    def hosts_arg(self, names: Iterable[str] | None = None, *, named: bool = True) -> str:
        """``NAME=user@addr:port,...`` for the given hosts (all by default), the value of
        ``hetero-gpu collect --hosts``; ``named=False`` leaves out the ``NAME=`` prefixes."""
        chosen = [self.host(n) for n in names] if names is not None else self.hosts
        return ",".join(h.hosts_arg(self.user, named=named) for h in chosen)

    def ssh_argv(self, name: str, command: str) -> list[str]:
        """An OpenSSH client command line that reaches the host with strict host-key checking."""
        host = self.host(name)
        return [
            "ssh", "-i", str(self.identity_file),
            "-o", f"UserKnownHostsFile={self.known_hosts_path}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
            "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5",
            "-p", str(host.port), f"{self.user}@{host.address}", command,
        ]

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> "EmulatedCluster":
        """Create keys, states and configs, start every sshd and wait until each accepts."""
        if self._started:
            return self
        try:
            self._prepare()
            moved = False
            for position, host in enumerate(list(self.hosts)):
                moved |= self._start_sshd(position, host)
            if moved:
                self._write_known_hosts()
                self._write_summary()
            self._started = True
            for spec in self.specs:
                for fault in spec.faults:
                    if fault in PROCESS_FAULTS:
                        self._apply_process_fault(spec.name, fault, on=True)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_sshd(self, position: int, host: EmulatedHost, attempts: int = 3) -> bool:
        """Start one host's sshd; if its port was taken meanwhile, move to a new free port.

        Returns True when the port changed (known_hosts must then be rewritten)."""
        sshd = self._sshd[host.name]
        for attempt in range(attempts):
            try:
                sshd.start(self.start_timeout)
                return attempt > 0
            except SshdError as exc:
                if "Address already in use" not in str(exc) or attempt == attempts - 1:
                    raise
                sshd.port = free_port(host.address)
                host = replace(host, port=sshd.port)
                self.hosts[position] = host
        return False

    def _software_path(self) -> tuple[str, ...]:
        if not self.training_stack:
            return ()
        venv_bin = str(Path(self.python).parent)
        return () if venv_bin in SYSTEM_PATH else (venv_bin,)

    def _prepare(self) -> None:
        (self.root / "client").mkdir(parents=True, exist_ok=True)
        (self.root / "hosts").mkdir(parents=True, exist_ok=True)
        client_pub = generate_key(self.identity_file, f"hetero-gpu-emulated-client@{self.marker}")
        self.authorized_keys_path.write_text(client_pub + "\n", encoding="utf-8")
        self.hosts = []
        for spec, address in zip(self.specs, self._addresses):
            directory = self.root / "hosts" / spec.name
            directory.mkdir(parents=True, exist_ok=True)
            port = free_port(address)
            host = EmulatedHost(spec.name, address, port, directory)
            self.hosts.append(host)
            write_state(host.state_file, spec.to_state())
            write_tool_scripts(host.bin_dir, self.python, PACKAGE_ROOT)
            sshd = Sshd(
                directory, address, port, env_marker=f"{self.marker}.{len(self.hosts)}",
                path_value=":".join((str(host.bin_dir),) + self._software_path() + SYSTEM_PATH),
                state_file=host.state_file, authorized_keys=self.authorized_keys_path,
                log_level=self.sshd_log_level,
            )
            self._host_keys[spec.name] = generate_key(sshd.host_key, f"{spec.name}@hetero-gpu-emulated")
            self._sshd[spec.name] = sshd
            if "nvidia_smi_missing" in spec.faults:
                self._set_nvidia_smi_present(host, present=False)
        self._write_known_hosts()
        self._write_summary()

    def _write_known_hosts(self) -> None:
        lines = []
        for host in self.hosts:
            key_type, key_b64 = self._host_keys[host.name].split()[:2]
            lines.append(f"[{host.address}]:{host.port} {key_type} {key_b64}")
        self.known_hosts_path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def _write_summary(self) -> None:
        summary = {
            "user": self.user,
            "identity_file": str(self.identity_file),
            "known_hosts": str(self.known_hosts_path),
            "hosts": [
                {"name": h.name, "address": h.address, "port": h.port,
                 "state": str(h.state_file)} for h in self.hosts
            ],
        }
        (self.root / "cluster.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")

    def stop(self) -> None:
        """Stop every sshd and kill every process started through it; idempotent."""
        for name in list(self._sshd):
            self._stop_host_processes(name)
        leftovers = procs.with_env_marker(self.marker + ".", prefix=True)
        if leftovers:
            procs.kill_all({pid: 1 for pid in leftovers})
        self._started = False

    def _stop_host_processes(self, name: str) -> None:
        sshd = self._sshd[name]
        victims: dict[int, int] = {}
        for pid in self._silenced.pop(name, []):
            procs.signal_quietly(pid, signal.SIGCONT)
        if sshd.pid is not None:
            if sshd.stopped_by_signal:
                sshd.resume()
            victims = procs.descendants(sshd.pid)
        for pid in procs.with_env_marker(sshd.env_marker):
            victims.setdefault(pid, 99)
        if victims:
            procs.kill_all(victims)
        sshd.kill()

    def __enter__(self) -> "EmulatedCluster":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def connections(self) -> dict[str, int]:
        """SSH connections each host accepted so far (``sshd_log_level="VERBOSE"``)."""
        return {name: sshd.connections() for name, sshd in self._sshd.items()}

    def sshd_pids(self) -> dict[str, int | None]:
        """The listener pid of every host (None while it is down)."""
        return {name: sshd.pid for name, sshd in self._sshd.items()}

    # -- state ---------------------------------------------------------------------------------

    def state(self, name: str) -> dict[str, Any]:
        """The host's current state (a fresh copy read from its file)."""
        return read_state(self.host(name).state_file)

    def set_state(self, name: str, **changes: Any) -> dict[str, Any]:
        """Replace top-level state keys (``driver_version=``, ``topology=``, ``xid=``, ...)."""
        if "faults" in changes:
            raise ValueError("use inject_fault()/clear_fault() to change faults")
        state = self.state(name)
        state.update(changes)
        write_state(self.host(name).state_file, state)
        return state

    def update_gpu(self, name: str, index: int, **fields: Any) -> dict[str, Any]:
        """Change fields of one GPU (keys of GpuSpec, e.g. ``utilization_gpu=90, lost=True``)."""
        unknown = set(fields) - GPU_KEYS
        if unknown:
            raise ValueError(f"unknown GPU fields {sorted(unknown)}; known: {sorted(GPU_KEYS)}")
        state = self.state(name)
        for gpu in state.get("gpus", []):
            if gpu.get("index") == index:
                gpu.update(fields)
                write_state(self.host(name).state_file, state)
                return gpu
        raise KeyError(f"host {name!r} has no GPU with index {index}")

    def add_gpu(self, name: str, gpu: dict[str, Any]) -> None:
        """Append a GPU to a host (a new card appearing, SPEC S10)."""
        state = self.state(name)
        state.setdefault("gpus", []).append(dict(gpu))
        write_state(self.host(name).state_file, state)

    def add_xid(self, name: str, gpu: int, xid: int, *, time: float | None = None,
                pid: int | None = None, process: str | None = None, text: str | None = None) -> None:
        """Append a kernel-log Xid line for one GPU of a host, logged now (``time``: at that
        uptime in seconds instead)."""
        state = self.state(name)
        entries = state.setdefault("xid", [])
        when = time if time is not None else current_uptime(state)
        entry: dict[str, Any] = {"time": when, "gpu": gpu, "xid": xid, "pid": pid, "name": process}
        if text:
            entry["text"] = text
        entries.append(entry)
        write_state(self.host(name).state_file, state)

    # -- faults --------------------------------------------------------------------------------

    def inject_fault(self, name: str, kind: str) -> None:
        """Turn a host-level fault on (see ``state.FAULTS``)."""
        self._set_fault(name, kind, on=True)

    def clear_fault(self, name: str, kind: str) -> None:
        """Turn a host-level fault off again."""
        self._set_fault(name, kind, on=False)

    def faults(self, name: str) -> list[str]:
        return list(self.state(name).get("faults", []))

    def _set_fault(self, name: str, kind: str, *, on: bool) -> None:
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; known: {', '.join(FAULTS)}")
        state = self.state(name)
        current = list(state.get("faults", []))
        if on == (kind in current):
            return
        self._apply_process_fault(name, kind, on=on)
        current = [f for f in current if f != kind] + ([kind] if on else [])
        state["faults"] = current
        write_state(self.host(name).state_file, state)

    def _apply_process_fault(self, name: str, kind: str, *, on: bool) -> None:
        host = self.host(name)
        sshd = self._sshd[name]
        if kind == "nvidia_smi_missing":
            self._set_nvidia_smi_present(host, present=not on)
        elif kind == "host_down":
            if on:
                self._stop_host_processes(name)
            else:
                sshd.start(self.start_timeout)
        elif kind == "hang":
            if on:
                sshd.pause()
            else:
                sshd.resume()
        elif kind == "sshd_killed":
            if on:  # what `pkill sshd` does: sessions drop, the processes they started run on
                sessions = self._sshd_sessions(name)
                sshd.kill()
                procs.kill_all({pid: 1 for pid in sessions})
            else:
                sshd.start(self.start_timeout)
        elif kind == "network_silent":
            if on:  # connections stay open but nothing comes through, new ones hang
                stopped = self._sshd_sessions(name)
                for pid in stopped:
                    procs.signal_quietly(pid, signal.SIGSTOP)
                sshd.pause()
                self._silenced[name] = stopped
            else:
                sshd.resume()
                for pid in self._silenced.pop(name, []):
                    procs.signal_quietly(pid, signal.SIGCONT)
        elif kind == "host_key_changed":
            original = sshd.host_key.with_name(sshd.host_key.name + ".orig")
            if on:
                shutil.copy2(sshd.host_key, original)
                shutil.copy2(sshd.host_key.with_name(sshd.host_key.name + ".pub"),
                             original.with_name(original.name + ".pub"))
                generate_key(sshd.host_key, f"{name}@hetero-gpu-emulated-rekeyed")
            else:
                os.replace(original, sshd.host_key)
                os.replace(original.with_name(original.name + ".pub"),
                           sshd.host_key.with_name(sshd.host_key.name + ".pub"))
            if sshd.pid is not None:
                self._stop_host_processes(name)
                sshd.start(self.start_timeout)

    def _sshd_sessions(self, name: str) -> list[int]:
        """The host's per-connection sshd processes (not the listener, not what they started)."""
        pid = self._sshd[name].pid
        if pid is None:
            return []
        return [p for p in procs.descendants(pid) if procs.command_line(p).startswith(b"sshd")]

    def _set_nvidia_smi_present(self, host: EmulatedHost, *, present: bool) -> None:
        script = host.bin_dir / "nvidia-smi"
        parked = host.bin_dir / ".nvidia-smi.parked"
        real = [d for d in SYSTEM_PATH if os.access(os.path.join(d, "nvidia-smi"), os.X_OK)]
        if present:
            if parked.exists():
                os.replace(parked, script)
            return
        if script.exists():
            os.replace(script, parked)
        if real:
            # A real nvidia-smi further down PATH would answer instead: shadow it with what the
            # shell says when a command is missing.
            script.write_text(
                "#!/bin/sh\necho \"sh: 1: nvidia-smi: not found\" >&2\nexit 127\n", encoding="utf-8"
            )
            script.chmod(0o755)


__all__ = ["EmulatedCluster", "EmulatedHost", "SshdError"]
