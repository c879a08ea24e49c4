"""torchrun's traceback of a stop by a signal is left out of the relayed output; nothing else is.

The block is torchrun 2.13's own, as it printed it when SIGTERMed on this machine. The stream is
read by the real channel pump (:class:`HostRun`) from a file object that returns the bytes in
chunks cut anywhere (inside the head, the frames, the exception line), as an SSH channel or the
durable relay's ``tail`` may deliver them.
"""

from __future__ import annotations

import io

import pytest

from airflow_hetero_gpu.collect.targets import SshTarget
from airflow_hetero_gpu.launch.channel import HostRun, Worker
from airflow_hetero_gpu.launch.tracebacks import MAX_HELD_LINES, SignalTracebackFilter, stopped_line

TORCHRUN_BLOCK = """\
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 6, in <module>
    sys.exit(main())
             ^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1028, in main
    run(args)
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1019, in run
    elastic_launch(
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 194, in __call__
    return launch_agent(
           ^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 374, in launch_agent
    result = agent.run()
             ^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 923, in _invoke_run
    time.sleep(monitor_interval)
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 25820 got signal: 15
"""

OTHER_BLOCK = """\
Traceback (most recent call last):
  File "/opt/jobs/train.py", line 12, in <module>
    load(path)
ValueError: checkpoint /ckpt/x.pt is truncated
"""

BEFORE = ("W1205 18:23:59.977000 25820 torch/distributed/elastic/agent/server/api.py:753] "
          "Received 15 death signal, shutting down workers\nrank 0: SIGTERM received, stopping\n")
AFTER = "a line after\n"
REPLACED = "torchrun on node01 stopped by signal 15 (SIGTERM; its traceback left out)"


class Chunks(io.RawIOBase):
    """A stream that hands out ``data`` in pieces of the given sizes (cycled)."""

    def __init__(self, data: bytes, sizes: list[int]):
        self.data, self.sizes, self.pos, self.turn = data, sizes, 0, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        size = min(len(buf), self.sizes[self.turn % len(self.sizes)], len(self.data) - self.pos)
        self.turn += 1
        buf[:size] = self.data[self.pos:self.pos + size]
        self.pos += size
        return size


def pump(text: str, sizes: list[int], buffer_size: int = 8) -> tuple[list[str], HostRun]:
    """Read ``text`` as the stderr of host node01 through the channel pump; the lines handed on."""
    got: list[str] = []
    run = HostRun(Worker(SshTarget("node01", "127.0.0.1"), 0, "true"), client=None, tail_lines=500,
                  max_line_bytes=64 * 1024, on_line=lambda host, rank, stream, line: got.append(line),
                  on_end=lambda run: None)
    run._read("stderr", io.BufferedReader(Chunks(text.encode(), sizes), buffer_size=buffer_size))
    return got, run


def lines(text: str) -> list[str]:
    return text.splitlines()


@pytest.mark.parametrize("sizes", [[1], [7], [3, 50, 1, 200], [len(TORCHRUN_BLOCK) // 2], [100000]],
                         ids=["1", "7", "mixed", "half", "whole"])
def test_torchruns_block_split_across_chunks_becomes_one_line_and_an_unrelated_traceback_is_kept(sizes):
    text = BEFORE + TORCHRUN_BLOCK + OTHER_BLOCK + AFTER
    got, run = pump(text, sizes)
    assert got == lines(BEFORE) + [REPLACED] + lines(OTHER_BLOCK) + lines(AFTER)
    assert run.relayed == [0, len(text.encode())]  # every byte counted once: a reattach resumes after it
    assert list(run.tail) == got
    assert run.first_error == "ValueError: checkpoint /ckpt/x.pt is truncated"


def test_a_traceback_cut_by_the_end_of_the_stream_is_handed_on_whole():
    cut = "".join(TORCHRUN_BLOCK.splitlines(keepends=True)[:-1])  # no exception line yet
    got, run = pump(BEFORE + cut, [5])
    assert got == lines(BEFORE) + lines(cut)
    assert run.relayed[1] == len((BEFORE + cut).encode())


def test_an_interleaved_line_lets_the_block_through_untouched():
    head, rest = TORCHRUN_BLOCK.split("\n", 1)
    text = head + "\nrank 1: a line in between\n" + rest
    got, _ = pump(text, [9])
    assert got == lines(text)  # not the known block as it came: nothing is left out


@pytest.mark.parametrize("final, kept", [
    ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 10", False),
    ("SignalException: Process 7 got signal: 1", False),
    ("RuntimeError: Process 7 got signal: 15", True),
    ("torch.distributed.elastic.multiprocessing.api.SignalException: something else", True),
    ("my.SignalException: Process 7 got signal: 15", True),
])
def test_only_torchruns_signal_exception_ends_a_block_left_out(final, kept):
    f = SignalTracebackFilter("h")
    block = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "    go()", final]
    out = [line for text in block for line, _ in f.feed(text, len(text) + 1)] + [line for line, _ in f.close()]
    if kept:
        assert out == block
    else:
        assert len(out) == 1 and out[0].startswith("torchrun on h stopped by signal ")


def test_a_block_too_long_to_hold_is_handed_on():
    f = SignalTracebackFilter("h")
    assert f.feed("Traceback (most recent call last):", 35) == []
    handed = []
    for i in range(MAX_HELD_LINES + 1):
        handed += f.feed(f"  frame {i}", 10)
    assert len(handed) == MAX_HELD_LINES + 2 and handed[0][0].startswith("Traceback")  # the head and every frame
    assert f.feed("SignalException: Process 1 got signal: 15", 40) == [("SignalException: Process 1 got signal: 15", 40)]


def test_stopped_line_names_the_signal():
    assert stopped_line("node02", 15) == "torchrun on node02 stopped by signal 15 (SIGTERM; its traceback left out)"
    assert stopped_line("node02", 99) == "torchrun on node02 stopped by signal 99 (its traceback left out)"
