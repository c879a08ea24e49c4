"""What both emulated clusters share: where a host answers, and changing its state and faults.

:class:`EmulatedHost` names one host (name, loopback address, port, directory with its state file
and fake-tool ``bin/``). :class:`HostStateMethods` is the part of the cluster interface that only
rewrites state files (``state``, ``set_state``, ``update_gpu``, ``add_gpu``, ``add_xid``,
``inject_fault``/``clear_fault``, ``faults``, ``hosts_arg``): the real-sshd cluster
(:mod:`.cluster`) and the embedded one (:mod:`.embedded`) inherit it, so a test or a benchmark
drives either the same way. Each cluster says how a process-level fault is applied
(``_apply_process_fault``).
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from airflow_hetero_gpu.testing.state import FAULTS, GPU_KEYS, STATE_FILE, current_uptime, read_state, write_state


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


def current_user() -> str:
    """The login name clients use (the user running the cluster)."""
    return pwd.getpwuid(os.geteuid()).pw_name


class HostStateMethods:
    """State and fault methods over ``self.hosts`` (a list of :class:`EmulatedHost`)."""

    hosts: list[EmulatedHost]

    @property
    def user(self) -> str:
        """The login name clients use (the user running the cluster)."""
        return current_user()

    def ssh_argv(self, name: str, command: str) -> list[str]:
        """An OpenSSH client command line that reaches the host with strict host-key checking
        (the cluster's ``identity_file`` and ``known_hosts_path``)."""
        host = self.host(name)
        return [
            "ssh", "-i", str(self.identity_file),
            "-o", f"UserKnownHostsFile={self.known_hosts_path}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
            "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5",
            "-p", str(host.port), f"{self.user}@{host.address}", command,
        ]

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

    def write_hosts_file(self, path: str | os.PathLike[str], names: Iterable[str] | None = None) -> Path:
        """Write a ``hetero-gpu collect --hosts-file`` file (one ``NAME=user@addr:port`` a line)."""
        chosen = [self.host(n) for n in names] if names is not None else self.hosts
        target = Path(path)
        target.write_text("".join(h.hosts_arg(self.user) + "\n" for h in chosen), encoding="utf-8")
        return target

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

    def _check_fault(self, kind: str) -> None:
        """ValueError for a fault this cluster cannot emulate (all of ``FAULTS`` by default)."""
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; known: {', '.join(FAULTS)}")

    def _set_fault(self, name: str, kind: str, *, on: bool) -> None:
        self._check_fault(kind)
        state = self.state(name)
        current = list(state.get("faults", []))
        if on == (kind in current):
            return
        self._apply_process_fault(name, kind, on=on)
        current = [f for f in current if f != kind] + ([kind] if on else [])
        state["faults"] = current
        write_state(self.host(name).state_file, state)

    def _apply_process_fault(self, name: str, kind: str, *, on: bool) -> None:
        raise NotImplementedError


__all__ = ["EmulatedHost", "HostStateMethods", "current_user"]
