"""What the collector runs on a host, and how it reads the answers.

Constant command lines (nothing from the user is ever interpolated into them): the
``nvidia-smi --query-gpu`` query (or the NVML agent), ``nvidia-smi topo -m``, the kernel-log
Xid read, and on a host with MIG enabled the MIG listings (:mod:`.mig`). :func:`gather` runs them
on one connected client and returns the capture files.

The first three run in one SSH session (:func:`~.command.run_together`: one channel and one
shell on the host instead of three); a host whose login shell is not POSIX prints none of the
marker lines that split their outputs, and there they run one by one, as do the follow-ups (a
query asked again without a field the driver refused, the MIG listings, nvidia-smi after an NVML
agent that could not run).
"""

from __future__ import annotations

import re

import paramiko

from airflow_hetero_gpu.capture.apps import parse_apps_csv, parse_procs
from airflow_hetero_gpu.capture.directory import QUERY_FIELDS
from airflow_hetero_gpu.capture.query import EXTRA_HEALTH_FIELDS, OPTIONAL_FIELDS, field_group
from airflow_hetero_gpu.collect.command import CommandResult, run_command, run_together
from airflow_hetero_gpu.collect.mig import mig_enabled, mig_files
from airflow_hetero_gpu.collect.processes import APPS_COMMAND, APPS_TOGETHER, PROCS_TOGETHER, procs_command
from airflow_hetero_gpu.collect.nvml import AgentReply, agent_command, agent_script, parse_agent_reply
from airflow_hetero_gpu.collect.reasons import HostFailure, first_line
from airflow_hetero_gpu.errors import CaptureError

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

CAPTURE_FILES = ("query.csv", "topo.txt", "xid.log", "mig.txt", "mig-usage.txt", "apps.csv", "procs.txt")

def _nvidia_smi_failure(result: CommandResult) -> HostFailure:
    if result.returncode == 127:
        return HostFailure("nvidia-smi: command not found")
    return HostFailure(f"nvidia-smi exit {result.returncode}: {first_line(result.stdout, result.stderr)}")


def _has_query_header(stdout: str) -> bool:
    return any(line.startswith("index") for line in stdout.splitlines())


def _nvml_query(client: paramiko.SSHClient, command_timeout: float, python: str,
                result: CommandResult | None = None) -> AgentReply:
    """Run the NVML agent on the host (its source on stdin), or read ``result``, its answer in
    the one-session read; a timeout fails the host."""
    if result is None:
        result = run_command(client, agent_command(python), command_timeout, "NVML agent", stdin=agent_script())
    if result.returncode == 127:
        return AgentReply(None, f"{python}: command not found")
    if result.returncode != 0:
        return AgentReply(None, f"{python} exit {result.returncode}: {first_line(result.stderr, result.stdout)}")
    reply = parse_agent_reply(result.stdout)
    if reply.ok and not _has_query_header(reply.query_csv or ""):
        return AgentReply(None, f"agent output has no CSV header: {first_line(reply.query_csv or '')}")
    return reply


_INVALID_FIELD = re.compile(r'Field "(?P<field>[^"]+)" is not a valid field to query')


def smi_query_command(fields: str) -> str:
    return f"nvidia-smi --query-gpu={fields} --format=csv"


def _smi_query(client: paramiko.SSHClient, command_timeout: float, warnings: list[str],
               first: CommandResult | None = None) -> CommandResult:
    """``nvidia-smi --query-gpu`` with the SPEC fields plus ``OPTIONAL_FIELDS`` (health, MIG
    mode, NVLink fabric).

    A driver that does not know an extra field refuses the whole query (``Field "x" is not a
    valid field to query.``, exit 2): the field is asked for under its older name where it has
    one, else left out with the fields that came with it (``field_group``), and the query runs
    again; the SPEC fields are always asked for. ``first``: the answer to the first query (all
    the fields), already read in the one-session read.
    """
    extra = list(OPTIONAL_FIELDS)
    while True:
        fields = ",".join([QUERY_FIELDS, *extra])
        if first is not None:
            query, first = first, None
        else:
            query = run_command(client, smi_query_command(fields), command_timeout, "nvidia-smi --query-gpu")
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
           warnings: list[str], first: CommandResult | None = None) -> tuple[str, str]:
    """(query.csv text, its source): the NVML agent when asked (``nvml_python`` set) and able,
    else nvidia-smi. ``first``: the answer of the first of them, read in the one-session read."""
    if nvml_python is not None:
        reply = _nvml_query(client, command_timeout, nvml_python, first)
        first = None
        if reply.ok and reply.query_csv is not None:
            lost = [ln for ln in reply.query_csv.splitlines() if ln.startswith("Unable to determine")]
            if lost:
                warnings.append(f"nvml: {lost[0]}")
            return reply.query_csv, "nvml"
        warnings.append(f"NVML agent not used ({reply.error}); used nvidia-smi")
    query = _smi_query(client, command_timeout, warnings, first)
    if not _has_query_header(query.stdout):
        raise _nvidia_smi_failure(query)
    if query.returncode != 0:
        # The real tool exits non-zero when a GPU's handle is lost but still prints the others.
        warnings.append(f"nvidia-smi exit {query.returncode}: {first_line(query.stdout)}")
    return query.stdout, "nvidia-smi"


