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
import secrets
import shutil
import signal
import sys
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Sequence

from airflow_hetero_gpu.testing import procs
from airflow_hetero_gpu.testing.fake_tools import set_nvidia_smi_present, write_tool_scripts
from airflow_hetero_gpu.testing.hoststate import EmulatedHost, HostStateMethods
from airflow_hetero_gpu.testing.sshd import Sshd, SshdError, free_port, generate_key
from airflow_hetero_gpu.testing.state import EMBEDDED_ONLY_FAULTS, HostSpec, write_state

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
#: Faults that act on processes or files rather than on what the fake tools read.
PROCESS_FAULTS = ("host_down", "hang", "host_key_changed", "sshd_killed", "network_silent")


class EmulatedCluster(HostStateMethods):
    """N emulated GPU hosts, each behind its own real ``sshd``; a context manager."""

    def __init__(self, root: Path | str, hosts: Sequence[HostSpec], *,
                 first_address: str = "127.0.0.11", start_timeout: float = 10.0,
                 python: str | None = None, training_stack: bool = True, sshd_log_level: str = "ERROR"):
        names = [h.name for h in hosts]
        if len(set(names)) != len(names):
            raise ValueError(f"host names must be unique: {names}")
        if not hosts:
            raise ValueError("an emulated cluster needs at least one host")
        for spec in hosts:
            for fault in spec.faults:
                self._check_fault(fault)
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
    def identity_file(self) -> Path:
        return self.root / "client" / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.root / "known_hosts"

    @property
    def authorized_keys_path(self) -> Path:
        return self.root / "authorized_keys"

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
                set_nvidia_smi_present(host.bin_dir, present=False, system_path=SYSTEM_PATH)
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

    # -- faults --------------------------------------------------------------------------------

    def _check_fault(self, kind: str) -> None:
        super()._check_fault(kind)
        if kind in EMBEDDED_ONLY_FAULTS:
            raise ValueError(f"fault {kind!r} is only emulated by the embedded SSH server; "
                             "use EmbeddedCluster for it")

    def _apply_process_fault(self, name: str, kind: str, *, on: bool) -> None:
        host = self.host(name)
        sshd = self._sshd[name]
        if kind == "nvidia_smi_missing":
            set_nvidia_smi_present(host.bin_dir, present=not on, system_path=SYSTEM_PATH)
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


__all__ = ["EmulatedCluster", "EmulatedHost", "SshdError"]
