"""Detached jobs: each host's share of a job runs under a small supervisor of ours, not under the
SSH session that started it.

A supervised launch (``LaunchSpec`` plus :class:`Supervision`) makes the host's command:

1. the run directory, payload, working directory and environment as an unsupervised launch;
2. ``setsid sh -c SUPERVISOR``: a plain POSIX shell script (nothing to install) in a session of its
   own, stdio on files, so that it outlives the SSH session. It starts the job (the marked process
   group, as without supervision), writes its output to ``<host>.out`` / ``<host>.err`` and its
   exit status to ``<host>.exit`` once it ends, and is the job's **dead-man switch**: whoever
   watches the job writes ``<host>.heartbeat`` (``<token> <seconds>``) over its SSH connection;
   when the file has not changed for ``<seconds>`` (at most ``unattended_timeout``), the
   supervisor sends the job the preemption signal, waits the grace and sends SIGKILL (the sweep
   script, this launch only) and notes the time in ``<host>.deadman``;
3. the **follow** part: it prints the ``HETERO_GPU_PGID=`` line, then relays the two output files
   to the channel from the offsets in ``<host>.relayed`` (what the watcher had relayed when it last
   wrote its heartbeat) until the supervisor has ended, and exits with the job's status. A
   reattach runs the follow part alone. When the channel's stdin reaches end of file (the watcher
   is gone) the follow part ends; the job does not.

Files of one host in ``~/.hetero-gpu/run/<job id>/``: ``<host>.launch`` (this launch's token),
``.sup`` (the supervisor's pid), ``.pgid``, ``.out``, ``.err``, ``.heartbeat``, ``.relayed``,
``.exit``, ``.deadman``, ``.payload``. The watcher removes them once it has the job's end.
"""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from airflow_hetero_gpu.launch.command import (
    JOB_ENV, PGID_MARKER, SETUP_EXIT_CODE, SWEEP_SCRIPT, run_dir, validate_host_name, validate_job_id,
)
from airflow_hetero_gpu.launch.run_files import RUN_FILE_NAMES

#: Seconds between two looks of the supervisor at its job and heartbeat.
POLL_S = 1
#: Exit status of the follow part when the supervisor ended without writing the job's status
#: (someone killed it): the job's end is unknown, which the launcher treats as a failure.
SUPERVISOR_LOST_EXIT = 123
#: What the lease must keep beyond ``unattended_timeout`` + grace: the supervisor's look
#: (``POLL_S``, counted twice: before it sees the heartbeat and before it sees the deadline), the
#: sweep's wait after SIGKILL (5 s) and 8 s for the heartbeat's way over SSH to a loaded host.
LEASE_MARGIN_S = 15.0


@dataclass(frozen=True)
class Supervision:
    """How a host's supervisor guards the job: the dead-man switch's timeout, and how it stops."""

    unattended_timeout: float
    signal: str = "TERM"
    grace: float = 300.0
    launch: str = ""  # this launch's token (HETERO_GPU_LAUNCH), chosen by the launcher

    def __post_init__(self) -> None:
        if not self.unattended_timeout >= 1:
            raise ValueError(f"unattended_timeout must be >= 1 s: {self.unattended_timeout!r}")
        if not self.grace >= 0:
            raise ValueError(f"grace must be >= 0 s: {self.grace!r}")
        if not self.signal.isalnum():
            raise ValueError(f"invalid signal name {self.signal!r}")
        if self.launch and not all(c.isalnum() or c in "._-" for c in self.launch):
            raise ValueError(f"invalid launch token {self.launch!r}")

    def leader(self, pid_file: str) -> str:
        return leader(pid_file)

    def script_lines(self, job_id: str, host: str, marked_argv: str) -> list[str]:
        return supervised_lines(job_id, host, self, marked_argv)


# $1 file prefix, $2 default seconds, $3 signal, $4 grace in 0.1 s ticks, $5 job, $6 host,
# $7 launch, $8 the sweep script; the rest: the job's argv (env markers sh -c leader ...).
SUPERVISOR_SCRIPT = r"""
h=$1 limit=$2 sig=$3 ticks=$4 job=$5 host=$6 launch=$7 sweep=$8
shift 8
trap '' HUP PIPE
setsid "$@" >"$h".out 2>"$h".err </dev/null &
pid=$!
alive() {
  st=$(cat /proc/"$pid"/stat 2>/dev/null) || return 1
  st=${st##*") "}
  [ "${st%% *}" != Z ]
}
beat=
deadline=$(( $(date +%s) + limit ))
fired=
while alive; do
  now=$(date +%s)
  cur=$(cat "$h".heartbeat 2>/dev/null)
  if [ -n "$cur" ] && [ "$cur" != "$beat" ]; then
    beat=$cur
    s=${cur#* }
    case $s in ''|*[!0-9]*) s=$limit ;; esac
    [ "$s" -le "$limit" ] || s=$limit
    deadline=$((now + s))
  elif [ -z "$fired" ] && [ "$now" -ge "$deadline" ]; then
    fired=1
    echo "$now" >"$h".deadman
    sh -c "$sweep" hetero-gpu-deadman "$job" "$host" kill "$ticks" "$launch" "$sig" >/dev/null 2>&1 &
  fi
  sleep __POLL__
done
wait "$pid"
status=$?
echo "$status" >"$h".exit.new && mv -f "$h".exit.new "$h".exit
""".replace("__POLL__", str(POLL_S))

