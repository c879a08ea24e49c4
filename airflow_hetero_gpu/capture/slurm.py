r"""Slurm host lists and ``topology.conf`` (the network between hosts, SPEC §5).

``topology.conf`` uses the syntax of Slurm's topology/tree plugin::

    # leaf switches list nodes, upper switches list switches
    SwitchName=s0 Nodes=dgx[01-04] LinkSpeed=400
    SwitchName=s1 Nodes=dgx[05-08],gpu-a
    SwitchName=core Switches=s[0-1]

Keys are case-insensitive as in Slurm, ``#`` starts a comment, a trailing ``\`` continues a line.
A switch listing ``Nodes=`` is tier 1; one listing ``Switches=`` is one tier above the highest
of its children.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import product

from airflow_hetero_gpu.errors import CaptureError

__all__ = ["MAX_HOSTLIST", "Switch", "SwitchTopology", "expand_hostlist", "parse_topology_conf"]

MAX_HOSTLIST = 1_000_000  # refuse host lists that would expand beyond this many names

_PIECE = re.compile(r"(?:[^,\[\]\s]|\[[^\[\]\s]*\])+")  # one comma-separated host expression
_BRACKET = re.compile(r"\[([^\[\]]*)\]")
_RANGE = re.compile(r"(?P<lo>[0-9]+)(?:-(?P<hi>[0-9]+))?")
_SWITCH_NAME = re.compile(r"[^\s\[\],=#]+")
_KEYS = {"switchname": "SwitchName", "nodes": "Nodes", "switches": "Switches", "linkspeed": "LinkSpeed"}


def _expand_ranges(spec: str, expr: str) -> list[str]:
    """``01-03,07`` -> ``['01', '02', '03', '07']``, zero padding kept (width of the low end)."""
    values: list[str] = []
    for part in spec.split(","):
        match = _RANGE.fullmatch(part)
        if match is None:
            raise ValueError(f"bad range {part!r} in host list {expr!r} (expected N or N-M)")
        lo, hi = match["lo"], match["hi"] or match["lo"]
        if int(hi) < int(lo):
            raise ValueError(f"range {part!r} runs backwards in host list {expr!r}")
        if int(hi) - int(lo) >= MAX_HOSTLIST:
            raise ValueError(f"range {part!r} in host list {expr!r} is too large")
        values.extend(f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1))
    return values


def _expand_piece(piece: str, expr: str) -> list[str]:
    """One host expression, e.g. ``rack[1-2]-n[01-03]``: the product of its bracket groups."""
    parts = _BRACKET.split(piece)  # literal, ranges, literal, ranges, ..., literal
    choices: list[list[str]] = []
    size = 1
    for i, part in enumerate(parts):
        options = _expand_ranges(part, expr) if i % 2 else [part]
        size *= len(options)
        if size > MAX_HOSTLIST:
            raise ValueError(f"host list {expr!r} expands to more than {MAX_HOSTLIST} names")
        choices.append(options)
    return ["".join(combination) for combination in product(*choices)]


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm host list: ``node[01-04,07],gpu-a`` -> node01 .. node04, node07, gpu-a.

    Supports zero padding, several bracket groups in one name (``rack[1-2]-n[1-3]``, the first
    group varying slowest, as ``scontrol show hostnames`` prints them) and commas inside and
    outside brackets. Names keep their order; duplicates are kept. Raises ``ValueError`` with a
    one-line message on anything malformed (empty names, unbalanced or nested brackets, bad
    ranges, whitespace).
    """
    expr = expr.strip()
    if not expr:
        raise ValueError("empty host list")
    pieces = _PIECE.findall(expr)
    if ",".join(pieces) != expr:
        raise ValueError(
            f"malformed host list {expr!r} (expected names like node[01-04,07],gpu-a: "
            "no empty names, spaces or nested/unbalanced brackets)"
        )
    hosts: list[str] = []
    for piece in pieces:
        hosts.extend(_expand_piece(piece, expr))
        if len(hosts) > MAX_HOSTLIST:
            raise ValueError(f"host list {expr!r} expands to more than {MAX_HOSTLIST} names")
    return hosts


@dataclass(frozen=True)
class Switch:
    """One ``SwitchName=`` line: its children and the tier computed from them."""

    name: str
    line: int
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()
    link_speed: str | None = None
    tier: int = 0


