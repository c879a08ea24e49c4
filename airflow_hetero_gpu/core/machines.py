"""One machine, one inventory: two host names whose GPUs report the same UUIDs are one machine.

A machine listed twice (a host name and its IP address, two aliases, a connection id beside the
name the health watch uses) would have every GPU counted, and handed out, twice. The first name
(in name order) keeps the GPUs; the other is reported as a duplicate of it and contributes
nothing. (The collector also collects two names with the same address and port only once:
:mod:`airflow_hetero_gpu.collect.ssh`.)
"""

from __future__ import annotations

from typing import Iterable, Mapping


def duplicate_hosts(uuids_by_host: Mapping[str, Iterable[str]]) -> dict[str, tuple[str, str]]:
    """{duplicate host: (the host it duplicates, why)} for hosts sharing a GPU UUID with a host
    that sorts before them. Hosts without UUIDs (never collected) are nobody's duplicate."""
    owner: dict[str, str] = {}
    out: dict[str, tuple[str, str]] = {}
    for host in sorted(uuids_by_host):
        uuids = [u for u in uuids_by_host[host] if u]
        shared = [u for u in uuids if u in owner]
        if shared:
            first = owner[shared[0]]
            out[host] = (first, f"same GPU UUIDs as {first} ({shared[0]}"
                                + (f" and {len(shared) - 1} more" if len(shared) > 1 else "") + ")")
            continue
        for u in uuids:
            owner[u] = host
    return out


def duplicate_line(host: str, first: str, why: str) -> str:
    """``node01-ip is a duplicate of node01: same GPU UUIDs as node01 (GPU-...); counted once``."""
    return f"{host} is a duplicate of {first}: {why}; its GPUs are counted once, as {first}'s"


__all__ = ["duplicate_hosts", "duplicate_line"]
