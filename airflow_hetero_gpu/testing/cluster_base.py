"""What both emulated clusters are made of, written once: the checks of their hosts, the
client's identity and ``known_hosts``, the host directories with their state and fake tools,
``cluster.json``, the context manager and the sweep of stragglers.

:class:`~.cluster.EmulatedCluster` puts a real ``sshd`` behind each host;
:class:`~.embedded.cluster.EmbeddedCluster` serves every host from asyncssh server processes. Each
says how it starts and stops its servers (``start``, ``stop``) and how a process-level fault acts
(``_apply_process_fault``); the state and fault methods come from :class:`~.hoststate.HostStateMethods`.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import sys
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import Any, Sequence

from airflow_hetero_gpu.testing import procs
from airflow_hetero_gpu.testing.fake_tools import set_nvidia_smi_present, write_tool_scripts
from airflow_hetero_gpu.testing.hoststate import EmulatedHost, HostStateMethods
from airflow_hetero_gpu.testing.state import HostSpec

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")


class ClusterBase(HostStateMethods):
    """N emulated GPU hosts on consecutive loopback addresses from ``first_address``."""

    def __init__(self, root: Path | str, hosts: Sequence[HostSpec], *, first_address: str,
                 start_timeout: float, python: str | None, training_stack: bool):
        names = [h.name for h in hosts]
        if len(set(names)) != len(names):
            raise ValueError(f"host names must be unique: {sorted(n for n, c in Counter(names).items() if c > 1)}")
        if not hosts:
            raise ValueError("an emulated cluster needs at least one host")
        base = ipaddress.IPv4Address(first_address)
        if base not in LOOPBACK or base + (len(hosts) - 1) not in LOOPBACK:
            raise ValueError(f"addresses {base}..{base + (len(hosts) - 1)} are outside 127.0.0.0/8")
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
        self._addresses = [str(base + i) for i in range(len(hosts))]
        self.marker = secrets.token_hex(8)
        self.hosts: list[EmulatedHost] = []
        self._host_keys: dict[str, str] = {}
        self._started = False

    # -- paths and identity --------------------------------------------------------------------

    @property
    def identity_file(self) -> Path:
        return self.root / "client" / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.root / "known_hosts"

    def _software_path(self) -> tuple[str, ...]:
        """The directories of the training software on the hosts' PATH (before the system's)."""
        if not self.training_stack:
            return ()
        venv_bin = str(Path(self.python).parent)
        return () if venv_bin in SYSTEM_PATH else (venv_bin,)

    # -- preparing the hosts -------------------------------------------------------------------

    def _make_dirs(self) -> None:
        (self.root / "client").mkdir(parents=True, exist_ok=True)
        (self.root / "hosts").mkdir(parents=True, exist_ok=True)

    def _host_directory(self, spec: HostSpec, address: str, port: int) -> EmulatedHost:
        """The host's directory with its fake tools (``nvidia-smi`` left out for that fault); the
        caller writes its state file."""
        directory = self.root / "hosts" / spec.name
        directory.mkdir(parents=True, exist_ok=True)
        host = EmulatedHost(spec.name, address, port, directory)
        write_tool_scripts(host.bin_dir, self.python, PACKAGE_ROOT)
        if "nvidia_smi_missing" in spec.faults:
            set_nvidia_smi_present(host.bin_dir, present=False, system_path=SYSTEM_PATH)
        return host

    def _write_known_hosts(self) -> None:
        lines = []
        for host in self.hosts:
            key_type, key_b64 = self._host_keys[host.name].split()[:2]
            lines.append(f"[{host.address}]:{host.port} {key_type} {key_b64}\n")
        self.known_hosts_path.write_text("".join(lines), encoding="utf-8")

    def _summary_extra(self) -> dict[str, Any]:
        return {}

    def _write_summary(self) -> None:
        summary = {
            "user": self.user, "identity_file": str(self.identity_file),
            "known_hosts": str(self.known_hosts_path), **self._summary_extra(),
            "hosts": [{"name": h.name, "address": h.address, "port": h.port, "state": str(h.state_file)}
                      for h in self.hosts],
        }
        (self.root / "cluster.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> "ClusterBase":  # pragma: no cover - each cluster starts its servers
        raise NotImplementedError

    def stop(self) -> None:  # pragma: no cover - each cluster stops its servers
        raise NotImplementedError

    def _kill_stragglers(self) -> None:
        """Kill whatever a host ran that is still alive (found by the cluster's env marker)."""
        leftovers = procs.with_env_marker(self.marker + ".", prefix=True)
        if leftovers:
            procs.kill_all({pid: 1 for pid in leftovers})
        self._started = False

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
