"""The small part of the shell that the embedded server runs in-process, with the fake tools.

A remote command line is parsed into lists (``;``, ``&&``, ``||``) of pipelines (``|``) of simple
commands with a few redirections (``>/dev/null``, ``2>/dev/null``, ``2>&1``, ``>&2``,
``</dev/null``). When every simple command is one of the emulated tools (``nvidia-smi``,
``dmesg``, ``journalctl``, from :mod:`..fake_tools`), a plain ``grep`` reading a pipe, or a
``printf`` of ``%s`` fields whose arguments may be the last exit status ``$?`` (the marker lines
of the collector's one-session reads, :func:`~airflow_hetero_gpu.collect.command.run_together`),
:func:`parse` returns a :class:`Script` and :func:`run_script` runs it here, calling the fake
tools' functions directly: the same text the tools print when a real shell starts them, without a
shell or a Python process per command. The collector's read of the GPUs' processes (its two
constant segments, :mod:`airflow_hetero_gpu.collect.processes`) is answered here too: the listing
by the fake ``nvidia-smi``, the owners from ``/proc`` of the listed pids (real processes of this
machine, as ``ps`` would read them). Anything else (variables, globs, substitutions, other
programs, files) gives ``None``: the server then runs the line with ``bash -c`` as a real process.

Words are split with :mod:`shlex` (POSIX quoting) after a scan that finds word and operator
boundaries and refuses whatever the subset does not cover, so ``grep '|'`` is a word and
``2>/dev/null`` a redirection of descriptor 2, as in a shell.
"""

from __future__ import annotations

import functools
import io
import re
import shlex
from dataclasses import dataclass
from typing import Callable, Mapping, TextIO

from airflow_hetero_gpu.collect.processes import APPS_COMMAND, APPS_TOGETHER, PROCS_TOGETHER
from airflow_hetero_gpu.testing import fake_tools
from airflow_hetero_gpu.testing.embedded.owners import owners_text

#: Tools answered in-process: the fakes, by the name a shell would look up.
TOOLS: Mapping[str, Callable[..., int]] = dict(fake_tools.HANDLERS)
_OPERATORS = ("||", "&&", ">>", ">&", "|", ";", ">", "<")
_WORD_END = set(" \t|;<>&")
#: Unquoted characters with a meaning this subset does not model (expansions, globs, groups,
#: comments, background jobs, line breaks).
_UNSAFE = set("$`\\(){}*?[]~#!&\n\r")
_DEV_NULL = "/dev/null"
#: The word ``$?`` (the last exit status) in an argv: NUL never occurs in a shell word.
STATUS_WORD = "\0$?"
#: The collector's process reads, as words of their own (see the module docstring).
APPS_WORD, OWNERS_WORD = "hgpu-compute-apps", "hgpu-owners"


@dataclass(frozen=True)
class Simple:
    """One command: its argv and where its stdout and stderr go (``out``, ``err`` or ``null``)."""

    argv: tuple[str, ...]
    stdout: str = "out"
    stderr: str = "err"


@dataclass(frozen=True)
class Script:
    """``[(connector, pipeline), ...]``; the first connector is ``""``, the others ``;``, ``&&``
    or ``||``."""

    items: tuple[tuple[str, tuple[Simple, ...]], ...]

    @property
    def tools(self) -> set[str]:
        return {simple.argv[0] for _, pipeline in self.items for simple in pipeline}


@dataclass(frozen=True)
class _Token:
    kind: str   # "word" or "op"
    text: str   # the word's value (quotes removed) or the operator
    start: int
    end: int
    quoted: bool = False


def _scan(line: str) -> list[_Token] | None:
    """Words and operators of ``line``, or None when it uses anything outside the subset."""
    tokens: list[_Token] = []
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c in " \t":
            i += 1
            continue
        op = next((o for o in _OPERATORS if line.startswith(o, i)), None)
        if op is not None:
            tokens.append(_Token("op", op, i, i + len(op)))
            i += len(op)
            continue
        if c == "&":
            return None  # a background job
        if line.startswith("$?", i) and (i + 2 == n or line[i + 2] in _WORD_END):
            tokens.append(_Token("word", STATUS_WORD, i, i + 2))
            i += 2
            continue
        start, quoted = i, False
        while i < n and line[i] not in _WORD_END:
            c = line[i]
            if c in "'\"":
                close = line.find(c, i + 1)
                if close < 0 or (c == '"' and any(ch in line[i + 1:close] for ch in "$`\\!")):
                    return None
                quoted, i = True, close + 1
            elif c in _UNSAFE:
                return None
            else:
                i += 1
        raw = line[start:i]
        if quoted:
            try:
                (value,) = shlex.split(raw)
            except ValueError:
                return None
        else:
            value = raw
        tokens.append(_Token("word", value, start, i, quoted))
    return tokens


