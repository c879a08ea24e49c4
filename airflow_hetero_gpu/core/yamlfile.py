"""Strict reading of an admin's YAML file (the teams file): UTF-8 only, a bounded size and
nesting depth, no key given twice. Every refusal is one line naming the file (and the line).

    data = load_strict_yaml(read_bounded(path, TeamsError), path, TeamsError)

PyYAML's ``safe_load`` alone accepts a mapping that names a key twice (the last wins, silently),
recurses once per nesting level (YAML nested thousands deep is a ``RecursionError``) and decodes
whatever bytes it is given; :class:`StrictLoader` is its ``SafeLoader`` with those three closed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import yaml

#: The largest file read (bytes): a teams file of a thousand teams is well under 200 KiB.
MAX_FILE_BYTES = 1 << 20
#: The deepest nesting of mappings and lists (the teams file needs 3).
MAX_DEPTH = 32

Error = Callable[[str], Exception]


class _Refused(yaml.YAMLError):
    def __init__(self, problem: str, mark: Any = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class StrictLoader(yaml.SafeLoader):
    """``SafeLoader`` refusing a key given twice in one mapping and nesting deeper than ``MAX_DEPTH``."""

    _depth = 0

    def compose_node(self, parent, index):  # type: ignore[override]
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue  # an unhashable key: SafeLoader's own error says so
                if first is not key_node:
                    raise _Refused(f"key {key!r} given twice (first on line {first.start_mark.line + 1})",
                                   key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def read_bounded(path: str | Path, error: Error, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The file's text: at most ``max_bytes``, strict UTF-8; otherwise ``error(one line)``."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except OSError as err:
        raise error(f"{path}: cannot read: {err.strerror or err}") from None
    if len(raw) > max_bytes:
        raise error(f"{path}: larger than {max_bytes} bytes")
    return decode_utf8(raw, str(path), error)


def decode_utf8(raw: bytes, source: str, error: Error) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise error(f"{source}: not UTF-8 text (line {line}, byte {raw[err.start]:#04x} at offset {err.start})") \
            from None
    return text[1:] if text.startswith("\ufeff") else text


def load_strict_yaml(text: str, source: str, error: Error, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Parse ``text`` with :class:`StrictLoader`; a mistake is ``error("SOURCE: ... (line N): ...")``."""
    if len(text) > max_bytes:
        raise error(f"{source}: larger than {max_bytes} characters")
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise error(f"{source}: not valid YAML{where}: {problem}") from None
    except RecursionError:  # a guard above PyYAML's own recursion; kept as one line all the same
        raise error(f"{source}: not valid YAML: nested too deep") from None


__all__ = ["MAX_DEPTH", "MAX_FILE_BYTES", "StrictLoader", "decode_utf8", "load_strict_yaml", "read_bounded"]
