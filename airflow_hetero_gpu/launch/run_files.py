"""A host's run files that outlived their job, removed by the host's next launch.

Each launch keeps its host's files in ``~/.hetero-gpu/run/<job id>/<host>.<name>``
(:data:`RUN_FILE_NAMES`). The launcher removes them once it has the job's end. A job that ended
with nobody watching leaves them behind: one stopped by its dead-man switch after its watcher was
gone for good, one whose task was never retried. They hold what the job printed last
(``.out``, ``.err``) and when the switch fired (``.deadman``), which a person may want to read
for a while, so they stay for :data:`RETENTION_DAYS` days.

Every launch on a host first runs :data:`STALE_SCRIPT` there (:func:`sweep_line`). It removes
this host's files of every other job id when all three hold:

- none of them changed within the retention (a watched job's heartbeat and relayed offsets
  change all the time);
- no process on the host carries the job's markers for this host (the job list of
  :mod:`airflow_hetero_gpu.launch.command`, scoped as the orphan sweep is), so a job started long
  ago without supervision, whose only file is its old ``.pgid``, keeps it;
- the host's supervisor of that job (``.sup``) is not running.

Only this host's files are touched, never another host's in a home that several hosts share,
and never the launching job's own (a retry reads them). The directory goes once it is empty.
The script prints nothing and never fails the launch.
"""

from __future__ import annotations

import shlex

#: The names of a host's run files after ``<host>.`` (launch/command.py, launch/supervisor.py).
RUN_FILE_NAMES = ("launch", "sup", "pgid", "out", "err", "heartbeat", "heartbeat.new", "relayed", "relayed.new",
                  "exit", "deadman", "payload")
#: Days a host's run files of a job that ended unwatched stay for people to read.
RETENTION_DAYS = 7

# $1 host, $2 days, $3 the launching job's id, $4 the job list script, $5 the run root under the
# home. Constant: user input reaches it only as quoted positional arguments (job ids and host
# names are validated by the launch spec before).
STALE_SCRIPT = r"""
host=$1 days=$2 keep=$3 list=$4 root="$HOME"/$5
[ -d "$root" ] || exit 0
live=" $(sh -c "$list" hetero-gpu-jobs "$host" | sed 's/^job //' | tr '\n' ' ')"
recent=$(find "$root" -mindepth 2 -maxdepth 2 -name "$host.*" -mtime -"$days" 2>/dev/null)
for d in "$root"/*/; do
  job=${d%/}; job=${job##*/}; h="$d$host"
  [ "$job" = "$keep" ] && continue
  found=
  for n in __NAMES__; do [ -e "$h.$n" ] && found="$found $h.$n"; done
  [ -n "$found" ] || continue
  case "$recent" in *"$h."*) continue ;; esac
  case "$live" in *" $job "*) continue ;; esac
  sup=$(cat "$h.sup" 2>/dev/null)
  case "$sup" in ''|*[!0-9]*) ;; *) grep -qa hetero-gpu-supervisor /proc/"$sup"/cmdline 2>/dev/null && continue ;; esac
  for n in __NAMES__; do rm -f -- "$h.$n"; done
  rmdir -- "$d" 2>/dev/null
done
exit 0
""".replace("__NAMES__", " ".join(RUN_FILE_NAMES))


def sweep_line(job_id: str, host: str, list_script: str, run_root: str, days: int = RETENTION_DAYS) -> str:
    """The launch script's line that removes ``host``'s stale run files of other jobs (quiet,
    never failing). ``job_id`` and ``host`` are validated ones; ``list_script`` prints ``job <id>``
    per job with processes on the host (its ``$1``); ``run_root``: the run directories' parent
    relative to the home."""
    q = shlex.quote
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ValueError(f"run file retention: expected a whole number of days >= 1, got {days!r}")
    words = " ".join(q(w) for w in (host, str(days), job_id, list_script, run_root))
    return f"sh -c {q(STALE_SCRIPT)} hetero-gpu-stale {words} </dev/null >/dev/null 2>&1 || :"


__all__ = ["RETENTION_DAYS", "RUN_FILE_NAMES", "STALE_SCRIPT", "sweep_line"]
