"""SSH targets of a collection and the ``--hosts`` syntax that names them.

``--hosts`` takes a comma-separated list of ``[NAME=][USER@]HOST[:PORT]`` where HOST is a host
name, an IPv4 address or a bracketed IPv6 address (``[::1]:2222``; a bare IPv6 address without a
port is accepted too). NAME, when given, is the host's name in the capture directory
(``hosts/<NAME>/``); it defaults to HOST.

``--hosts-file FILE`` holds the same entries one a line, for fleets too large for a command line
(Linux caps one argument at 128 KiB, about 4,500 hosts): blank lines and ``#`` comments (whole
lines or after an entry) are ignored; a bad line is a one-line error naming the file and line.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*\$?$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9_-]{1,63})*\.?$")


@dataclass(frozen=True)
class SshTarget:
    """One host to collect from: its capture name, address, port and login user."""

    host_name: str
    address: str
    port: int = 22
    user: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.host_name or "") and not _is_ip(self.host_name):
            raise ValueError(f"invalid host name {self.host_name!r}: use letters, digits, '.', '_' or '-'")
        if not (1 <= int(self.port) <= 65535):
            raise ValueError(f"invalid port {self.port!r} for host {self.host_name!r}: must be 1-65535")

    @property
    def endpoint(self) -> str:
        """``addr:port`` (``[v6]:port`` for IPv6), as used in messages."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.endpoint}"


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


class _Bad:
    """Builds the ValueError of a bad entry, worded for where the entry came from."""

    def __init__(self, source: str):
        self.source = source

    def __call__(self, item: str, why: str) -> ValueError:
        return ValueError(f"invalid {self.source} {item!r}: {why}")


def parse_host(item: str, *, source: str = "--hosts entry", user: str | None = None, port: int = 22) -> SshTarget:
    """Parse one ``[NAME=][USER@]HOST[:PORT]`` entry; ValueError names the entry (and ``source``,
    what it is called in the message). ``user`` and ``port``: an entry's when it names none."""
    default_user, default_port = user, port
    _bad = _Bad(source)
    raw = item
    item = item.strip()
    if not item:
        raise _bad(raw, "empty entry")
    name: str | None = None
    if "=" in item:
        name, item = item.split("=", 1)
        if not _NAME.fullmatch(name):
            raise _bad(raw, f"host name {name!r} may hold only letters, digits, '.', '_' or '-'")
    user = default_user
    if "@" in item:
        user, item = item.rsplit("@", 1)
        if not _USER.fullmatch(user):
            raise _bad(raw, f"user {user!r} is not a valid login name")
    port = default_port
    if item.startswith("["):
        end = item.find("]")
        if end < 0:
            raise _bad(raw, "missing ']' after an IPv6 address")
        host, rest = item[1:end], item[end + 1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _bad(raw, f"{host!r} in brackets is not an IPv6 address") from None
        if rest:
            if not rest.startswith(":"):
                raise _bad(raw, f"unexpected {rest!r} after ']'")
            port = _port(raw, rest[1:], _bad)
    elif item.count(":") > 1:
        host = item
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _bad(raw, "an IPv6 address with a port needs brackets: [ADDR]:PORT") from None
    else:
        host, _, port_text = item.partition(":")
        if _:
            port = _port(raw, port_text, _bad)
        if not host:
            raise _bad(raw, "no host")
        if not (_is_ip(host) or _HOSTNAME.fullmatch(host)):
            raise _bad(raw, f"{host!r} is not a host name or IP address")
    try:
        return SshTarget(host_name=name or host, address=host, port=port, user=user)
    except ValueError as exc:
        raise _bad(raw, str(exc)) from None


def _port(raw: str, text: str, bad: _Bad) -> int:
    if not text.isdigit() or not (1 <= int(text) <= 65535):
        raise bad(raw, f"port {text!r} must be a number 1-65535")
    return int(text)


def parse_hosts_arg(value: str) -> list[SshTarget]:
    """Parse ``[NAME=][USER@]HOST[:PORT],...`` into targets; ValueError names the bad value."""
    if not value or not value.strip():
        raise ValueError("--hosts is empty: give [USER@]HOST[:PORT],...")
    targets = [parse_host(item) for item in value.split(",")]
    seen: dict[str, SshTarget] = {}
    for target in targets:
        if target.host_name in seen:
            raise ValueError(f"host {target.host_name!r} appears twice in --hosts")
        seen[target.host_name] = target
    return targets


def parse_hosts_file(path: str | os.PathLike[str], *, user: str | None = None, port: int = 22) -> list[SshTarget]:
    """Targets of a hosts file: one ``[NAME=][USER@]HOST[:PORT]`` a line, ``#`` comments and
    blank lines allowed. ValueError (one line, ``FILE:LINE: ...``) for a bad line, a host named
    twice, an unreadable or empty file. ``user`` and ``port``: an entry's when it names none."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise ValueError(f"hosts file {os.fspath(path)}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"hosts file {os.fspath(path)}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    targets: list[SshTarget] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(lines, 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        where = f"{os.fspath(path)}:{lineno}"
        if "," in entry or any(c.isspace() for c in entry):
            raise ValueError(f"{where}: one host a line, got {entry!r}")
        try:
            target = parse_host(entry, source="host entry", user=user, port=port)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if target.host_name in first_line:
            raise ValueError(f"{where}: host {target.host_name!r} appears twice "
                             f"(first on line {first_line[target.host_name]})")
        first_line[target.host_name] = lineno
        targets.append(target)
    if not targets:
        raise ValueError(f"hosts file {os.fspath(path)}: no hosts (one [NAME=][USER@]HOST[:PORT] a line)")
    return targets
