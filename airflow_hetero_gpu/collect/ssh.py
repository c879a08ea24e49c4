"""Collect captures (SPEC section 2) from many GPU hosts over SSH, in parallel.

For every target, in a thread pool bounded by ``max_parallel`` (sshd's ``MaxStartups`` defaults
to 10:30:100, so an unbounded fan-out gets connections dropped), open a paramiko ``SSHClient``
through ``client_factory``, run three constant commands and write
``out_dir/hosts/<host>/{query.csv,topo.txt,xid.log}``. A host that fails gets ``error.txt`` with
a one-line reason instead; it never fails the whole collection.

With ``use_nvml=True`` the query comes from the NVML agent (:mod:`.nvml`) piped into the host's
``python3`` (or the interpreter named by ``nvml_python``); where that cannot run (no python3, no pynvml, NVML failing) the host falls back to
``nvidia-smi`` and the report carries a warning saying why.

``client_factory(target)`` returns a *connected* client, so the same code serves plain paramiko
(:func:`paramiko_client_factory`, for the command line) and Airflow's SSHHook. A factory that
accepts a ``connect_timeout`` keyword gets the collection's connect timeout.
"""

from __future__ import annotations

import getpass
import inspect
import logging
import os
import re
import select
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import paramiko

from airflow_hetero_gpu.capture.directory import QUERY_FIELDS
from airflow_hetero_gpu.capture.query import EXTRA_HEALTH_FIELDS, OPTIONAL_FIELDS, field_group
from airflow_hetero_gpu.collect.mig import MIG_FILES, mig_enabled, mig_files
from airflow_hetero_gpu.collect.nvml import AgentReply, agent_command, agent_script, parse_agent_reply
from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.fsutil import atomic_write

log = logging.getLogger(__name__)

#: paramiko logs a traceback for every failed handshake; our clients log on this channel, kept
#: quiet by default (the one-line reason goes to error.txt). Lower its level to debug SSH.
PARAMIKO_LOG_CHANNEL = f"{__name__}.paramiko"
logging.getLogger(PARAMIKO_LOG_CHANNEL).setLevel(logging.CRITICAL)
logging.getLogger(PARAMIKO_LOG_CHANNEL).addHandler(logging.NullHandler())

#: Constant remote command lines: nothing from the user is ever interpolated into them.
QUERY_COMMAND = f"nvidia-smi --query-gpu={QUERY_FIELDS} --format=csv"
#: Older spellings of extra health fields, tried when a driver refuses the current one.
OLDER_FIELD_NAMES = {"clocks_event_reasons.hw_slowdown": "clocks_throttle_reasons.hw_slowdown"}
TOPO_COMMAND = "nvidia-smi topo -m"
#: The journal first (readable without root for members of adm/systemd-journal), else dmesg
#: (readable without root unless kernel.dmesg_restrict=1). Exit 1 with no output = no Xids.
XID_COMMAND = "journalctl -k -q --no-pager -g 'NVRM: Xid' 2>/dev/null || dmesg | grep 'NVRM: Xid'"

_KERNEL_LOG_DENIED = re.compile(
    r"operation not permitted|permission denied|read kernel buffer failed|no journal files|"
    r"not seeing messages from other users|insufficient permissions|command not found",
    re.IGNORECASE,
)

CAPTURE_FILES = ("query.csv", "topo.txt", "xid.log", "mig.txt", "mig-usage.txt")
ERROR_FILE = "error.txt"

ClientFactory = Callable[..., paramiko.SSHClient]


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class HostResult:
    """What happened to one host."""

    host: str
    target: str
    ok: bool
    reason: str | None = None
    seconds: float = 0.0
    attempts: int = 0
    files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    query_source: str | None = None  # "nvidia-smi" or "nvml": what produced query.csv
    config_error: bool = False  # the failure is the setup's (connection, key), not the host's