# $1 file prefix. Relays the job's output from the offsets last relayed, until the supervisor has
# ended; exits with the job's status. fd 4 is the channel's stdin: end of file there (the
# watcher is gone) ends the relay, never the job.
FOLLOW_SCRIPT = r"""
h=$1
exec 3>&2 2>/dev/null 4<&0
sup=$(cat "$h".sup)
i=0
while [ ! -s "$h".pgid ] && [ ! -e "$h".exit ] && [ "$i" -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
[ -s "$h".pgid ] && echo "__PGID__$(cat "$h".pgid)"
set -- $(cat "$h".relayed 2>/dev/null)
o1=${1:-0} o2=${2:-0}
case $o1 in *[!0-9]*) o1=0 ;; esac
case $o2 in *[!0-9]*) o2=0 ;; esac
tail -c +$((o1 + 1)) -s 0.2 --pid="$sup" -F "$h".out 4<&- &
t1=$!
tail -c +$((o2 + 1)) -s 0.2 --pid="$sup" -F "$h".err >&3 4<&- &
t2=$!
{ while read -r _ <&4; do :; done; kill "$t1" "$t2"; } >/dev/null 3>&- &
w=$!
exec 4<&-
wait "$t1"
wait "$t2"
kill "$w"
[ -s "$h".exit ] && exit "$(cat "$h".exit)"
echo "hetero-gpu: the job's supervisor on this host ended without the job's exit status" >&3
exit __LOST__
""".replace("__PGID__", PGID_MARKER).replace("__LOST__", str(SUPERVISOR_LOST_EXIT))

# The job's process group leader under a supervisor: it writes its pgid ($1) and execs the rest.
_LEADER = ('{ echo "$$" > "$1"; } 2>/dev/null || { mkdir -p -- "${1%/*}" && echo "$$" > "$1"; } || exit '
           + str(SETUP_EXIT_CODE) + '; shift; exec "$@"')

# $1 file prefix, $2 launch token: what the job's handle needs to know of this host. Whether the
# supervisor lives is looked at before its exit file: it writes that file before it ends, so a
# supervisor that ends between the two looks is seen with its status, never as lost.
STATUS_SCRIPT = r"""
h=$1
[ -e "$h".launch ] || { echo none; exit 0; }
alive=
sup=$(cat "$h".sup 2>/dev/null)
if [ -n "$sup" ] && st=$(cat /proc/"$sup"/stat 2>/dev/null); then
  st=${st##*") "}
  [ "${st%% *}" != Z ] && grep -qa hetero-gpu-supervisor /proc/"$sup"/cmdline && alive=1
fi
echo "launch $(cat "$h".launch)"
[ -s "$h".exit ] && echo "exit $(cat "$h".exit)"
[ -e "$h".deadman ] && echo "deadman $(cat "$h".deadman)"
[ -s "$h".relayed ] && echo "relayed $(cat "$h".relayed)"
[ -n "$alive" ] && echo alive
exit 0
"""


def prefix(job_id: str, host: str) -> str:
    """The shell word of the host's file prefix: ``"$HOME"/.hetero-gpu/run/<job>/<host>``."""
    return f'"$HOME"/{shlex.quote(run_dir(job_id) + "/" + validate_host_name(host))}'


def supervised_lines(job_id: str, host: str, sup: Supervision, marked_argv: str) -> list[str]:
    """The launch script's lines after the environment: the supervisor started in a session of
    its own, then the follow part. ``marked_argv``: the job's ``env <markers> sh -c ...`` words
    (already quoted) without its leader."""
    q = shlex.quote
    ticks = str(int(round(sup.grace * 10)))
    start = (f"setsid sh -c {q(SUPERVISOR_SCRIPT)} hetero-gpu-supervisor \"$h\" "
             f"{int(sup.unattended_timeout)} {q(sup.signal)} {ticks} {q(job_id)} {q(host)} {q(sup.launch)} "
             f"{q(SWEEP_SCRIPT)} {marked_argv}")
    return [
        f"h={prefix(job_id, host)}",
        'rm -f "$h".exit "$h".out "$h".err "$h".deadman "$h".relayed "$h".pgid',
        f'echo {q(sup.launch)} >"$h".launch',
        f'echo "0 {int(sup.unattended_timeout)}" >"$h".heartbeat',
        f"{start} </dev/null >/dev/null 2>&1 &",
        'echo "$!" >"$h".sup',
        f"exec sh -c {q(FOLLOW_SCRIPT)} hetero-gpu-follow \"$h\"",
    ]


def leader(pid_file: str) -> str:
    """The quoted ``sh -c LEADER name pidfile`` words of a supervised job's leader."""
    return f"sh -c {shlex.quote(_LEADER)} hetero-gpu-job {pid_file}"