@dataclass(frozen=True)
class SwitchTopology:
    """The switch tree of a ``topology.conf`` with per-host lookups precomputed.

    ``_above[host]`` maps every switch a host hangs under (directly or through other switches)
    to that switch's tier, so :meth:`lowest_common_tier` costs O(depth) and the rest O(1).
    """

    switches: dict[str, Switch]
    _above: dict[str, dict[str, int]] = field(repr=False)
    _hosts: frozenset[str] = field(repr=False)
    _max_tier: int = 0

    @property
    def hosts(self) -> frozenset[str]:
        """Every host listed under some switch."""
        return self._hosts

    @property
    def max_tier(self) -> int:
        """The highest switch tier (0 when there are no switches)."""
        return self._max_tier

    def switches_of(self, host: str) -> tuple[str, ...]:
        """The switches ``host`` hangs under, lowest tier first (then by name); () if unlisted."""
        above = self._above.get(host, {})
        return tuple(sorted(above, key=lambda name: (above[name], name)))

    def lowest_common_tier(self, host_a: str, host_b: str) -> int | None:
        """Tier of the lowest switch both hosts hang under; None if none or a host is unlisted."""
        above_a, above_b = self._above.get(host_a), self._above.get(host_b)
        if not above_a or not above_b:
            return None
        if len(above_b) < len(above_a):
            above_a, above_b = above_b, above_a
        common = [tier for name, tier in above_a.items() if name in above_b]
        return min(common) if common else None


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines without comments, continuation lines joined, each with its first line number."""
    lines: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        content = raw.split("#", 1)[0].rstrip()
        start, prefix = pending if pending else (number, "")
        if content.endswith("\\"):
            pending = (start, prefix + content[:-1] + " ")
            continue
        pending = None
        joined = (prefix + content).strip()
        if joined:
            lines.append((start, joined))
    if pending and pending[1].strip():
        lines.append((pending[0], pending[1].strip()))
    return lines


def _parse_switch_line(line: str, number: int, path: str) -> Switch:
    """One ``SwitchName=... Nodes=...|Switches=... [LinkSpeed=...]`` line."""
    values: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        canonical = _KEYS.get(key.lower())
        if canonical is None:
            raise CaptureError(path, f"unknown key {key!r} (known: SwitchName, Nodes, Switches, LinkSpeed)", number)
        if not sep or not value:
            raise CaptureError(path, f"{canonical} has no value", number)
        if canonical in values:
            raise CaptureError(path, f"{canonical} given twice", number)
        values[canonical] = value
    name = values.get("SwitchName")
    if name is None:
        raise CaptureError(path, "line does not start a switch (SwitchName= missing)", number)
    if not _SWITCH_NAME.fullmatch(name):
        raise CaptureError(path, f"bad switch name {name!r}", number)
    if ("Nodes" in values) == ("Switches" in values):
        raise CaptureError(path, f"switch {name} needs exactly one of Nodes= or Switches=", number)
    key = "Nodes" if "Nodes" in values else "Switches"
    try:
        children = tuple(expand_hostlist(values[key]))
    except ValueError as exc:
        raise CaptureError(path, f"switch {name} {key}=: {exc}", number) from None
    if key == "Nodes":
        return Switch(name, number, nodes=children, link_speed=values.get("LinkSpeed"))
    return Switch(name, number, switches=children, link_speed=values.get("LinkSpeed"))


def _tiers(switches: dict[str, Switch], path: str) -> dict[str, int]:
    """Tier of every switch; undefined children and cycles are errors."""
    tiers: dict[str, int] = {}
    for root in switches:
        stack: list[tuple[str, bool]] = [(root, False)]
        visiting: set[str] = set()
        while stack:
            name, children_done = stack.pop()
            if name in tiers:
                continue
            switch = switches[name]
            if children_done:
                visiting.discard(name)
                tiers[name] = 1 + max((tiers[child] for child in switch.switches), default=0)
                continue
            visiting.add(name)
            stack.append((name, True))
            for child in switch.switches:
                if child not in switches:
                    raise CaptureError(path, f"switch {name} lists undefined switch {child!r}", switch.line)
                if child in visiting:
                    raise CaptureError(path, f"switches form a cycle through {name} and {child}", switch.line)
                if child not in tiers:
                    stack.append((child, False))
    return tiers


def parse_topology_conf(text: str, path: str) -> SwitchTopology:
    """Read a Slurm ``topology.conf`` (tree plugin syntax); ``path`` names it in errors."""
    switches: dict[str, Switch] = {}
    for number, line in _logical_lines(text):
        switch = _parse_switch_line(line, number, path)
        if switch.name in switches:
            raise CaptureError(
                path, f"switch {switch.name} defined twice (first on line {switches[switch.name].line})", number
            )
        switches[switch.name] = switch
    tiers = _tiers(switches, path)
    switches = {
        name: Switch(s.name, s.line, s.nodes, s.switches, s.link_speed, tiers[name]) for name, s in switches.items()
    }

    # Every switch a host hangs under: start at its leaf switches, walk up through the parents.
    parents: dict[str, list[str]] = {name: [] for name in switches}
    for switch in switches.values():
        for child in switch.switches:
            parents[child].append(switch.name)
    above_switch: dict[str, dict[str, int]] = {}
    for name in sorted(switches, key=lambda n: -tiers[n]):  # parents before their children
        above = {name: tiers[name]}
        for parent in parents[name]:
            above.update(above_switch[parent])
        above_switch[name] = above
    above_host: dict[str, dict[str, int]] = {}
    for switch in switches.values():
        for host in switch.nodes:
            if host in above_host:  # under several leaf switches: merge into a private copy
                above_host[host] = {**above_host[host], **above_switch[switch.name]}
            else:  # the common case shares the leaf switch's dict
                above_host[host] = above_switch[switch.name]
    return SwitchTopology(switches, above_host, frozenset(above_host), max(tiers.values(), default=0))
