"""The process's open-file limit, sized for a collection's fan-out.

Each host in flight holds a TCP socket and, per open SSH session, the pipe paramiko waits on:
about :data:`FDS_PER_HOST` descriptors. A collection with ``max_parallel`` hosts in flight raises
the soft ``RLIMIT_NOFILE`` towards the hard limit when it needs more than the soft limit allows
(Linux distributions often start processes at a soft limit of 1,024); where even the hard limit
is too low, it says so in one line and what to do, instead of failing hosts one by one with
``Too many open files``.
"""

from __future__ import annotations

import os
import resource

#: Descriptors one host in flight can hold: its socket, one session's pipe pair, and slack.
FDS_PER_HOST = 4
#: Descriptors kept for everything else the process has open (logs, the capture files, ...).
RESERVE = 64


class OpenFilesLimitError(ValueError):
    """The hard open-file limit is too low for the fan-out asked for."""


def open_files() -> int:
    """How many descriptors this process has open now (Linux /proc; 0 elsewhere)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def needed_open_files(in_flight: int) -> int:
    """Descriptors a collection with ``in_flight`` hosts at once needs on top of those open now."""
    return open_files() + RESERVE + FDS_PER_HOST * max(0, in_flight)


def ensure_open_files(in_flight: int) -> int:
    """Make room for ``in_flight`` hosts at once; returns the soft limit in force afterwards.

    Raises :class:`OpenFilesLimitError` (one line: the numbers and what to do) when the hard
    limit cannot hold them.
    """
    needed = needed_open_files(in_flight)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return soft
    if hard != resource.RLIM_INFINITY and needed > hard:
        fits = max(1, (hard - open_files() - RESERVE) // FDS_PER_HOST)
        raise OpenFilesLimitError(
            f"max_parallel {in_flight} needs about {needed} open files but this process may open "
            f"at most {hard} (hard limit): lower max_parallel to {fits} or less, or raise the hard "
            f"limit (ulimit -Hn; LimitNOFILE= in a systemd unit)"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else min(hard, needed), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


__all__ = ["FDS_PER_HOST", "OpenFilesLimitError", "ensure_open_files", "needed_open_files"]
