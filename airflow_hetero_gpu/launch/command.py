"""The remote command line that starts one host's share of a distributed job.

Every host of a job runs the same shape of command: a POSIX ``sh -c`` script that

1. removes this host's run files of other jobs that ended unwatched more than a week ago
   (:mod:`airflow_hetero_gpu.launch.run_files`), creates the job's run directory
   ``$HOME/.hetero-gpu/run/<job id>/``,
   and, when the spec has a ``payload``, stores the first ``len(payload)`` bytes of its stdin
   there as ``<host>.payload`` (mode 0600; the launcher sends them right after the command
   starts, so no shared file system is needed) and exports its path as ``HETERO_GPU_PAYLOAD``;
   :data:`PAYLOAD_SCRIPT` as a torchrun script (or an argv word) runs that file,
2. changes to the working directory (when one is given),
3. exports ``CUDA_VISIBLE_DEVICES`` (the GPUs chosen on that host, comma-joined: nvidia-smi
   indices, or the ``MIG-<uuid>`` of a MIG instance; empty hides every GPU) and the user's
   environment,
4. ``setsid -w env <job markers> sh -c <leader>``: a new session and process group whose
   processes all carry ``HETERO_GPU_JOB_ID``, ``HETERO_GPU_HOST``, ``HETERO_GPU_NODE_RANK`` and
   ``HETERO_GPU_LAUNCH`` (this launch; the orphan sweep finds the job's processes by them); the leader prints
   ``HETERO_GPU_PGID=<pgid>`` as its first line, writes the same number to
   ``<run dir>/<host>.pgid`` and ``exec``s the program: torchrun (:class:`Torchrun`) or any
   argv (:class:`Command`). The job's stdin is ``/dev/null``. The script waits for the
   program (``-w`` where setsid has to fork), then removes the pid file (and the payload) and
   exits with the program's status;
5. meanwhile a **watchdog** reads the SSH channel's stdin, which the launcher never closes: end
   of file there means the session is gone (launcher killed, connection dropped, sshd killed),
   and the watchdog then ends this launch of the job on this host with :data:`SWEEP_SCRIPT`
   (SIGTERM, :data:`WATCHDOG_GRACE_S`, SIGKILL). A job never outlives the SSH session that
   started it, and a watchdog never touches a later launch of the same job id.

Quoting rules: every value that comes from a user (script, arguments, environment values,
working directory, job id, host name, launcher argv) goes through :func:`shlex.quote`, and the
whole script is quoted once more as the single argument of ``sh -c``, so the login shell of the
remote user (bash, zsh, ...) only ever sees one quoted word. Environment *names* must be shell
identifiers and job ids ``[A-Za-z0-9._-]+``; anything else is a ``ValueError`` with a one-line
message. Nothing here talks to a network: these are pure functions of their arguments.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence, Union

from airflow_hetero_gpu.launch import run_files

if TYPE_CHECKING:
    from airflow_hetero_gpu.launch.supervisor import Supervision

#: Environment variables the command exports on every host; the orphan sweep matches on them.
JOB_ENV = "HETERO_GPU_JOB_ID"
HOST_ENV = "HETERO_GPU_HOST"
NODE_RANK_ENV = "HETERO_GPU_NODE_RANK"
#: One launch of a job on one host (``<shell pid>.<start time in ns>``): what that launch's
#: watchdog sweeps, so that it can never hit a later launch of the same job id (a retry).
LAUNCH_ENV = "HETERO_GPU_LAUNCH"
#: Set by a host's login environment where several hosts share one process table (emulated hosts on
#: one machine, containers that see the machine's processes): the sweeps then count only processes
#: with the same value, so one host's sweep never reaches another's job of the same id. Unset on a
#: host of its own (the usual case), it changes nothing. A job cannot set it (reserved).
SCOPE_ENV = "HETERO_GPU_SCOPE"
#: The absolute path of the job's payload file on the host (set when the spec has a payload).
PAYLOAD_ENV = "HETERO_GPU_PAYLOAD"
#: The first stdout line of every host's command: ``HETERO_GPU_PGID=<process group id>``.
PGID_MARKER = "HETERO_GPU_PGID="
#: Where each host keeps a job's pid files, relative to the remote user's home directory.
RUN_ROOT = ".hetero-gpu/run"
#: Exit status of the remote command when the run directory or working directory is unusable.
SETUP_EXIT_CODE = 125
#: Seconds between SIGTERM and SIGKILL when a host's watchdog ends a job whose SSH session is gone.
WATCHDOG_GRACE_S = 10.0

_HOST = re.compile(r"[A-Za-z0-9._:-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MARKERS = frozenset({JOB_ENV, HOST_ENV, NODE_RANK_ENV})
_RESERVED_NAMES = {LAUNCH_ENV, PAYLOAD_ENV, SCOPE_ENV}
_RESERVED_ENV = _MARKERS | _RESERVED_NAMES | {"CUDA_VISIBLE_DEVICES"}

#: Seconds the sweep waits after SIGKILL before it reports survivors.
KILL_WAIT_S = 5.0

SWEEP_SCRIPT = r"""
job=$1 host=$2 mode=$3 ticks=$4 launch=${5:-} sig=${6:-TERM}
self=$(cat /proc/$$/stat) && self=${self##*") "} && set -- $self && mypgid=$3
find_job() {
  files=$(grep -lzxF -e "__JOB_ENV__=$job" /proc/[0-9]*/environ 2>/dev/null)
  [ -n "$files" ] || return 0
  files=$(grep -lzxF -e "__HOST_ENV__=$host" $files 2>/dev/null)
  [ -n "$files" ] || return 0
  if [ -n "${__SCOPE_ENV__:-}" ]; then
    files=$(grep -lzxF -e "__SCOPE_ENV__=$__SCOPE_ENV__" $files 2>/dev/null)
    [ -n "$files" ] || return 0
  fi
  if [ -n "$launch" ]; then
    files=$(grep -lzxF -e "__LAUNCH_ENV__=$launch" $files 2>/dev/null)
    [ -n "$files" ] || return 0
  fi
  for f in $files; do
    d=${f%/environ}
    pid=${d#/proc/}
    [ "$pid" = "$$" ] && continue
    st=$(cat "$d/stat" 2>/dev/null) || continue
    st=${st##*") "}
    set -- $st
    [ "$1" = Z ] && continue
    cmd=$(tr '\000' ' ' < "$d/cmdline" 2>/dev/null | cut -c1-300)
    echo "$pid $3 $cmd"
  done
}
signal_job() {
  find_job | { sent=" "; while read -r pid pgid cmd; do
    case $sent in *" $pgid "*) continue ;; esac
    if [ "$pgid" -gt 1 ] && [ "$pgid" != "$mypgid" ] && kill -s "$1" -- "-$pgid" 2>/dev/null; then
      sent="$sent$pgid "
    else
      kill -s "$1" "$pid" 2>/dev/null
    fi
  done; }
}
wait_gone() {
  i=0
  while [ "$i" -lt "$1" ] && [ -n "$(find_job)" ]; do sleep 0.1; i=$((i + 1)); done
}
find_job | sed 's/^/found /'
if [ "$mode" = signal ]; then signal_job "$sig"; exit 0; fi
[ "$mode" = kill ] || exit 0
if [ "$ticks" -gt 0 ]; then signal_job "$sig"; wait_gone "$ticks"; fi
signal_job KILL
wait_gone __KILL_TICKS__
find_job | sed 's/^/left /'
exit 0
""".replace("__JOB_ENV__", JOB_ENV).replace("__HOST_ENV__", HOST_ENV).replace(
    "__SCOPE_ENV__", SCOPE_ENV).replace("__LAUNCH_ENV__", LAUNCH_ENV).replace("__KILL_TICKS__", str(int(KILL_WAIT_S * 10)))

#: Lists the jobs that have processes on this host: one ``job <id>`` line per job id whose
#: processes carry this host's name (``$1``) in ``HETERO_GPU_HOST``.
LIST_JOBS_SCRIPT = r"""
host=$1
for f in $(grep -lzxF -e "__HOST_ENV__=$host" /proc/[0-9]*/environ 2>/dev/null); do
  if [ -n "${__SCOPE_ENV__:-}" ]; then grep -qzxF -e "__SCOPE_ENV__=$__SCOPE_ENV__" "$f" 2>/dev/null || continue; fi
  tr '\000' '\n' < "$f" 2>/dev/null | grep -m1 '^__JOB_ENV__=' | sed 's/^__JOB_ENV__=/job /'
done | sort -u
exit 0
""".replace("__JOB_ENV__", JOB_ENV).replace("__HOST_ENV__", HOST_ENV).replace("__SCOPE_ENV__", SCOPE_ENV)

# The process that becomes the job's process group leader. $1 is the pid file, the rest the
# program. It is a constant: user input reaches it only as quoted positional arguments.
# It first takes back the job's stderr, which the calling shell handed over as fd 3.
# The run directory may sit in a home shared by several hosts (NFS): another host whose part
# of the job just ended may have removed it, so a failed write makes it again once.
_LEADER = ('exec 2>&3 3>&-; echo "' + PGID_MARKER + '$$"; { echo "$$" > "$1"; } 2>/dev/null'
           ' || { mkdir -p -- "${1%/*}" && echo "$$" > "$1"; } || exit '
           + str(SETUP_EXIT_CODE) + '; shift; exec "$@"')


class ShellWord(str):
    """A word of the host script written as it is, unquoted: only for constants of this
    module (:data:`PAYLOAD_SCRIPT`), never for a value that comes from a user."""


#: As ``Torchrun(script=PAYLOAD_SCRIPT)`` (or a word of a ``Command``): the job's payload file
#: on each host (``LaunchSpec.payload``), by its absolute path.
PAYLOAD_SCRIPT = ShellWord(f'"${PAYLOAD_ENV}"')


def _word(value: str) -> str:
    return value if isinstance(value, ShellWord) and value == PAYLOAD_SCRIPT else shlex.quote(value)


def validate_job_id(job_id: str) -> str:
    """Return ``job_id`` when it is 1-128 characters of ``[A-Za-z0-9._-]``, else ValueError
    (the one rule of :mod:`airflow_hetero_gpu.core.names`)."""
    from airflow_hetero_gpu.core.names import JOB_ID, check_name

    return check_name(job_id, JOB_ID)


def validate_host_name(host: str) -> str:
    """Return ``host`` when it is a usable host name (it names the host's pid file)."""
    if not isinstance(host, str) or not _HOST.fullmatch(host) or host in (".", ".."):
        raise ValueError(f"invalid host name {host!r}: use letters, digits, '.', '_', ':' or '-'")
    return host


def validate_env_name(name: str) -> str:
    """Return ``name`` when it is a shell identifier not reserved by the launcher."""
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise ValueError(f"invalid environment variable name {name!r}: must match [A-Za-z_][A-Za-z0-9_]*")
    if name in _RESERVED_ENV:
        raise ValueError(f"environment variable {name} is set by the launcher and cannot be overridden")
    return name


#: A MIG instance's UUID as nvidia-smi -L prints it (R470+: ``MIG-<uuid>``; older drivers:
#: ``MIG-GPU-<uuid>/<GPU instance>/<compute instance>``); CUDA takes both in CUDA_VISIBLE_DEVICES.
MIG_UUID = re.compile(r"MIG-(?:GPU-)?[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}(?:/\d+/\d+)?")


@dataclass(frozen=True)
class HostShare:
    """One host's part of a job: its name, the address other hosts reach it at, its GPUs.

    ``gpus`` are nvidia-smi indices, or the one ``MIG-<uuid>`` of a MIG instance (a process
    sees one MIG instance, so a share holds either whole GPUs or a single instance).
    """

    host: str
    address: str
    gpus: tuple[int | str, ...] = ()

    def __post_init__(self) -> None:
        validate_host_name(self.host)
        if not self.address or any(c.isspace() for c in self.address):
            raise ValueError(f"invalid address {self.address!r} for host {self.host!r}")
        gpus = tuple(self.gpus)
        mig = [g for g in gpus if isinstance(g, str)]
        if mig:
            if len(gpus) != 1 or not MIG_UUID.fullmatch(mig[0]):
                raise ValueError(f"GPUs of host {self.host!r}: a MIG instance goes alone, as its MIG-<uuid>: {gpus!r}")
        elif any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus):
            raise ValueError(f"GPU indices of host {self.host!r} must be non-negative integers: {gpus!r}")
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"GPU indices of host {self.host!r} repeat: {gpus!r}")
        object.__setattr__(self, "gpus", gpus)

    @property
    def endpoint_host(self) -> str:
        """The address as it appears in ``HOST:PORT`` (IPv6 in brackets)."""
        return f"[{self.address}]" if ":" in self.address else self.address


@dataclass(frozen=True)
class Torchrun:
    """Start ``script args...`` under torchrun with the c10d rendezvous on the first host.

    ``nproc_per_node`` defaults to the number of GPUs the host got (at least 1);
    ``launcher`` is the torchrun argv (``("python3", "-m", "torch.distributed.run")`` works
    where the ``torchrun`` script is not on the remote PATH); ``torchrun_args`` are passed to
    torchrun before the script (e.g. ``("--monitor-interval", "1")``).
    """

    script: str
    args: tuple[str, ...] = ()
    max_restarts: int | None = None
    nproc_per_node: int | None = None
    launcher: tuple[str, ...] = ("torchrun",)
    torchrun_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.script:
            raise ValueError("torchrun needs a training script")
        for name in ("args", "launcher", "torchrun_args"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ValueError(f"{name} must be a list of strings, not one string: {value!r}")
            value = tuple(value)
            if any(not isinstance(v, str) for v in value):
                raise ValueError(f"{name} must hold only strings: {value!r}")
            object.__setattr__(self, name, value)
        if not self.launcher:
            raise ValueError("launcher must not be empty")
        if self.max_restarts is not None and (not isinstance(self.max_restarts, int) or self.max_restarts < 0):
            raise ValueError(f"max_restarts must be a non-negative integer: {self.max_restarts!r}")
        if self.nproc_per_node is not None and (not isinstance(self.nproc_per_node, int) or self.nproc_per_node < 1):
            raise ValueError(f"nproc_per_node must be a positive integer: {self.nproc_per_node!r}")


@dataclass(frozen=True)
class Command:
    """Start the same argv on every host (for launchers other than torchrun).

    The program finds its place through ``HETERO_GPU_NODE_RANK``, ``HETERO_GPU_HOST`` and
    ``CUDA_VISIBLE_DEVICES``; ``HETERO_GPU_NNODES``, ``HETERO_GPU_MASTER_ADDR`` and
    ``HETERO_GPU_MASTER_PORT`` are exported too.
    """

    argv: tuple[str, ...]

    def __post_init__(self) -> None:
        if isinstance(self.argv, str):
            raise ValueError(f"argv must be a list of strings, not one string: {self.argv!r}")
        argv = tuple(self.argv)
        if not argv or any(not isinstance(a, str) for a in argv):
            raise ValueError(f"argv must be a non-empty list of strings: {argv!r}")
        object.__setattr__(self, "argv", argv)


Program = Union[Torchrun, Command]


@dataclass(frozen=True)
class LaunchSpec:
    """What to run for a job, and where it runs on each host.

    ``payload``: bytes every host receives on the command's stdin and keeps as a file in the
    job's run directory while the job runs (a script the program runs: :data:`PAYLOAD_SCRIPT`).
    """

    job_id: str
    program: Program
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    payload: bytes | None = None

    def __post_init__(self) -> None:
        validate_job_id(self.job_id)
        if self.payload is not None and not isinstance(self.payload, bytes):
            raise ValueError(f"payload must be bytes, got {type(self.payload).__name__}")
        words = (self.program.script,) if isinstance(self.program, Torchrun) else self.program.argv
        if self.payload is None and any(w == PAYLOAD_SCRIPT and isinstance(w, ShellWord) for w in words):
            raise ValueError("the program runs the payload file, but the launch has no payload")
        env = dict(self.env)
        for name, value in env.items():
            validate_env_name(name)
            if not isinstance(value, str):
                raise ValueError(f"environment variable {name}: value must be a string, got {value!r}")
            if "\0" in value:
                raise ValueError(f"environment variable {name}: value contains a NUL byte")
        object.__setattr__(self, "env", env)
        if self.workdir is not None and (not self.workdir or "\0" in self.workdir):
            raise ValueError(f"invalid working directory {self.workdir!r}")


def run_dir(job_id: str) -> str:
    """The job's run directory relative to the remote home: ``.hetero-gpu/run/<job id>``."""
    return f"{RUN_ROOT}/{validate_job_id(job_id)}"


def torchrun_argv(program: Torchrun, job_id: str, shares: Sequence[HostShare], rank: int,
                  rdzv_port: int) -> list[str]:
    """The unquoted torchrun argv of host ``rank`` (what the remote shell will exec).

    No ``--node-rank``: torchrun ignores it with the c10d rendezvous (and warns), because c10d
    numbers the nodes itself once all have joined. The launcher's own host order is exported
    as ``HETERO_GPU_NODE_RANK`` instead.
    """
    share = shares[rank]
    nproc = program.nproc_per_node or max(1, len(share.gpus))
    argv = [
        *program.launcher,
        "--nnodes", str(len(shares)),
        "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{shares[0].endpoint_host}:{rdzv_port}",
        "--rdzv-id", job_id,
        # The first host serves the c10d store; saying so avoids torchrun's guess, which
        # treats every loopback or local address as "mine".
        "--rdzv-conf", f"is_host={'true' if rank == 0 else 'false'}",
    ]
    if program.max_restarts is not None:
        argv += ["--max-restarts", str(program.max_restarts)]
    argv += [*program.torchrun_args, program.script, *program.args]
    return argv


def program_argv(spec: LaunchSpec, shares: Sequence[HostShare], rank: int, rdzv_port: int) -> list[str]:
    """The unquoted argv host ``rank`` runs."""
    if isinstance(spec.program, Torchrun):
        return torchrun_argv(spec.program, spec.job_id, shares, rank, rdzv_port)
    return list(spec.program.argv)


def host_environment(spec: LaunchSpec, shares: Sequence[HostShare], rank: int,
                     rdzv_port: int) -> list[tuple[str, str]]:
    """The variables host ``rank`` exports, in order: job markers, GPUs, then the user's."""
    share = shares[rank]
    env = [
        (JOB_ENV, spec.job_id),
        (HOST_ENV, share.host),
        (NODE_RANK_ENV, str(rank)),
        ("CUDA_VISIBLE_DEVICES", ",".join(str(g) for g in share.gpus)),
    ]
    if isinstance(spec.program, Command):
        env += [
            ("HETERO_GPU_NNODES", str(len(shares))),
            ("HETERO_GPU_MASTER_ADDR", shares[0].address),
            ("HETERO_GPU_MASTER_PORT", str(rdzv_port)),
        ]
    env += sorted(spec.env.items())
    return env


def build_script(spec: LaunchSpec, shares: Sequence[HostShare], rank: int, rdzv_port: int,
                 supervision: "Supervision | None" = None) -> str:
    """The POSIX shell script host ``rank`` runs (before the outer ``sh -c`` quoting). With
    ``supervision`` the job runs detached under the host's supervisor
    (:mod:`airflow_hetero_gpu.launch.supervisor`) instead of beside a session watchdog."""
    _check(shares, rank, rdzv_port)
    q = shlex.quote
    env = host_environment(spec, shares, rank, rdzv_port)
    markers = [(n, v) for n, v in env if n in _MARKERS]
    others = [(n, v) for n, v in env if n not in _MARKERS]
    lines = [run_files.sweep_line(spec.job_id, shares[rank].host, LIST_JOBS_SCRIPT, RUN_ROOT),
             f'run_dir="$HOME"/{q(run_dir(spec.job_id))}',
             f'mkdir -p "$run_dir" || exit {SETUP_EXIT_CODE}']
    if spec.payload is not None:
        # the launcher sends the payload first on stdin; what follows it is the watchdog's
        size = len(spec.payload)
        lines += [f'payload="$run_dir"/{q(shares[rank].host + ".payload")}',
                  f'(umask 077 && head -c {size} >"$payload") && '
                  f'[ "$(wc -c <"$payload" | tr -d \' \')" = {size} ] || {{ rm -f "$payload"; exit {SETUP_EXIT_CODE}; }}',
                  f'export {PAYLOAD_ENV}="$payload"']
    if spec.workdir is not None:
        lines.append(f"cd {q(spec.workdir)} || exit {SETUP_EXIT_CODE}")
    lines.append("export " + " ".join(f"{n}={q(v)}" for n, v in others))
    # The job markers go to the new session only, through env(1): this shell (and setsid's
    # waiting parent, when setsid has to fork) stays unmarked, so a kill never hits it and it
    # reports how the session ended.
    pid_file = f'"$run_dir"/{q(shares[rank].host + ".pgid")}'
    argv = " ".join(_word(a) for a in program_argv(spec, shares, rank, rdzv_port))
    if supervision is not None:  # the job detached under the host's supervisor (launch/supervisor.py)
        marked = ("env " + " ".join(f"{n}={q(v)}" for n, v in markers) + f" {LAUNCH_ENV}={q(supervision.launch)} "
                  + supervision.leader(pid_file) + " " + argv)
        return "\n".join(lines + supervision.script_lines(spec.job_id, shares[rank].host, marked)) + "\n"
    # From here on this shell's own stderr is /dev/null: when the job is killed, sh reports
    # "Terminated" there, and into a closed SSH channel that would be a SIGPIPE that ends this
    # shell before it removes the pid file. The job gets the real stderr back through fd 3.
    # fd 4 keeps the SSH channel's stdin for the watchdog below; the job reads /dev/null.
    lines.append("exec 3>&2 2>/dev/null 4<&0")
    lines.append('launch=$$.$(date +%s%N)')
    lines.append(
        "setsid -w env " + " ".join(f"{n}={q(v)}" for n, v in markers) + f' {LAUNCH_ENV}="$launch"'
        + f" sh -c {q(_LEADER)} {q('hetero-gpu-' + spec.job_id)} {pid_file} {argv} </dev/null 4<&- &"
    )
    lines.append("job=$!")
    # The watchdog: the launcher never closes the channel's stdin, so end of file there means
    # the SSH session is gone (the launcher was killed, the connection dropped, sshd died).
    # The job must not outlive its launcher: sweep this launch by its markers (SIGTERM, grace,
    # SIGKILL). Once sweeping it ignores SIGTERM: the script below stops the watchdog when the
    # job's leader ends, which may be before torchrun's workers (sessions of their own) did.
    sweep = " ".join(q(a) for a in (SWEEP_SCRIPT, "hetero-gpu-watchdog", spec.job_id, shares[rank].host,
                                    "kill", str(int(WATCHDOG_GRACE_S * 10))))
    lines.append("{ while read -r _ <&4; do :; done; trap '' TERM; sh -c " + sweep
                 + ' "$launch" >/dev/null 2>&1; } 3>&- &')
    lines += ["watchdog=$!", "exec 4<&-", 'wait "$job"', "status=$?", 'kill "$watchdog" 2>/dev/null']
    # The pid file lives as long as the process group it names.
    lines += [f"rm -f {pid_file}" + (' "$payload"' if spec.payload is not None else ""),
              'rmdir "$run_dir"', 'exit "$status"']
    return "\n".join(lines) + "\n"


def build_host_command(spec: LaunchSpec, shares: Sequence[HostShare], rank: int, rdzv_port: int,
                       supervision: "Supervision | None" = None) -> str:
    """The full command line for SSH ``exec`` on host ``rank``: ``sh -c '<script>'``."""
    return f"sh -c {shlex.quote(build_script(spec, shares, rank, rdzv_port, supervision))}"


def build_commands(spec: LaunchSpec, shares: Sequence[HostShare], rdzv_port: int,
                   supervision: "Supervision | None" = None) -> list[str]:
    """One command line per host, in node-rank order (the first host serves the rendezvous)."""
    if not shares:
        raise ValueError("a job needs at least one host")
    hosts = [s.host for s in shares]
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"a host appears twice in the job: {hosts}")
    return [build_host_command(spec, shares, rank, rdzv_port, supervision) for rank in range(len(shares))]


def _check(shares: Sequence[HostShare], rank: int, rdzv_port: int) -> None:
    if not shares:
        raise ValueError("a job needs at least one host")
    if not 0 <= rank < len(shares):
        raise ValueError(f"node rank {rank} out of range for {len(shares)} hosts")
    if isinstance(rdzv_port, bool) or not isinstance(rdzv_port, int) or not 1 <= rdzv_port <= 65535:
        raise ValueError(f"invalid rendezvous port {rdzv_port!r}: must be 1-65535")


def parse_pgid_line(line: str) -> int | None:
    """The process group id from a ``HETERO_GPU_PGID=<n>`` line, else None."""
    if line.startswith(PGID_MARKER):
        value = line[len(PGID_MARKER):].strip()
        if value.isdigit() and int(value) > 1:
            return int(value)
    return None


__all__ = [
    "Command", "HostShare", "JOB_ENV", "HOST_ENV", "LaunchSpec", "NODE_RANK_ENV", "PAYLOAD_ENV",
    "PAYLOAD_SCRIPT", "PGID_MARKER", "Program", "RUN_ROOT", "SETUP_EXIT_CODE", "ShellWord", "Torchrun",
    "build_commands", "build_host_command",
    "build_script", "host_environment", "parse_pgid_line", "program_argv", "run_dir",
    "torchrun_argv", "validate_env_name", "validate_host_name", "validate_job_id",
]
