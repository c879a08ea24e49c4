"""Collect captures (SPEC section 2) from many GPU hosts over SSH, in parallel.

For every target, in a thread pool bounded by ``max_parallel``, open a paramiko ``SSHClient``
through ``client_factory``, run the capture commands (:mod:`.gather`) and write
``out_dir/hosts/<host>/{query.csv,topo.txt,xid.log}``. A host that fails gets ``error.txt`` with
a one-line reason (:mod:`.reasons`) instead; it never fails the whole collection. With no
``out_dir`` nothing is written: the outputs stay in each host's result (``HostResult.texts``),
which is all the ledger needs.

With ``use_nvml=True`` the query comes from the NVML agent (:mod:`.nvml`) piped into the host's
``python3`` (or the interpreter named by ``nvml_python``); where that cannot run (no python3, no
pynvml, NVML failing) the host falls back to ``nvidia-smi`` and the report carries a warning
saying why.

``client_factory(target)`` returns a *connected* client, so the same code serves plain paramiko
(:func:`~.clients.paramiko_client_factory`, for the command line) and Airflow's SSHHook. A
factory that accepts a ``connect_timeout`` keyword gets the collection's connect timeout.

The fan-out: every host is one connection (one sshd each on a real fleet, so sshd's
``MaxStartups`` only matters behind a shared sshd or jump host) and mostly waits for the
network and the host's ``nvidia-smi``, so :data:`DEFAULT_MAX_PARALLEL` hosts are worked on at
once by default (measurements in docs/performance.md); the open-file limit is raised to fit
(:mod:`.limits`). A large fleet can be shared among worker processes (``workers``, :mod:`.shards`),
each running this function on its share: the threads of one interpreter share one core.
"""

from __future__ import annotations

from collections import Counter
import logging
import math
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import paramiko

from airflow_hetero_gpu.capture.directory import QUERY_FIELDS  # noqa: F401 - re-exported
from airflow_hetero_gpu.collect.clients import (  # noqa: F401 - re-exported
    PARAMIKO_LOG_CHANNEL,
    ClientFactory,
    HostKeyStore,
    paramiko_client_factory,
)
from airflow_hetero_gpu.collect.command import CommandResult, run_command  # noqa: F401 - re-exported
from airflow_hetero_gpu.collect.gather import (  # noqa: F401 - re-exported
    CAPTURE_FILES,
    QUERY_COMMAND,
    TOPO_COMMAND,
    XID_COMMAND,
    gather,
)
from airflow_hetero_gpu.collect.limits import OpenFilesLimitError, ensure_open_files
from airflow_hetero_gpu.collect.mig import MIG_FILES
from airflow_hetero_gpu.collect.nvml import agent_command
from airflow_hetero_gpu.collect.reasons import HostFailure, classify_connect_error  # noqa: F401
from airflow_hetero_gpu.collect.persistent import drop_client
from airflow_hetero_gpu.collect.reuse import accepts_connect_timeout
from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.fsutil import atomic_write

if TYPE_CHECKING:
    from airflow_hetero_gpu.collect.shards import ShardWorkers

log = logging.getLogger(__name__)

ERROR_FILE = "error.txt"
#: Hosts worked on at once unless told otherwise (see docs/collection.md#concurrency).
DEFAULT_MAX_PARALLEL = 64


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
    # one machine under two names: the name listed first (same address and port: this one was
    # not collected; same GPU UUIDs: collected, and counted as the first by every reader)
    duplicate_of: str | None = None
    # the texts written to files (what the ledger stores next, without reading them back)
    texts: dict[str, str] = field(default_factory=dict, repr=False, compare=False)