def _redirect(op: str, fd: int, target: _Token | None, simple: dict[str, str]) -> bool:
    """Apply one redirection to ``simple`` ({"stdout": .., "stderr": ..}); False if unsupported."""
    if target is None or target.kind != "word":
        return False
    if op == "<":
        return fd == 0 and target.text == _DEV_NULL
    stream = {1: "stdout", 2: "stderr"}.get(fd)
    if stream is None:
        return False
    if op in (">", ">>"):
        if target.text != _DEV_NULL:
            return False
        simple[stream] = "null"
        return True
    # ">&N": a copy of where descriptor N goes now (so "2>&1" sends stderr wherever stdout goes)
    source = {"1": "stdout", "2": "stderr"}.get(target.text)
    if source is None:
        return False
    simple[stream] = simple[source]
    return True


def _simple(tokens: list[_Token]) -> Simple | None:
    argv: list[str] = []
    streams = {"stdout": "out", "stderr": "err"}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if (tok.kind == "word" and not tok.quoted and tok.text.isdigit() and nxt is not None
                and nxt.kind == "op" and nxt.start == tok.end and nxt.text in (">", ">>", ">&", "<")):
            target = tokens[i + 2] if i + 2 < len(tokens) else None
            if not _redirect(nxt.text, int(tok.text), target, streams):
                return None
            i += 3
        elif tok.kind == "op":
            target = nxt
            if not _redirect(tok.text, 0 if tok.text == "<" else 1, target, streams):
                return None
            i += 2
        else:
            argv.append(tok.text)
            i += 1
    if not argv or "=" in argv[0] or (argv[0] not in TOOLS and argv[0] not in ("grep", "printf", APPS_WORD,
                                                                                 OWNERS_WORD)):
        return None
    if STATUS_WORD in argv[:1] or (argv[0] != "printf" and STATUS_WORD in argv):
        return None
    if argv[0] == "printf" and (len(argv) < 2 or _printf_format(argv[1]) is None):
        return None
    return Simple(tuple(argv), streams["stdout"], streams["stderr"])


@functools.lru_cache(maxsize=512)
def parse(line: str) -> Script | None:
    """The in-process plan of a command line, or None when a real shell must run it.

    Cached: a collection sends the same few lines to every host."""
    line = line.replace(APPS_TOGETHER, APPS_WORD).replace(PROCS_TOGETHER, OWNERS_WORD)
    tokens = _scan(line)
    if not tokens:
        return None
    items: list[tuple[str, tuple[Simple, ...]]] = []
    connector, pipeline, current = "", [], []
    for tok in tokens + [_Token("op", ";", len(line), len(line))]:
        if tok.kind == "op" and tok.text in ("|", ";", "&&", "||"):
            simple = _simple(current)
            if simple is None:
                if not current and tok.text == ";" and not pipeline and items and tok.start == len(line):
                    break  # a trailing ';'
                return None
            pipeline.append(simple)
            current = []
            if tok.text != "|":
                items.append((connector, tuple(pipeline)))
                connector, pipeline = tok.text, []
        else:
            current.append(tok)
    for _, commands in items:
        if commands[0].argv[0] == "grep":
            return None  # grep would read the session's stdin
        if any(c.argv[0] == "printf" for c in commands) and len(commands) > 1:
            return None  # printf only on its own
        if any(c.argv[0] != "grep" for c in commands[1:]):
            return None  # only grep reads a pipe here
        if any(_grep(c.argv) is None for c in commands if c.argv[0] == "grep"):
            return None
    return Script(tuple(items))


# ---------------------------------------------------------------------------------------------
# grep (reading a pipe)
# ---------------------------------------------------------------------------------------------

_BRE_LITERAL = re.compile(r"([+?|(){}])")


@dataclass(frozen=True)
class _Grep:
    pattern: re.Pattern[str]
    invert: bool
    quiet: bool
    count: bool


def _grep(argv: tuple[str, ...]) -> _Grep | None:
    """A ``grep [-FEGivqc] [-e] PATTERN`` reading stdin, or None (other options, files, classes)."""
    flags = set()
    pattern: str | None = None
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        if arg == "-e" and args and pattern is None:
            pattern = args.pop(0)
        elif arg.startswith("-") and len(arg) > 1 and pattern is None and set(arg[1:]) <= set("FEGivqc"):
            flags |= set(arg[1:])
        elif pattern is None:
            pattern = arg
        else:
            return None  # a file operand
    if pattern is None or "\\" in pattern or "[:" in pattern or "\n" in pattern:
        return None
    if "F" in flags:
        regex = re.escape(pattern)
    elif "E" in flags:
        regex = pattern
    else:
        regex = _BRE_LITERAL.sub(r"\\\1", pattern)
    try:
        compiled = re.compile(regex, re.IGNORECASE if "i" in flags else 0)
    except re.error:
        return None
    return _Grep(compiled, "v" in flags, "q" in flags, "c" in flags)