def _read_together(client: paramiko.SSHClient, command_timeout: float, read_kernel_log: bool,
                   nvml_python: str | None, open_timeout: float | None = None) -> dict[str, CommandResult]:
    """The query (or the NVML agent), topo and the kernel-log read in one session: {"query",
    "topo", "xid"}; {} when the host's shell did not run them as a POSIX shell does."""
    if nvml_python is not None:
        commands, stdin = [(agent_command(nvml_python), "NVML agent")], agent_script()
    else:
        commands = [(smi_query_command(",".join([QUERY_FIELDS, *OPTIONAL_FIELDS])), "nvidia-smi --query-gpu")]
        stdin = None
    commands.append((TOPO_COMMAND, TOPO_COMMAND))
    names = ["query", "topo"]
    if read_kernel_log:
        commands.append((XID_COMMAND, "kernel log read"))
        names.append("xid")
    commands += [(APPS_TOGETHER, "nvidia-smi --query-compute-apps"), (PROCS_TOGETHER, "ps")]
    names += ["apps", "procs"]
    results = run_together(client, commands, command_timeout, stdin=stdin, open_timeout=open_timeout)
    return {} if results is None else dict(zip(names, results))


def _processes(client: paramiko.SSHClient, command_timeout: float, first: dict[str, CommandResult],
               warnings: list[str]) -> dict[str, str]:
    """``apps.csv`` and ``procs.txt``. A listing that failed or does not read is left out, and an
    owners' read that does not read too (the processes then have an unknown owner): a warning
    says why, and the host's other outputs are stored as usual."""
    apps = first.get("apps") or run_command(client, APPS_COMMAND, command_timeout, "nvidia-smi --query-compute-apps")
    if apps.returncode != 0 or not apps.stdout.strip():
        warnings.append(f"GPU processes not read: nvidia-smi --query-compute-apps exit {apps.returncode}: "
                        f"{first_line(apps.stdout, apps.stderr)}")
        return {}
    try:
        listed = parse_apps_csv(apps.stdout, "apps.csv")
    except CaptureError as err:
        warnings.append(f"GPU processes not read: {err}")
        return {}
    files = {"apps.csv": apps.stdout}
    procs = first.get("procs")
    if procs is None:
        pids = sorted({a.pid for a in listed})
        procs = run_command(client, procs_command(pids), command_timeout, "ps") if pids else CommandResult(0, "", "")
    try:
        parse_procs(procs.stdout, "procs.txt")
    except CaptureError as err:
        warnings.append(f"GPU processes' owners not read: {err}")
        return files
    # ps exits 1 when a listed process ended meanwhile; it still prints the others
    if procs.returncode in (0, 1):
        files["procs.txt"] = procs.stdout
    else:
        warnings.append(f"GPU processes' owners not read: ps exit {procs.returncode}: "
                        f"{first_line(procs.stderr, procs.stdout)}")
    return files


def gather(client: paramiko.SSHClient, command_timeout: float, read_kernel_log: bool,
           nvml_python: str | None = None, open_timeout: float | None = None) -> tuple[dict[str, str], list[str], str]:
    """Run the capture commands on one host: ({file name: text}, warnings, query source).

    ``nvml_python``: the host interpreter to run the NVML agent with; None: nvidia-smi only.
    ``open_timeout``: how long the first session may take to open (default ``command_timeout``).
    """
    warnings: list[str] = []
    first = _read_together(client, command_timeout, read_kernel_log, nvml_python, open_timeout)
    query_text, source = _query(client, command_timeout, nvml_python, warnings, first.get("query"))
    topo = first.get("topo") or run_command(client, TOPO_COMMAND, command_timeout, TOPO_COMMAND)
    if topo.returncode != 0:
        failure = _nvidia_smi_failure(topo)
        raise HostFailure(f"topo -m: {failure}")
    files = {"query.csv": query_text, "topo.txt": topo.stdout}
    if mig_enabled(query_text):
        def run(command: str, label: str) -> tuple[int, str, str]:
            r = run_command(client, command, command_timeout, label)
            return r.returncode, r.stdout, r.stderr

        files.update(mig_files(run, warnings))
    files.update(_processes(client, command_timeout, first, warnings))
    if read_kernel_log:
        xid = first.get("xid") or run_command(client, XID_COMMAND, command_timeout, "kernel log read")
        lines = [line for line in xid.stdout.splitlines() if "NVRM: Xid" in line]
        # exit 1 with no line is "no Xid"; a denial shows on stderr (other stderr text, such as
        # what a login shell's rc files print, is noise)
        if lines or xid.returncode in (0, 1) and not _KERNEL_LOG_DENIED.search(xid.stderr):
            files["xid.log"] = "".join(line + "\n" for line in lines)
        else:
            warnings.append(f"kernel log not readable: {first_line(xid.stderr, xid.stdout)}")
    return files, warnings, source


__all__ = ["APPS_COMMAND", "CAPTURE_FILES", "QUERY_COMMAND", "TOPO_COMMAND", "XID_COMMAND", "gather", "smi_query_command"]
