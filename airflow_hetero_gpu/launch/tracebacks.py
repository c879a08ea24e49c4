"""Leave torchrun's own traceback out of a job's relayed output when it is stopped by a signal.

torchrun's agent turns a signal into ``SignalException`` and dies of it, printing a ~35-line
Python traceback (``torch.distributed.elastic.multiprocessing.api.SignalException: Process N got
signal: 15``) each time the launcher stops it on purpose: a preemption, a kill, a watchdog. That
block says nothing the launcher does not already know, and a task log full of tracebacks reads
like a failure. :class:`SignalTracebackFilter` sits in the channel pump
(:mod:`airflow_hetero_gpu.launch.channel`), through which every line of a job passes, launched
or reattached (a supervised job's output files are relayed over the same channel by its follow
part), and replaces exactly that block with one line::

    torchrun on node01 stopped by signal 15 (SIGTERM; its traceback left out)

The filter works on lines and holds a block from its ``Traceback (most recent call last):`` head
until its first line that is not indented, the exception line. Only when that line is torchrun's
``SignalException`` is the block dropped; any other block is handed on as it came, every line, in
order. A block longer than :data:`MAX_HELD_LINES` (torchrun's is about 35) is handed on without
waiting further, and whatever is held when the stream ends is handed on too: nothing is lost.
Each line carries its size in bytes, so the caller counts as relayed only what was handed on or
dropped (a reattach after a watcher died in the middle of a block reads the block again whole).
"""

from __future__ import annotations

import re
import signal as signals

TRACEBACK_HEAD = "Traceback (most recent call last):"
#: torchrun's agent dying of a signal: the exception line that ends the block left out
SIGNAL_EXCEPTION = re.compile(
    r"^(?:torch\.distributed\.elastic\.multiprocessing\.api\.)?SignalException: Process \d+ got signal: (\d+)\s*$")
#: a held block longer than this is handed on (torchrun's is about 35 lines)
MAX_HELD_LINES = 200

Line = tuple[str, int]  # (text without its line end, bytes it took in the stream)


def stopped_line(host: str, signum: int) -> str:
    """The one line that stands for the traceback left out."""
    try:
        name = f"{signals.Signals(signum).name}; "
    except ValueError:
        name = ""
    return f"torchrun on {host} stopped by signal {signum} ({name}its traceback left out)"


class SignalTracebackFilter:
    """One stream's filter: :meth:`feed` each line as it comes, :meth:`close` at the end; both
    return the lines to hand on, each with the bytes it stands for."""

    def __init__(self, host: str):
        self.host = host
        self.held: list[Line] = []
        self.left_out = 0  # blocks replaced so far

    def feed(self, text: str, nbytes: int) -> list[Line]:
        if not self.held:
            if text.rstrip() == TRACEBACK_HEAD:
                self.held.append((text, nbytes))
                return []
            return [(text, nbytes)]
        if text[:1] in (" ", "\t"):  # a frame, its source line, its ^^^ markers
            self.held.append((text, nbytes))
            if len(self.held) > MAX_HELD_LINES:
                return self.close()
            return []
        match = SIGNAL_EXCEPTION.match(text)
        if match:  # the known block: one line stands for all of it
            size = sum(n for _, n in self.held) + nbytes
            self.held = []
            self.left_out += 1
            return [(stopped_line(self.host, int(match.group(1))), size)]
        out = self.close()
        return out + self.feed(text, nbytes)  # the exception line, or the head of another block

    def close(self) -> list[Line]:
        """Hand on whatever is held (the stream ended, or the block is not torchrun's)."""
        out, self.held = self.held, []
        return out


__all__ = ["MAX_HELD_LINES", "SIGNAL_EXCEPTION", "SignalTracebackFilter", "TRACEBACK_HEAD", "stopped_line"]
