"""The SSH targets of a running job, each host's Airflow connection read when first needed."""

from __future__ import annotations

from typing import Any, Sequence


class LazyTargets(dict):
    """The job's SSH targets, each host's connection read when first needed (a replacement may
    move the job to a host it did not start on)."""

    def __init__(self, hook: Any, hosts: Sequence[str]):
        super().__init__(hook.ssh_targets(hosts))
        self._hook = hook

    def __missing__(self, host: str):
        target = self._hook.ssh_targets([host])[host]
        self[host] = target
        return target