def _run_grep(argv: tuple[str, ...], stdin: str, out: TextIO) -> int:
    grep = _grep(argv)
    assert grep is not None  # checked by parse()
    lines = stdin.splitlines()
    chosen = [line for line in lines if bool(grep.pattern.search(line)) != grep.invert]
    if grep.count:
        out.write(f"{len(chosen)}\n")
    elif not grep.quiet:
        out.write("".join(line + "\n" for line in chosen))
    return 0 if chosen else 1


# ---------------------------------------------------------------------------------------------
# printf (the shell builtin, %s fields only)
# ---------------------------------------------------------------------------------------------

_PRINTF_PART = re.compile(r"%s|%%|\\n|\\\\|[^%\\]+")


def _printf_format(text: str) -> list[str] | None:
    """``text`` split into literals and ``%s`` fields (``\\n``, ``\\\\`` and ``%%`` decoded), or None
    when it uses anything else (other conversions, other escapes)."""
    parts, position = [], 0
    for match in _PRINTF_PART.finditer(text):
        if match.start() != position:
            return None
        piece = match.group()
        parts.append({"\\n": "\n", "\\\\": "\\", "%%": "%"}.get(piece, piece))
        position = match.end()
    return parts if position == len(text) else None


def _run_printf(argv: tuple[str, ...], status: int, out: TextIO) -> int:
    """bash's ``printf FORMAT ARG...``: the format again while arguments are left, a missing
    argument an empty string."""
    parts = _printf_format(argv[1])
    assert parts is not None  # checked by parse()
    args = [str(status) if arg == STATUS_WORD else arg for arg in argv[2:]]
    fields = parts.count("%s")
    while True:
        out.write("".join((args.pop(0) if args else "") if part == "%s" else part for part in parts))
        if not args or not fields:
            return 0


# ---------------------------------------------------------------------------------------------
# Running a script
# ---------------------------------------------------------------------------------------------


class _Null(io.StringIO):
    def write(self, text: str) -> int:
        return len(text)


def _command_not_found(tool: str, state: Mapping[str, object]) -> bool:
    return tool == "nvidia-smi" and "nvidia_smi_missing" in (state.get("faults") or [])


def _run_apps(state: Mapping[str, object], out: TextIO, err: TextIO) -> tuple[int, str]:
    """``hgpu_apps=$(nvidia-smi --query-compute-apps=...); printf '%s\\n' "$hgpu_apps"``: (status, listing)."""
    if _command_not_found("nvidia-smi", state):
        err.write("bash: line 1: nvidia-smi: command not found\n")
        out.write("\n")
        return 127, ""
    listing = io.StringIO()
    status = TOOLS["nvidia-smi"](APPS_COMMAND.split()[1:], dict(state), listing, err)
    text = listing.getvalue().rstrip("\n")  # what $(...) keeps
    out.write(text + "\n")
    return status, text


def run_script(script: Script, state: Mapping[str, object]) -> tuple[int, bytes, bytes]:
    """Run ``script`` against a host's state: (exit status, stdout, stderr), as bash would."""
    out, err = io.StringIO(), io.StringIO()
    status = 0
    apps = ""  # the listing the owners' read asks about, as the shell variable holds it
    for connector, pipeline in script.items:
        if (connector == "&&" and status != 0) or (connector == "||" and status == 0):
            continue
        piped = ""
        for position, simple in enumerate(pipeline):
            last = position == len(pipeline) - 1
            target = out if last else io.StringIO()
            streams = {"out": target, "err": err, "null": _Null()}
            cmd_out, cmd_err = streams[simple.stdout], streams[simple.stderr]
            tool = simple.argv[0]
            if tool == "grep":
                status = _run_grep(simple.argv, piped, cmd_out)
            elif tool == "printf":
                status = _run_printf(simple.argv, status, cmd_out)
            elif tool == APPS_WORD:
                status, apps = _run_apps(state, cmd_out, cmd_err)
            elif tool == OWNERS_WORD:
                cmd_out.write(owners_text(apps))
                status = 0
            elif _command_not_found(tool, state):
                cmd_err.write(f"bash: line 1: {tool}: command not found\n")
                status = 127
            else:
                status = TOOLS[tool](simple.argv[1:], dict(state), cmd_out, cmd_err)
            if not last:
                piped = target.getvalue()
    return status, out.getvalue().encode(), err.getvalue().encode()


__all__ = ["Script", "Simple", "TOOLS", "parse", "run_script"]
