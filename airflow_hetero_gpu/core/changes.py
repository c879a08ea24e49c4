"""What changed between two collections (S10): new hosts and GPUs re-partition the pools.

Pools are derived from the inventory on every collection, never stored, so "re-partition" is
automatic; this module says *what* changed so it can be logged and acted upon (a GPU that
vanished since the last collection is reported too: SPEC §4 treats it as lost).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from airflow_hetero_gpu.core.model import Gpu, GpuKey


@dataclass(frozen=True)
class InventoryChange:
    added_hosts: tuple[str, ...] = ()
    removed_hosts: tuple[str, ...] = ()
    added_gpus: tuple[GpuKey, ...] = ()  # on hosts seen before or new
    missing_gpus: tuple[GpuKey, ...] = ()  # seen last time, absent now (host still answering)
    replaced_gpus: tuple[GpuKey, ...] = ()  # same (host, index), another uuid: a card was swapped
    pools_added: tuple[str, ...] = ()
    pools_removed: tuple[str, ...] = ()
    details: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return any((self.added_hosts, self.removed_hosts, self.added_gpus, self.missing_gpus,
                    self.replaced_gpus, self.pools_added, self.pools_removed))

    def lines(self) -> list[str]:
        """Human log lines, one per fact."""
        out = []
        out += [f"new host {h}" for h in self.added_hosts]
        out += [f"host {h} no longer reported" for h in self.removed_hosts]
        out += [f"new GPU {k.host} GPU{k.index}{self.details.get(str(k), '')}" for k in self.added_gpus]
        out += [f"GPU {k.host} GPU{k.index} missing since the last collection" for k in self.missing_gpus]
        out += [f"GPU {k.host} GPU{k.index} replaced{self.details.get(str(k), '')}" for k in self.replaced_gpus]
        out += [f"new pool {p}" for p in self.pools_added]
        out += [f"pool {p} gone" for p in self.pools_removed]
        return out


def diff_inventory(
    old: Iterable[Gpu],
    new: Iterable[Gpu],
    *,
    old_pools: Iterable[str] = (),
    new_pools: Iterable[str] = (),
    unreachable_hosts: Iterable[str] = (),
) -> InventoryChange:
    """Compare two inventories. GPUs of hosts that could not be reached this time are not
    "missing" (their host is, and is reported as unreachable elsewhere)."""
    old_by = {g.key: g for g in old}
    new_by = {g.key: g for g in new}
    down = set(unreachable_hosts)
    old_hosts = {k.host for k in old_by}
    new_hosts = {k.host for k in new_by} | down
    details = {}
    added = sorted(k for k in new_by if k not in old_by)
    for k in added:
        details[str(k)] = f" ({new_by[k].name}, {new_by[k].uuid})"
    missing = sorted(k for k in old_by if k not in new_by and k.host in new_hosts and k.host not in down)
    replaced = sorted(k for k in new_by if k in old_by and old_by[k].uuid != new_by[k].uuid
                      and not new_by[k].uuid.startswith("lost-"))
    for k in replaced:
        details[str(k)] = f" ({old_by[k].uuid} -> {new_by[k].uuid})"
    op, np_ = set(old_pools), set(new_pools)
    return InventoryChange(
        added_hosts=tuple(sorted(new_hosts - old_hosts - down)),
        removed_hosts=tuple(sorted(old_hosts - new_hosts)),
        added_gpus=tuple(added),
        missing_gpus=tuple(missing),
        replaced_gpus=tuple(replaced),
        pools_added=tuple(sorted(np_ - op)),
        pools_removed=tuple(sorted(op - np_)),
        details=details,
    )


def diff_clusters(old, new) -> InventoryChange:
    """:func:`diff_inventory` of two :class:`~airflow_hetero_gpu.core.cluster.Cluster` objects
    (physical GPUs; MIG instances show as pools added or removed)."""
    whole = lambda c: [g for g in c.gpus if g.instance is None]  # noqa: E731
    return diff_inventory(whole(old), whole(new), old_pools=[p.id for p in old.pools],
                          new_pools=[p.id for p in new.pools], unreachable_hosts=new.host_errors)
