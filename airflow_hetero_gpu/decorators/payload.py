"""The payload a ``@task.hetero_train`` job sends to every host: the host runner
(:mod:`airflow_hetero_gpu.decorators.host_runner`, standard library only) followed by the
function's source and its pickled arguments.

What travels, and what does not:

- the function's **source** (``inspect.getsource``), not its pickle: the hosts need neither the
  DAG file nor ``airflow_hetero_gpu``. So the function must be self-contained: it may use its
  arguments, builtins and what it imports itself; a name it takes from the DAG file's globals
  or from an enclosing function is refused here, with the names, before anything is reserved;
- its **arguments**, pickled (protocol 4): any value the hosts' Python can unpickle (numbers,
  strings, lists, dicts, dates, ...; classes only when importable there). One that cannot be
  pickled is refused here, by its name;
- the **nonce** of this try, which the ranks' marked output lines must carry.
"""

from __future__ import annotations

import ast
import base64
import builtins
import dis
import inspect
import json
import pickle
import secrets
import textwrap
import zlib
from pathlib import Path
from types import CodeType
from typing import Any, Callable, Mapping, Sequence

from airflow_hetero_gpu.decorators import host_runner

PICKLE_PROTOCOL = 4


class PayloadError(ValueError):
    """The function or its arguments cannot travel to the hosts; the message says why (one line)."""


def new_nonce() -> str:
    return secrets.token_hex(8)


def function_source(func: Callable) -> tuple[str, str, int]:
    """(dedented source, file name, first line number) of a ``def`` function."""
    func = inspect.unwrap(func)
    name = getattr(func, "__name__", repr(func))
    try:
        lines, lineno = inspect.getsourcelines(func)
        filename = inspect.getsourcefile(func) or func.__code__.co_filename
    except (OSError, TypeError) as err:
        raise PayloadError(f"cannot read the source of function {name!r} ({err}): the hosts run the function "
                           "from its source, so define it with def in a DAG file") from None
    source = textwrap.dedent("".join(lines))
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise PayloadError(f"cannot parse the source of function {name!r}: {err}") from None
    if not any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body):
        raise PayloadError(f"function {name!r}: the hosts run the function from its source, so it must be "
                           "defined with def (not a lambda, not async)")
    return source, filename, lineno


def _global_loads(code: CodeType) -> set[str]:
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _global_loads(const)
    return names


def check_self_contained(func: Callable) -> None:
    """Refuse a function that uses names it would not have on the hosts: its DAG file's globals
    (a module imported at the top of the file, a constant) or an enclosing function's variables."""
    func = inspect.unwrap(func)
    code = func.__code__
    if code.co_freevars:
        raise PayloadError(
            f"function {func.__name__!r} uses {', '.join(sorted(code.co_freevars))} from the enclosing function; "
            "on the hosts it has only its arguments and its own imports: pass them as arguments")
    module_globals = getattr(func, "__globals__", {})
    outside = sorted(n for n in _global_loads(code)
                     if n in module_globals and not hasattr(builtins, n) and not n.startswith("__"))
    if outside:
        raise PayloadError(
            f"function {func.__name__!r} uses {', '.join(outside)} from its DAG file; on the hosts it has only its "
            "arguments and its own imports: import inside the function, or pass the values as arguments")


def pickle_arguments(args: Sequence[Any], kwargs: Mapping[str, Any], func_name: str) -> bytes:
    """The pickled ``(args, kwargs)``; a value that cannot be pickled is named."""
    try:
        return pickle.dumps((tuple(args), dict(kwargs)), protocol=PICKLE_PROTOCOL)
    except Exception:
        pass
    named = [(f"positional argument {i}", v) for i, v in enumerate(args)] + \
            [(f"argument {k!r}", v) for k, v in kwargs.items()]
    for label, value in named:
        try:
            pickle.dumps(value, protocol=PICKLE_PROTOCOL)
        except Exception as err:
            raise PayloadError(f"{label} of {func_name!r} cannot travel to the hosts (pickle: "
                               f"{' '.join(str(err).split()) or type(err).__name__}); pass plain values") from None
    raise PayloadError(f"the arguments of {func_name!r} cannot be pickled together")


def build_payload(func: Callable, args: Sequence[Any], kwargs: Mapping[str, Any], nonce: str) -> bytes:
    """The file every host stores and torchrun runs: the host runner, then ``PAYLOAD``."""
    check_self_contained(func)
    source, filename, lineno = function_source(func)
    name = inspect.unwrap(func).__name__
    spec = {"v": 1, "name": name, "source": source, "filename": filename, "lineno": lineno, "nonce": nonce,
            "args": base64.b64encode(pickle_arguments(args, kwargs, name)).decode("ascii")}
    blob = base64.b64encode(zlib.compress(json.dumps(spec).encode("utf-8"), 9)).decode("ascii")
    runner = Path(host_runner.__file__).read_text(encoding="utf-8")
    footer = f'\n\nPAYLOAD = "{blob}"\n\nif __name__ == "__main__":\n    sys.exit(main(PAYLOAD))\n'
    return (runner + footer).encode("utf-8")


__all__ = ["PayloadError", "build_payload", "check_self_contained", "function_source", "new_nonce",
           "pickle_arguments"]