@dataclass
class CollectReport:
    """Per-host outcome of :func:`collect_captures`, in the order of the targets."""

    out_dir: Path
    hosts: list[HostResult]
    seconds: float = 0.0

    @property
    def ok(self) -> list[HostResult]:
        return [h for h in self.hosts if h.ok]

    @property
    def failed(self) -> list[HostResult]:
        return [h for h in self.hosts if not h.ok]

    def __getitem__(self, host: str) -> HostResult:
        for result in self.hosts:
            if result.host == host:
                return result
        raise KeyError(host)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (for ``--json`` and XCom)."""
        return {
            "out_dir": str(self.out_dir),
            "seconds": round(self.seconds, 3),
            "hosts": [dict(asdict(h), seconds=round(h.seconds, 3)) for h in self.hosts],
        }


# --------------------------------------------------------------------------------------------
# Errors and their one-line reasons
# --------------------------------------------------------------------------------------------


class HostFailure(Exception):
    """A host could not be collected; ``str()`` is the one-line reason for error.txt.

    ``config``: the cause is the setup, not the host (an unusable connection, a rejected key):
    waiting or retrying cannot help."""

    def __init__(self, reason: str, *, retryable: bool = False, config: bool = False):
        super().__init__(" ".join(reason.split()))
        self.retryable = retryable
        self.config = config


def _first_line(*texts: str) -> str:
    for text in texts:
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return "(no output)"


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}" if hasattr(key, "fingerprint") else key.get_name()


def classify_connect_error(exc: BaseException, target: SshTarget, timeout: float,
                           elapsed: float = 0.0) -> HostFailure:
    """Turn whatever connecting raised into a one-line reason, retryable or not.

    ``elapsed`` (seconds the attempt took) tells a silent server apart from a dropped
    connection: paramiko reports both as various SSHExceptions.
    """
    where = target.endpoint
    if isinstance(exc, HostFailure):
        return exc
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostFailure(
            f"host key mismatch for {where}: server offered {_fingerprint(exc.key)}, "
            f"known_hosts has {_fingerprint(exc.expected_key)}"
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return HostFailure(f"authentication failed for {target.user or getpass.getuser()}@{where}: {exc}",
                           config=True)
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        errnos = {getattr(e, "errno", None) for e in exc.errors.values()}
        if errnos <= {111, 10061}:  # ECONNREFUSED (Linux, Windows)
            return HostFailure(f"connection refused ({where})", retryable=True)
        return HostFailure(f"cannot connect to {where}: {_first_line(str(exc))}", retryable=True)
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return HostFailure(f"timeout connecting to {where} after {timeout:g}s")
    if isinstance(exc, ConnectionRefusedError):
        return HostFailure(f"connection refused ({where})", retryable=True)
    if isinstance(exc, paramiko.SSHException):
        text = str(exc)
        if "not found in known_hosts" in text:
            return HostFailure(f"unknown host key for {where}: not in known_hosts (host keys are verified)")
        context = exc.__context__
        if ("Negotiation timed out" in text or isinstance(context, (socket.timeout, TimeoutError))
                or elapsed >= 0.9 * timeout):
            return HostFailure(f"timeout: no SSH handshake from {where} within {timeout:g}s")
        if "Error reading SSH protocol banner" in text:
            return HostFailure(f"connection closed by {where} before the SSH banner", retryable=True)
        return HostFailure(f"ssh error with {where}: {_first_line(text)}", retryable=True)
    if isinstance(exc, (EOFError, ConnectionError)):
        return HostFailure(f"connection to {where} lost: {type(exc).__name__}", retryable=True)
    if isinstance(exc, OSError):
        return HostFailure(f"cannot connect to {where}: {exc.strerror or exc}", retryable=True)
    return HostFailure(f"cannot connect to {where}: {type(exc).__name__}: {_first_line(str(exc))}")


def set_nodelay(client: paramiko.SSHClient) -> None:
    """``TCP_NODELAY`` on the client's socket: each small SSH packet goes out at once instead of
    waiting ~40 ms for the peer's delayed acknowledgement (Nagle's algorithm)."""
    transport = client.get_transport()
    sock = getattr(transport, "sock", None)
    if isinstance(sock, socket.socket):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # not a TCP socket (a proxy command's pipe)


# --------------------------------------------------------------------------------------------
# Running a command
# --------------------------------------------------------------------------------------------


@dataclass
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


def run_command(client: paramiko.SSHClient, command: str, timeout: float,
                label: str | None = None, stdin: bytes | None = None) -> CommandResult:
    """Run one command on a connected client, reading stdout and stderr together.

    ``stdin``, when given, is sent to the command and its input closed. Raises
    HostFailure("timeout: ...") when it does not finish within ``timeout`` seconds.
    """
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise HostFailure("ssh connection is not active", retryable=True)
    deadline = time.monotonic() + timeout
    try:
        channel = transport.open_session(timeout=timeout)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise HostFailure(f"cannot open an SSH session: {_first_line(str(exc)) or type(exc).__name__}",
                          retryable=True) from exc
    out, err = bytearray(), bytearray()
    try:
        channel.settimeout(timeout)
        channel.exec_command(command)
        if stdin is not None:
            try:
                channel.sendall(stdin)
                channel.shutdown_write()
            except OSError:
                pass  # the command ended without reading its input; its exit status says why
        while True:
            while channel.recv_ready():
                out += channel.recv(65536)
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
            if channel.exit_status_ready() and (channel.eof_received or channel.closed) \
                    and not channel.recv_ready() and not channel.recv_stderr_ready():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HostFailure(f"timeout: {label or command!r} did not finish within {timeout:g}s")
            select.select([channel], [], [], min(remaining, 0.25))
        return CommandResult(channel.recv_exit_status(), out.decode("utf-8", "replace"),
                             err.decode("utf-8", "replace"))
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise HostFailure(f"ssh session failed: {_first_line(str(exc)) or type(exc).__name__}",
                          retryable=True) from exc
    finally:
        channel.close()


def _nvidia_smi_failure(result: CommandResult) -> HostFailure:
    if result.returncode == 127:
        return HostFailure("nvidia-smi: command not found")
    return HostFailure(f"nvidia-smi exit {result.returncode}: {_first_line(result.stdout, result.stderr)}")


def _has_query_header(stdout: str) -> bool:
    return any(line.startswith("index") for line in stdout.splitlines())


def _nvml_query(client: paramiko.SSHClient, command_timeout: float, python: str) -> AgentReply:
    """Run the NVML agent on the host (its source on stdin); a timeout fails the host."""
    result = run_command(client, agent_command(python), command_timeout, "NVML agent", stdin=agent_script())
    if result.returncode == 127:
        return AgentReply(None, f"{python}: command not found")
    if result.returncode != 0:
        return AgentReply(None, f"{python} exit {result.returncode}: {_first_line(result.stderr, result.stdout)}")
    reply = parse_agent_reply(result.stdout)
    if reply.ok and not _has_query_header(reply.query_csv or ""):
        return AgentReply(None, f"agent output has no CSV header: {_first_line(reply.query_csv or '')}")
    return reply


_INVALID_FIELD = re.compile(r'Field "(?P<field>[^"]+)" is not a valid field to query')


def _smi_query(client: paramiko.SSHClient, command_timeout: float, warnings: list[str]) -> CommandResult:
    """``nvidia-smi --query-gpu`` with the SPEC fields plus ``OPTIONAL_FIELDS`` (health, MIG
    mode, NVLink fabric).

    A driver that does not know an extra field refuses the whole query (``Field "x" is not a
    valid field to query.``, exit 2): the field is asked for under its older name where it has
    one, else left out with the fields that came with it (``field_group``), and the query runs
    again; the SPEC fields are always asked for.
    """
    extra = list(OPTIONAL_FIELDS)
    while True:
        fields = ",".join([QUERY_FIELDS, *extra])
        query = run_command(client, f"nvidia-smi --query-gpu={fields} --format=csv", command_timeout,
                            "nvidia-smi --query-gpu")
        match = _INVALID_FIELD.search(query.stdout) if query.returncode == 2 else None
        if match is None or not extra:
            return query
        field = match["field"]
        if field not in extra:  # refused one of the SPEC fields: nothing more to leave out
            extra = []
        elif field in OLDER_FIELD_NAMES:
            extra[extra.index(field)] = OLDER_FIELD_NAMES[field]
        elif field in EXTRA_HEALTH_FIELDS or field in OLDER_FIELD_NAMES.values():
            extra.remove(field)
            warnings.append(f"nvidia-smi does not know {field}; its health rule is off for this host")
        else:
            group = field_group(field)
            extra = [f for f in extra if f not in group]
            warnings.append(f"nvidia-smi does not know {field}; {', '.join(group)} not read on this host")


def _query(client: paramiko.SSHClient, command_timeout: float, nvml_python: str | None,
           warnings: list[str]) -> tuple[str, str]:
    """(query.csv text, its source): the NVML agent when asked (``nvml_python`` set) and able,
    else nvidia-smi."""
    if nvml_python is not None:
        reply = _nvml_query(client, command_timeout, nvml_python)
        if reply.ok and reply.query_csv is not None:
            lost = [ln for ln in reply.query_csv.splitlines() if ln.startswith("Unable to determine")]
            if lost:
                warnings.append(f"nvml: {lost[0]}")
            return reply.query_csv, "nvml"
        warnings.append(f"NVML agent not used ({reply.error}); used nvidia-smi")
    query = _smi_query(client, command_timeout, warnings)
    if not _has_query_header(query.stdout):
        raise _nvidia_smi_failure(query)
    if query.returncode != 0:
        # The real tool exits non-zero when a GPU's handle is lost but still prints the others.
        warnings.append(f"nvidia-smi exit {query.returncode}: {_first_line(query.stdout)}")
    return query.stdout, "nvidia-smi"


def gather(client: paramiko.SSHClient, command_timeout: float, read_kernel_log: bool,
           nvml_python: str | None = None) -> tuple[dict[str, str], list[str], str]:
    """Run the capture commands on one host: ({file name: text}, warnings, query source).

    ``nvml_python``: the host interpreter to run the NVML agent with; None: nvidia-smi only.
    """
    warnings: list[str] = []
    query_text, source = _query(client, command_timeout, nvml_python, warnings)
    topo = run_command(client, TOPO_COMMAND, command_timeout, TOPO_COMMAND)
    if topo.returncode != 0:
        failure = _nvidia_smi_failure(topo)
        raise HostFailure(f"topo -m: {failure}")
    files = {"query.csv": query_text, "topo.txt": topo.stdout}
    if mig_enabled(query_text):
        def run(command: str, label: str) -> tuple[int, str, str]:
            r = run_command(client, command, command_timeout, label)
            return r.returncode, r.stdout, r.stderr

        files.update(mig_files(run, warnings))
    if read_kernel_log:
        xid = run_command(client, XID_COMMAND, command_timeout, "kernel log read")
        lines = [line for line in xid.stdout.splitlines() if "NVRM: Xid" in line]
        # exit 1 with no line is "no Xid"; a denial shows on stderr (other stderr text, such as
        # what a login shell's rc files print, is noise)
        if lines or xid.returncode in (0, 1) and not _KERNEL_LOG_DENIED.search(xid.stderr):
            files["xid.log"] = "".join(line + "\n" for line in lines)
        else:
            warnings.append(f"kernel log not readable: {_first_line(xid.stderr, xid.stdout)}")
    return files, warnings, source


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def _write_success(host_dir: Path, files: dict[str, str]) -> list[str]:
    for name, text in files.items():
        atomic_write(host_dir / name, text)
    # a stale error, or a MIG listing of a host whose GPUs no longer have MIG enabled
    for name in (ERROR_FILE, *(f for f in MIG_FILES if f not in files)):
        try:
            (host_dir / name).unlink()
        except FileNotFoundError:
            pass
    return sorted(files)


def _write_failure(host_dir: Path, reason: str) -> None:
    # The last good query.csv/topo.txt stay: the host's GPUs remain known (and unreachable).
    atomic_write(host_dir / ERROR_FILE, reason + "\n")


# --------------------------------------------------------------------------------------------
# The collection
# --------------------------------------------------------------------------------------------


def _accepts_connect_timeout(factory: ClientFactory) -> bool:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return "connect_timeout" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def collect_host(target: SshTarget, out_dir: Path, client_factory: ClientFactory, *,
                 connect_timeout: float = 10, command_timeout: float = 30, retries: int = 2,
                 read_kernel_log: bool = True, use_nvml: bool = False,
                 nvml_python: str = "python3") -> HostResult:
    """Collect one host into ``out_dir/hosts/<host>/``; never raises for a host-side problem."""
    started = time.monotonic()
    host_dir = Path(out_dir) / "hosts" / target.host_name
    result = HostResult(host=target.host_name, target=str(target), ok=False)
    pass_timeout = _accepts_connect_timeout(client_factory)
    failure: HostFailure | None = None
    for attempt in range(retries + 1):
        result.attempts = attempt + 1
        client: paramiko.SSHClient | None = None
        attempt_started = time.monotonic()
        try:
            try:
                client = (client_factory(target, connect_timeout=connect_timeout) if pass_timeout
                          else client_factory(target))
            except Exception as exc:  # noqa: BLE001 - every connect error becomes a reason
                raise classify_connect_error(exc, target, connect_timeout,
                                             time.monotonic() - attempt_started) from exc
            files, warnings, result.query_source = gather(
                client, command_timeout, read_kernel_log, nvml_python if use_nvml else None)
            result.files = _write_success(host_dir, files)
            result.warnings = warnings
            result.ok = True
            failure = None
            break
        except HostFailure as exc:
            failure = exc
            if not exc.retryable or attempt == retries:
                break
            log.info("collect %s: %s; retrying (%d/%d)", target.host_name, exc, attempt + 1, retries)
            time.sleep(min(0.2 * 2 ** attempt, 2.0))
        finally:
            if client is not None:
                try:
                    client.close()
                except Exception:  # noqa: BLE001 - closing a broken client may raise anything
                    pass
    if failure is not None:
        result.reason = str(failure)
        result.config_error = failure.config
        _write_failure(host_dir, result.reason)
        log.warning("collect %s failed: %s", target.host_name, result.reason)
    result.seconds = time.monotonic() - started
    return result


def collect_captures(targets: Sequence[SshTarget] | Iterable[SshTarget], out_dir: str | os.PathLike[str],
                     client_factory: ClientFactory, *, max_parallel: int = 8,
                     connect_timeout: float = 10, command_timeout: float = 30, retries: int = 2,
                     read_kernel_log: bool = True, use_nvml: bool = False,
                     nvml_python: str = "python3") -> CollectReport:
    """Collect every target into the capture directory ``out_dir`` (SPEC section 2).

    At most ``max_parallel`` hosts are worked on at once. Each host gets its own connect and
    command timeouts and ``retries`` further attempts for transient network errors (refused or
    reset connections); a host-key mismatch, an unknown host key, an authentication failure
    and timeouts are not retried. A failed host gets ``error.txt`` and keeps its last good
    ``query.csv``; a host that succeeds loses a stale ``error.txt``. ``use_nvml`` reads the
    query through the NVML agent where the host can run it with ``nvml_python`` (default
    ``python3``; a name or path, checked) and falls back to nvidia-smi elsewhere.
    """
    targets = list(targets)
    names = [t.host_name for t in targets]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate host names among targets: {names}")
    if max_parallel < 1:
        raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
    if use_nvml:
        agent_command(nvml_python)  # ValueError for anything but a plain name or path
    out = Path(out_dir)
    (out / "hosts").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: list[HostResult] = []
    if targets:
        with ThreadPoolExecutor(max_workers=min(max_parallel, len(targets)),
                                thread_name_prefix="hetero-gpu-collect") as pool:
            futures = [
                pool.submit(collect_host, t, out, client_factory, connect_timeout=connect_timeout,
                            command_timeout=command_timeout, retries=retries,
                            read_kernel_log=read_kernel_log, use_nvml=use_nvml,
                            nvml_python=nvml_python)
                for t in targets
            ]
            results = [f.result() for f in futures]
    return CollectReport(out_dir=out, hosts=results, seconds=time.monotonic() - started)


# --------------------------------------------------------------------------------------------
# Plain paramiko clients (the command line)
# --------------------------------------------------------------------------------------------


def paramiko_client_factory(identity_file: str | os.PathLike[str] | None = None,
                            known_hosts: str | os.PathLike[str] | None = None,
                            connect_timeout: float = 10) -> ClientFactory:
    """A factory of connected paramiko clients that verify host keys.

    Host keys come from ``known_hosts`` (default: the user's ``~/.ssh/known_hosts``); an unknown
    or changed key is refused (``RejectPolicy``), never added. With ``identity_file`` only that
    key is offered; without, the agent and the default keys are tried.
    """
    if known_hosts is not None and not Path(known_hosts).is_file():
        raise ValueError(f"known_hosts file {str(known_hosts)!r} does not exist")
    if identity_file is not None and not Path(identity_file).is_file():
        raise ValueError(f"identity file {str(identity_file)!r} does not exist")

    def factory(target: SshTarget, connect_timeout: float | None = None) -> paramiko.SSHClient:
        timeout = connect_timeout if connect_timeout is not None else default_timeout
        client = paramiko.SSHClient()
        client.set_log_channel(PARAMIKO_LOG_CHANNEL)
        try:
            if known_hosts is not None:
                client.load_host_keys(str(known_hosts))
            else:
                client.load_system_host_keys()
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            client.connect(
                hostname=target.address, port=target.port,
                username=target.user or getpass.getuser(),
                key_filename=str(identity_file) if identity_file is not None else None,
                look_for_keys=identity_file is None, allow_agent=identity_file is None,
                timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
                channel_timeout=timeout,
            )
        except BaseException:
            client.close()
            raise
        return client

    default_timeout = connect_timeout
    return factory
