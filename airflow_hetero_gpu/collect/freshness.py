"""A fresh enough inventory for planning: the ledger's, with the stale hosts collected again.

The rule (``[hetero_gpu] inventory_max_age``, the operator's ``inventory_max_age``): a host
whose stored outputs are at most ``max_age`` seconds old is planned from the ledger as it is;
a host that is older, or not in the ledger at all, is collected now (and the collection stored,
so the next task reuses it). A host that still has no young enough outputs after that (its
collection failed) is not placed on: its GPUs carry the reason ``stale`` and the plan says
``inventory 312 s old (max 120 s)``. ``max_age=0`` collects every host first.

When nothing at all can be collected and the ledger has nothing young enough either, the error
names every host and why: :class:`CollectionConfigError` when every cause is the setup (a
connection undefined, a host key unknown or changed, a key refused), a mistake no retry can fix;
:class:`NothingCollected` otherwise (hosts down or unreachable: a retry may find them back).
Neither is reported as a shortage of capacity.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Collection

from airflow_hetero_gpu.collect.fleet import Collector
from airflow_hetero_gpu.collect.records import host_records
from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.config import ClusterConfig, config_from_text
from airflow_hetero_gpu.core.inventory import XIDS_FROM_LEDGER, cluster_from_captures
from airflow_hetero_gpu.errors import ConfigError, HeteroGpuError
from airflow_hetero_gpu.ledger.inventory import StoredInventory

DEFAULT_MAX_AGE_S = 300.0

log = logging.getLogger(__name__)


class CollectionConfigError(ConfigError):
    """No host could be collected because of the setup (connections, keys, no hosts)."""


class NothingCollected(HeteroGpuError):
    """No host could be collected, not (only) because of the setup: a retry may help."""


@dataclass
class FreshInventory:
    """The inventory a plan uses, and where it came from."""

    stored: StoredInventory
    max_age: float
    collected: list[str] = field(default_factory=list)  # hosts collected now because they were stale
    failed: dict[str, str] = field(default_factory=dict)  # host -> why collecting it now failed

    def cluster(self, config: ClusterConfig | None = None) -> Cluster:
        """The planner's cluster: ``config`` (else the stored cluster.yaml, else the defaults);
        stale hosts are not placed on; Xid lines are the ledger's evictions' business."""
        if config is None:
            text = self.stored.config_text
            config = config_from_text(text, "ledger inventory file cluster.yaml") if text else ClusterConfig()
        return cluster_from_captures(self.stored.captures(max_age=self.max_age, fresh=self.collected), config,
                                     xid_rule=XIDS_FROM_LEDGER)

    def stale_hosts(self) -> list[str]:
        """Hosts not placed on: older than ``max_age`` (and not collected just now)."""
        ages = self.stored.ages()
        return sorted(h for h, age in ages.items()
                      if (age is None or age > self.max_age) and h not in self.collected)

    def summary(self) -> dict[str, Any]:
        """For the decision's XCom and the task log: which inventory, how old, what was collected."""
        out = self.stored.summary()
        out.update({"max_age_s": None if self.max_age == float("inf") else self.max_age, "collected_now": list(self.collected),
                    "collect_failed": dict(self.failed), "stale": self.stale_hosts()})
        return out

    def describe(self) -> str:
        s = self.summary()
        if s["oldest_s"] is None:
            age = ""
        elif round(s["newest_s"]) == round(s["oldest_s"]):
            age = f", {s['oldest_s']:.0f} s old"
        else:
            age = f", {s['newest_s']:.0f}-{s['oldest_s']:.0f} s old"
        bound = "" if self.max_age == float("inf") else f" (max {self.max_age:g} s)"
        text = f"inventory from the ledger: {s['hosts']} host(s){age}{bound}"
        if self.collected:
            text += f"; collected now: {', '.join(self.collected)}"
        if s["stale"]:
            text += f"; not placed on (too old): {', '.join(s['stale'])}"
        return text


def fresh_inventory(ledger: Any, collector: Collector, hosts: Collection[str], *, max_age: float,
                    collector_name: str, logger: Any = None) -> FreshInventory:
    """The ledger's inventory of ``hosts``, the stale ones collected and stored first."""
    logger = logger or log
    hosts = sorted(set(hosts))
    if not hosts:
        raise CollectionConfigError("no GPU hosts: the fleet's ssh_conn_ids name none")
    stored = ledger.inventory(hosts)
    ages = stored.ages()
    stale = [h for h in hosts if ages.get(h) is None or ages[h] > max_age]
    result = FreshInventory(stored, float(max_age))
    if not stale:
        return result
    logger.info("inventory: collecting %d host(s) whose inventory is missing or older than %g s: %s",
                len(stale), max_age, _short(stale))
    report = collector.collect(stale)
    ledger.store_collection(host_records(report), collector=collector_name, fleet_files=collector.fleet_files(),
                            config=collector.cluster_config())
    result.collected = [h.host for h in report.ok]
    result.failed = {h.host: h.reason or "collection failed" for h in report.failed}
    for h in report.failed:
        logger.warning("GPU host %s: collection failed: %s", h.host, h.reason)
    for h in report.duplicates:  # one machine under two names: counted once
        logger.warning("GPU host %s: %s", h.host, h.reason if not h.ok else h.warnings[-1])
    result.stored = ledger.inventory(hosts)
    if report.failed and not report.ok and len(result.stale_hosts()) == len(hosts):
        why = "no GPU host could be collected: " + "; ".join(f"{h.host}: {h.reason}" for h in report.failed)
        raise (CollectionConfigError if all(h.config_error for h in report.failed) else NothingCollected)(why)
    return result


def _short(names: list[str], limit: int = 10) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