def follow_command(job_id: str, host: str) -> str:
    """Reattach: relay a running (or ended) job's output from where the last watcher stopped."""
    validate_job_id(job_id)
    return f"sh -c {shlex.quote(f'exec sh -c {shlex.quote(FOLLOW_SCRIPT)} hetero-gpu-follow {prefix(job_id, host)}')}"


def heartbeat_command(job_id: str, host: str, launch: str, token: str, seconds: int,
                      relayed: tuple[int, int]) -> str:
    """Write the heartbeat (``token seconds``) and the relayed offsets, for this launch only."""
    q = shlex.quote
    script = (f"h={prefix(job_id, host)}; [ \"$(cat \"$h\".launch 2>/dev/null)\" = {q(launch)} ] || exit 3; "
              f"echo {q(f'{token} {int(seconds)}')} >\"$h\".heartbeat.new && mv -f \"$h\".heartbeat.new \"$h\".heartbeat; "
              f"echo '{int(relayed[0])} {int(relayed[1])}' >\"$h\".relayed.new && mv -f \"$h\".relayed.new \"$h\".relayed")
    return f"sh -c {q(script)}"


def status_command(job_id: str, host: str) -> str:
    return f"sh -c {shlex.quote(STATUS_SCRIPT)} hetero-gpu-status {prefix(job_id, host)}"


def cleanup_command(job_id: str, host: str, launch: str) -> str:
    """Remove this launch's files of ``host`` (and the run directory once empty)."""
    q = shlex.quote
    files = " ".join(f'"$h".{name}' for name in RUN_FILE_NAMES)
    script = (f"h={prefix(job_id, host)}; [ \"$(cat \"$h\".launch 2>/dev/null)\" = {q(launch)} ] || exit 0; "
              f"rm -f {files}; rmdir \"${{h%/*}}\" 2>/dev/null; exit 0")
    return f"sh -c {q(script)}"


@dataclass(frozen=True)
class HostStatus:
    """What a host's files say of one launch: ``running``, ``succeeded``, ``failed`` or ``gone``."""

    host: str
    state: str
    exit_code: int | None = None
    deadman: bool = False
    detail: str = ""
    relayed: tuple[int, int] = (0, 0)


def parse_status(host: str, launch: str, text: str) -> HostStatus:
    facts: dict[str, str] = {}
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word:
            facts[word] = rest.strip()
    if "none" in facts or "launch" not in facts:
        return HostStatus(host, "gone", detail="no run files")
    if facts["launch"] != launch:
        return HostStatus(host, "gone", detail=f"another launch ({facts['launch']})")
    deadman = "deadman" in facts
    try:
        out, err = (int(x) for x in facts.get("relayed", "0 0").split())
    except ValueError:
        out, err = 0, 0
    if "exit" in facts:
        try:
            code = int(facts["exit"])
        except ValueError:
            return HostStatus(host, "failed", detail=f"unreadable exit status {facts['exit']!r}")
        return HostStatus(host, "succeeded" if code == 0 else "failed", code, deadman,
                          f"exited with {code}" + (" (stopped by its dead-man switch)" if deadman else ""))
    if "alive" in facts:
        return HostStatus(host, "running", deadman=deadman, relayed=(out, err))
    return HostStatus(host, "failed", deadman=deadman, detail="its supervisor is gone without an exit status")


__all__ = [
    "FOLLOW_SCRIPT", "HostStatus", "JOB_ENV", "LEASE_MARGIN_S", "POLL_S", "STATUS_SCRIPT", "SUPERVISOR_LOST_EXIT",
    "SUPERVISOR_SCRIPT", "Supervision", "cleanup_command", "follow_command", "heartbeat_command", "host_statuses", "leader",
    "parse_status", "prefix", "quick_exec", "status_command", "supervised_lines",
]


def host_statuses(job_id: str, launch: str, hosts: list, targets: Any, factory: Any) -> dict:
    """Each host's :class:`~airflow_hetero_gpu.launch.supervisor.HostStatus` of ``launch`` (asked
    in parallel, one connection a host; ``unknown`` where the host cannot be asked)."""
    def one(host: str):
        try:
            client = factory(targets[host])
        except Exception as err:  # noqa: BLE001
            return HostStatus(host, "unknown", detail=f"cannot connect: {err}")
        try:
            _, stdout, _ = client.exec_command(status_command(job_id, host), timeout=60)
            return parse_status(host, launch, stdout.read().decode("utf-8", "replace"))
        except Exception as err:  # noqa: BLE001
            return HostStatus(host, "unknown", detail=f"status check failed: {err}")
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=min(8, max(1, len(hosts)))) as pool:
        return {s.host: s for s in pool.map(one, hosts)}


def quick_exec(transport, command: str, timeout: float = 20.0) -> int:
    """Run a short command on an open SSH ``transport`` (a channel of the job's own connection);
    its exit status (-1 when it did not end within ``timeout``)."""
    channel = transport.open_session(timeout=timeout)
    try:
        channel.settimeout(timeout)
        channel.exec_command(command)
        if not channel.status_event.wait(timeout):
            return -1
        return channel.recv_exit_status()
    finally:
        channel.close()
