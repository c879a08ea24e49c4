"""One real OpenSSH ``sshd`` serving one emulated host on a loopback address.

Everything lives in the host's directory: host key, ``authorized_keys``, ``sshd_config``, pid
file and sshd's log. Works as root (CI) and as a normal user: the config sets ``UsePAM no``,
``StrictModes no`` and ``PermitRootLogin prohibit-password``, and as root the privilege
separation directory ``/run/sshd`` is created when missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")


class SshdError(RuntimeError):
    """sshd could not be configured or started; the message carries sshd's own stderr."""


def find_sshd() -> str | None:
    """Path of the OpenSSH server binary, or None when it is not installed."""
    for candidate in SSHD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("sshd")


def find_ssh_keygen() -> str | None:
    return shutil.which("ssh-keygen") or next(
        (p for p in ("/usr/bin/ssh-keygen", "/usr/local/bin/ssh-keygen") if os.access(p, os.X_OK)), None
    )


def generate_key(path: Path, comment: str) -> str:
    """Generate an ed25519 key pair at ``path`` (no passphrase); return the public key line."""
    keygen = find_ssh_keygen()
    if keygen is None:
        raise SshdError("ssh-keygen not found (install openssh-client)")
    for p in (path, path.with_suffix(path.suffix + ".pub")):
        if p.exists():
            p.unlink()
    proc = subprocess.run(
        [keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        capture_output=True, text=True, timeout=30, check=False,
    )
    if proc.returncode != 0:
        raise SshdError(f"ssh-keygen failed for {path}: {proc.stderr.strip()}")
    path.chmod(0o600)
    return path.with_name(path.name + ".pub").read_text(encoding="utf-8").strip()


def free_port(address: str) -> int:
    """A port that is free on ``address`` right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def answers_ssh(address: str, port: int, timeout: float = 0.5) -> bool:
    """True when something on address:port accepts and sends an SSH banner."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(256).startswith(b"SSH-")
    except OSError:
        return False


class Sshd:
    """A managed ``sshd -D -e -f <config>`` for one host directory."""

    def __init__(self, host_dir: Path, address: str, port: int, *, env_marker: str,
                 path_value: str, state_file: Path, authorized_keys: Path, log_level: str = "ERROR"):
        self.host_dir = host_dir
        self.log_level = log_level
        self.address = address
        self.port = port
        self.config = host_dir / "sshd_config"
        self.host_key = host_dir / "ssh_host_ed25519_key"
        self.pid_file = host_dir / "sshd.pid"
        self.log_file = host_dir / "sshd.log"
        self.env_marker = env_marker
        self.path_value = path_value
        self.state_file = state_file
        self.authorized_keys = authorized_keys
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped_by_signal = False

    # -- configuration ------------------------------------------------------------------------

    def write_config(self) -> None:
        # SetEnv in sshd_config needs OpenSSH >= 8.7 (older sshd stops with "Bad configuration
        # option: SetEnv", which start() reports); the values may not contain spaces.
        # HETERO_GPU_SCOPE: the emulated hosts share this machine's process table; a sweep on one
        # counts only the processes of its own host (launch/command.py, SCOPE_ENV).
        # SHLVL=1: bash skips the account's ~/.bashrc (docs/emulated-cluster.md, "Start-up files").
        for value in (self.path_value, str(self.state_file), self.env_marker):
            if any(c.isspace() or c == '"' for c in value):
                raise SshdError(f"path {value!r} contains whitespace or quotes; use another root")
        self.config.write_text(
            "\n".join([
                f"Port {self.port}",
                f"ListenAddress {self.address}",
                f"HostKey {self.host_key}",
                f"PidFile {self.pid_file}",
                f"AuthorizedKeysFile {self.authorized_keys}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "StrictModes no",
                "UsePAM no",
                "UseDNS no",
                "PrintMotd no",
                "PrintLastLog no",
                "X11Forwarding no",
                "AllowAgentForwarding no",
                "AllowTcpForwarding no",
                "PermitTunnel no",
                "ClientAliveInterval 0",
                "LoginGraceTime 30",
                f"LogLevel {self.log_level}",
                f"SetEnv PATH={self.path_value} HETERO_GPU_EMU_STATE={self.state_file} "
                f"HETERO_GPU_EMU_MARKER={self.env_marker} HETERO_GPU_SCOPE={self.env_marker} SHLVL=1",
                "",
            ]),
            encoding="utf-8",
        )

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> None:
        """Start sshd and wait until its port accepts; raise SshdError with its stderr if not."""
        sshd = find_sshd()
        if sshd is None:
            raise SshdError("sshd not found (install openssh-server)")
        if os.geteuid() == 0 and not PRIVSEP_DIR.is_dir():
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.write_config()
        log = open(self.log_file, "ab")
        try:
            self.proc = subprocess.Popen(
                [sshd, "-D", "-e", "-f", str(self.config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, close_fds=True,
            )
        finally:
            log.close()
        self.stopped_by_signal = False
        deadline = time.monotonic() + timeout
        delay = 0.005
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SshdError(
                    f"sshd for {self.address}:{self.port} exited with status {self.proc.returncode}: "
                    f"{self.log_tail()}"
                )
            if answers_ssh(self.address, self.port) and self.proc.poll() is None:
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        self.kill()
        raise SshdError(
            f"sshd for {self.address}:{self.port} did not accept connections within {timeout:.0f}s: "
            f"{self.log_tail()}"
        )

    def connections(self) -> int:
        """TCP connections sshd accepted so far (its log's ``Connection from`` lines; needs
        ``log_level="VERBOSE"``)."""
        try:
            text = self.log_file.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return 0
        return sum(1 for line in text.splitlines() if line.startswith("Connection from "))

    def log_tail(self, limit: int = 2000) -> str:
        try:
            text = self.log_file.read_text(encoding="utf-8", errors="replace").strip()
        except FileNotFoundError:
            return "(no sshd output)"
        return " | ".join(text[-limit:].splitlines()) or "(no sshd output)"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def pause(self) -> None:
        """SIGSTOP the listener: new connections hang before the SSH banner."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGSTOP)
            self.stopped_by_signal = True

    def resume(self) -> None:
        if self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)
            self.stopped_by_signal = False

    def kill(self, grace: float = 2.0) -> None:
        """Stop the listener (its process group) and reap it."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=grace)
        self.proc = None
        self.stopped_by_signal = False
        try:
            self.pid_file.unlink()
        except FileNotFoundError:
            pass