@dataclass
class CollectReport:
    """Per-host outcome of :func:`collect_captures`, in the order of the targets."""

    out_dir: Path | None  # None: kept in memory only (HostResult.texts)
    hosts: list[HostResult]
    seconds: float = 0.0

    @property
    def ok(self) -> list[HostResult]:
        return [h for h in self.hosts if h.ok]

    @property
    def failed(self) -> list[HostResult]:
        return [h for h in self.hosts if not h.ok and h.duplicate_of is None]

    @property
    def duplicates(self) -> list[HostResult]:
        return [h for h in self.hosts if h.duplicate_of is not None]

    def __getitem__(self, host: str) -> HostResult:
        for result in self.hosts:
            if result.host == host:
                return result
        raise KeyError(host)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (for ``--json`` and XCom)."""
        return {
            "out_dir": None if self.out_dir is None else str(self.out_dir),
            "seconds": round(self.seconds, 3),
            "hosts": [{k: v for k, v in dict(asdict(h), seconds=round(h.seconds, 3)).items() if k != "texts"}
                      for h in self.hosts],
        }


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def _write_success(host_dir: Path, files: dict[str, str], durable: bool = True) -> list[str]:
    for name, text in files.items():
        atomic_write(host_dir / name, text, durable=durable)
    # a stale error, or a MIG listing of a host whose GPUs no longer have MIG enabled
    for name in (ERROR_FILE, *(f for f in MIG_FILES if f not in files)):
        try:
            (host_dir / name).unlink()
        except FileNotFoundError:
            pass
    return sorted(files)


def _write_failure(host_dir: Path, reason: str, durable: bool = True) -> None:
    # The last good query.csv/topo.txt stay: the host's GPUs remain known (and unreachable).
    atomic_write(host_dir / ERROR_FILE, reason + "\n", durable=durable)


# --------------------------------------------------------------------------------------------
# The collection
# --------------------------------------------------------------------------------------------


def collect_host(target: SshTarget, out_dir: Path | None, client_factory: ClientFactory, *,
                 connect_timeout: float = 10, command_timeout: float = 30, retries: int = 2,
                 read_kernel_log: bool = True, use_nvml: bool = False,
                 nvml_python: str = "python3", durable: bool = True) -> HostResult:
    """Collect one host into ``out_dir/hosts/<host>/`` (None: into its result only); never raises
    for a host-side problem.

    ``durable``: each file reaches the disk before it replaces the old one (False for a
    scratch directory: a watch of 1,000 hosts would wait for 3,000 fsyncs a check)."""
    started = time.monotonic()
    host_dir = None if out_dir is None else Path(out_dir) / "hosts" / target.host_name
    result = HostResult(host=target.host_name, target=str(target), ok=False)
    pass_timeout = accepts_connect_timeout(client_factory)
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
            # the session waits at most the connect timeout: on a connection kept open since an
            # earlier check, that is all a host that stopped answering gets
            files, warnings, result.query_source = gather(
                client, command_timeout, read_kernel_log, nvml_python if use_nvml else None,
                open_timeout=connect_timeout)
            result.files = sorted(files) if host_dir is None else _write_success(host_dir, files, durable)
            result.texts = dict(files)
            result.warnings = warnings
            result.ok = True
            failure = None
            break
        except HostFailure as exc:
            failure = exc
            if client is not None:
                drop_client(client)  # a kept connection that failed is not kept
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
        if host_dir is not None:
            _write_failure(host_dir, result.reason, durable)
        log.warning("collect %s failed: %s", target.host_name, result.reason)
    result.seconds = time.monotonic() - started
    return result


def collect_captures(targets: Sequence[SshTarget] | Iterable[SshTarget], out_dir: str | os.PathLike[str] | None,
                     client_factory: ClientFactory, *, max_parallel: int = DEFAULT_MAX_PARALLEL,
                     connect_timeout: float = 10, command_timeout: float = 30, retries: int = 2,
                     read_kernel_log: bool = True, use_nvml: bool = False,
                     nvml_python: str = "python3", durable: bool = True,
                     on_host: Callable[[HostResult], None] | None = None,
                     workers: ShardWorkers | None = None) -> CollectReport:
    """Collect every target into the capture directory ``out_dir`` (SPEC section 2), or only into
    the report's results when ``out_dir`` is None (a collection bound for the ledger: 1,000 hosts
    are 5,000 files nobody reads, and creating and removing them can cost seconds of system CPU).

    At most ``max_parallel`` hosts are worked on at once (the soft open-file limit is raised to
    fit; :class:`~.limits.OpenFilesLimitError` when the hard limit cannot). Each host gets its own connect and
    command timeouts and ``retries`` further attempts for transient network errors (refused or
    reset connections); a host-key mismatch, an unknown host key, an authentication failure
    and timeouts are not retried. A failed host gets ``error.txt`` and keeps its last good
    ``query.csv``; a host that succeeds loses a stale ``error.txt``. ``use_nvml`` reads the
    query through the NVML agent where the host can run it with ``nvml_python`` (default
    ``python3``; a name or path, checked) and falls back to nvidia-smi elsewhere. ``durable``:
    what was written is on the disk when this returns (False for a temporary directory): every
    file replaces its old one by a rename, as always, and one ``sync()`` at the end flushes them
    all (an fsync per file cost 1-2 s for the 3,000 files of 1,000 hosts). ``on_host(result)`` is called
    with each host's result as soon as the host is done, from the worker thread that collected it
    (the health check records hosts as they answer instead of when the last one has).
    ``workers``: share the hosts among these worker processes (:mod:`.shards`; each runs this
    function on its share with the factory they were built for, ``client_factory`` is not used);
    ``max_parallel`` is then the total over them.
    """
    targets = list(targets)
    names = [t.host_name for t in targets]
    if len(set(names)) != len(names):
        twice = sorted(n for n, count in Counter(names).items() if count > 1)
        raise ValueError(f"duplicate host names among targets: {twice}")
    if max_parallel < 1:
        raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
    if use_nvml:
        agent_command(nvml_python)  # ValueError for anything but a plain name or path
    threads = min(max_parallel, len(targets))
    if workers is None:
        ensure_open_files(threads)  # OpenFilesLimitError (a ValueError) when the hard limit is too low
    out = None if out_dir is None else Path(out_dir)
    if out is not None:
        (out / "hosts").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: list[HostResult] = []
    flush_at_end, durable = durable and out is not None, False  # one sync() for the whole directory (see above)

    def one(target: SshTarget) -> HostResult:
        result = collect_host(target, out, client_factory, connect_timeout=connect_timeout,
                              command_timeout=command_timeout, retries=retries,
                              read_kernel_log=read_kernel_log, use_nvml=use_nvml,
                              nvml_python=nvml_python, durable=durable)
        if on_host is not None:
            on_host(result)
        return result

    first_at: dict[tuple[str, int], str] = {}
    same_address: dict[str, HostResult] = {}
    for t in targets:
        first = first_at.setdefault((t.address.lower().rstrip("."), int(t.port)), t.host_name)
        if first != t.host_name:
            same_address[t.host_name] = HostResult(
                t.host_name, str(t), False, f"duplicate of {first} (same address and port {t.endpoint}): "
                                            "not collected", duplicate_of=first)
    todo = [t for t in targets if t.host_name not in same_address]
    if todo and workers is not None:
        options = dict(max_parallel=math.ceil(max_parallel / workers.count), connect_timeout=connect_timeout,
                       command_timeout=command_timeout, retries=retries, read_kernel_log=read_kernel_log,
                       use_nvml=use_nvml, nvml_python=nvml_python, durable=durable)

        def lost(target: SshTarget, reason: str) -> HostResult:  # its worker died before reporting it
            if out is not None:
                _write_failure(out / "hosts" / target.host_name, reason, durable)
            log.warning("collect %s failed: %s", target.host_name, reason)
            return HostResult(target.host_name, str(target), False, reason)

        done = workers.run(workers.shares(todo), out, options, on_host, lost=lost)
        results = [same_address.get(t.host_name) or done[t.host_name] for t in targets]
    elif todo:
        with ThreadPoolExecutor(max_workers=threads,
                                thread_name_prefix="hetero-gpu-collect") as pool:
            futures = {t.host_name: pool.submit(one, t) for t in todo}
            results = [same_address[t.host_name] if t.host_name in same_address else futures[t.host_name].result()
                       for t in targets]
    else:
        results = [same_address[t.host_name] for t in targets]
    if flush_at_end:
        os.sync()
    _mark_same_gpus(results)
    return CollectReport(out_dir=out, hosts=results, seconds=time.monotonic() - started)


_GPU_UUID = re.compile(r"\bGPU-[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}\b")


def _mark_same_gpus(results: Sequence[HostResult]) -> None:
    """Hosts collected under two names whose GPUs report the same UUIDs: the later one (in the
    targets' order) is a duplicate of the earlier (readers count its GPUs once, as the first's)."""
    owner: dict[str, str] = {}
    for h in results:
        if not h.ok or "query.csv" not in h.texts:
            continue
        uuids = _GPU_UUID.findall(h.texts["query.csv"])  # the uuid column: nothing else looks like one
        shared = [u for u in uuids if u in owner]
        if shared:
            h.duplicate_of = owner[shared[0]]
            h.warnings.append(f"duplicate of {h.duplicate_of}: same GPU UUIDs ({shared[0]}); its GPUs are counted "
                              f"once, as {h.duplicate_of}'s")
            continue
        for u in uuids:
            owner[u] = h.host


__all__ = [
    "CollectReport", "DEFAULT_MAX_PARALLEL", "HostFailure", "HostResult", "OpenFilesLimitError",
    "collect_captures", "collect_host",
    # where they used to live, kept importable from here
    "CAPTURE_FILES", "ClientFactory", "CommandResult", "HostKeyStore", "PARAMIKO_LOG_CHANNEL",
    "QUERY_COMMAND", "QUERY_FIELDS", "TOPO_COMMAND", "XID_COMMAND", "classify_connect_error",
    "gather", "paramiko_client_factory", "run_command",
]
