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

import os
import shutil
import signal
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from airflow_hetero_gpu.testing import procs
from airflow_hetero_gpu.testing.cluster_base import PACKAGE_ROOT, SYSTEM_PATH, ClusterBase
from airflow_hetero_gpu.testing.fake_tools import set_nvidia_smi_present
from airflow_hetero_gpu.testing.hoststate import EmulatedHost
from airflow_hetero_gpu.testing.sshd import Sshd, SshdError, free_port, generate_key
from airflow_hetero_gpu.testing.state import EMBEDDED_ONLY_FAULTS, HostSpec, write_state

#: Faults that act on processes or files rather than on what the fake tools read.
PROCESS_FAULTS = ("host_down", "hang", "host_key_changed", "sshd_killed", "network_silent")


class EmulatedCluster(ClusterBase):
    """N emulated GPU hosts, each behind its own real ``sshd``; a context manager."""

    def __init__(self, root: Path | str, hosts: Sequence[HostSpec], *,
                 first_address: str = "127.0.0.11", start_timeout: float = 10.0,
                 python: str | None = None, training_stack: bool = True, sshd_log_level: str = "ERROR"):
        super().__init__(root, hosts, first_address=first_address, start_timeout=start_timeout,
                         python=python, training_stack=training_stack)
        #: sshd's LogLevel; "VERBOSE" logs every connection (see :meth:`connections`)
        self.sshd_log_level = sshd_log_level
        self._sshd: dict[str, Sshd] = {}
        self._silenced: dict[str, list[int]] = {}

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

    def _prepare(self) -> None:
        self._make_dirs()
        client_pub = generate_key(self.identity_file, f"hetero-gpu-emulated-client@{self.marker}")
        self.authorized_keys_path.write_text(client_pub + "\n", encoding="utf-8")
        self.hosts = []
        for spec, address in zip(self.specs, self._addresses):
            host = self._host_directory(spec, address, free_port(address))
            self.hosts.append(host)
            write_state(host.state_file, spec.to_state())
            sshd = Sshd(
                host.directory, address, host.port, env_marker=f"{self.marker}.{len(self.hosts)}",
                path_value=":".join((str(host.bin_dir),) + self._software_path() + SYSTEM_PATH),
                state_file=host.state_file, authorized_keys=self.authorized_keys_path,
                log_level=self.sshd_log_level,
            )
            self._host_keys[spec.name] = generate_key(sshd.host_key, f"{spec.name}@hetero-gpu-emulated")
            self._sshd[spec.name] = sshd
        self._write_known_hosts()
        self._write_summary()

    def stop(self) -> None:
        """Stop every sshd and kill every process started through it; idempotent."""
        for name in list(self._sshd):
            self._stop_host_processes(name)
        self._kill_stragglers()

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


__all__ = ["PACKAGE_ROOT", "SYSTEM_PATH", "EmulatedCluster", "EmulatedHost", "SshdError"]
