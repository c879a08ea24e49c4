"""From a capture directory to the planner's cluster (S1, S2): GPUs with health, wiring, tiers.

Kernel-log Xid lines are *events*, not states: the log keeps every Xid since boot. Which of them
count as a health fact here is an explicit :class:`XidRule`:

* :data:`XIDS_FROM_LEDGER` (readers with a ledger: the operator, the triggers, the health
  watch, ``--ledger`` readers of the stored inventory): no Xid line marks a GPU here; the ledger's
  eviction records carry them (an Xid evicts once, ``uncordon`` and readmission clear it);
* :meth:`XidRule.offline` (a capture directory read without a ledger): a line counts when it was
  logged within ``window_s`` of the capture's time (``thresholds.xid_window_s`` of cluster.yaml,
  ``--xid-window`` on the command line; 0 counts none). A line whose prefix has no wall-clock
  time (plain ``dmesg``: seconds since boot) counts, because it may be recent. docs/health.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Iterable, Sequence

from airflow_hetero_gpu.capture.directory import CaptureSet, HostCapture, read_capture_dir
from airflow_hetero_gpu.capture.slurm import SwitchTopology
from airflow_hetero_gpu.capture.xid import XidEvent, line_time
from airflow_hetero_gpu.core.cluster import Cluster, build_cluster
from airflow_hetero_gpu.core.config import ClusterConfig, load_config
from airflow_hetero_gpu.capture.query import QueryRow
from airflow_hetero_gpu.core.cardtype import mig_card_type
from airflow_hetero_gpu.core.health import GpuFacts, health_reasons
from airflow_hetero_gpu.core.machines import duplicate_hosts, duplicate_line
from airflow_hetero_gpu.core.foreign import host_processes, instance_processes
from airflow_hetero_gpu.core.model import Fabric, Gpu, GpuProcess
from airflow_hetero_gpu.core.topology import HostWiring, NetworkTiers


@dataclass(frozen=True)
class XidRule:
    """Which kernel-log Xid lines of a capture count as health facts (module docstring).

    ``window_s`` ``None`` or 0: none (with a ledger, its evictions carry the Xids); else lines
    logged at most ``window_s`` seconds before the capture's time (``HostCapture.collected_at``)
    count, and so do lines without a wall-clock time.
    """

    window_s: float | None

    @classmethod
    def offline(cls, window_s: float) -> "XidRule":
        if window_s < 0:
            raise ValueError(f"xid window must not be negative, got {window_s:g}")
        return cls(float(window_s))

    def counts(self, event: XidEvent, cap: HostCapture) -> bool:
        if not self.window_s:
            return False
        if cap.collected_at is None:
            return True  # no capture time: nothing to age the line against
        when = line_time(event.text, cap.collected_at)
        if when is None:
            return True  # seconds since boot (plain dmesg): may be recent
        return cap.collected_at - when <= timedelta(seconds=self.window_s)

    def describe(self) -> str:
        if not self.window_s:
            return "Xid lines ignored"
        return f"Xid lines logged within {self.window_s:g} s of the capture count"


#: The rule of every reader that has a ledger: Xid lines are evictions there, not states here.
XIDS_FROM_LEDGER = XidRule(None)


def _health_key(r: QueryRow, host_error: str | None, stale: bool, xids: tuple[int, ...]) -> tuple:
    """Everything :meth:`GpuFacts.from_row` reads of a row, and the host's part: equal keys,
    equal facts, equal reasons."""
    return (r.problems, r.ecc_uncorrected, r.retired_pages_pending, r.temperature_c, r.remapped_rows_failure,
            r.remapped_rows_pending, r.hw_slowdown, r.fabric_state, r.fabric_status, r.fabric_health_summary,
            r.fabric_health_bandwidth, r.name, r.fabric_cluster_uuid, host_error, stale, xids)


def host_gpus(cap: HostCapture, config: ClusterConfig, xid_rule: XidRule | None = None,
              reasons_memo: dict[tuple, tuple[str, ...]] | None = None) -> list[Gpu]:
    """The GPUs of one host with their health (SPEC §4).

    ``xid_rule``: which Xid lines count (default: the offline rule with cluster.yaml's
    ``thresholds.xid_window_s``). ``reasons_memo``: health reasons by facts, shared by the
    hosts of one build under one ``config`` (the GPUs of a fleet have a few hundred distinct
    facts at most: the health rules run once for each).
    """
    th = config.thresholds
    rule = xid_rule if xid_rule is not None else XidRule.offline(th.xid_window_s)
    host_error = cap.error
    rows = cap.query.rows if cap.query else []
    lost = cap.query.lost if cap.query else []
    xids_by_bus: dict[str, list[int]] = {}
    for ev in cap.xid:
        if rule.counts(ev, cap):
            xids_by_bus.setdefault(ev.pci_bus_id, []).append(ev.xid)
    gpus: list[Gpu] = []
    memo = {} if reasons_memo is None else reasons_memo
    stale = cap.stale is not None
    procs = host_processes(cap)
    drained = (f"drained: {cap.drained}",) if cap.drained is not None else ()
    for r in rows:
        xids = tuple(xids_by_bus.get(r.pci_bus_id, ())) if r.pci_bus_id else ()
        key = _health_key(r, host_error, stale, xids)
        reasons = memo.get(key)
        if reasons is None:
            facts = GpuFacts.from_row(r, host_error=host_error, stale=stale, xids=xids)
            reasons = memo[key] = health_reasons(facts, th)
        util = None if r.utilization_pct is None else r.utilization_pct / 100.0
        gpu = Gpu(
            host=cap.host,
            index=r.index,
            uuid=r.uuid or f"{cap.host}-gpu{r.index}",
            name=r.name,
            memory_total_mib=r.memory_total_mib,
            memory_used_mib=r.memory_used_mib,
            utilization=util,
            temperature_c=r.temperature_c,
            power_w=r.power_w,
            pci_bus_id=r.pci_bus_id,
            healthy=not reasons,
            reasons=reasons,
            mig_mode=r.mig_mode_current,
            mig_pending=r.mig_mode_pending,
            unschedulable=_mig_holds(r) + drained,
            fabric=_fabric(r),
            outside=() if _enabled(r.mig_mode_current) else tuple(procs.get(r.uuid or "", ())),
        )
        gpus.append(gpu)
        if _enabled(r.mig_mode_current):
            gpus.extend(mig_instances(cap, gpu, procs.get(r.uuid or "", ())))
    # A GPU nvidia-smi could not open ("Unable to determine the device handle ...") has no row;
    # it takes the lowest index missing from the rows, in the order the messages came.
    if lost:
        taken = {g.index for g in gpus}
        free = (i for i in range(len(gpus) + len(lost)) if i not in taken)
        name = gpus[0].name if len({g.name for g in gpus}) == 1 else "unknown"
        for dev, idx in zip(lost, free):
            facts = GpuFacts(host_error=host_error, lost=True, stale=cap.stale is not None,
                             xids=tuple(xids_by_bus.get(dev.pci_bus_id, ())))
            gpus.append(
                Gpu(host=cap.host, index=idx, uuid=f"lost-{dev.pci_bus_id}", name=name,
                    pci_bus_id=dev.pci_bus_id, healthy=False, reasons=health_reasons(facts, th))
            )
    return gpus


def _enabled(mode: str | None) -> bool:
    return (mode or "").strip().lower() == "enabled"


def _mig_holds(r: QueryRow) -> tuple[str, ...]:
    """Why a GPU is never handed out whole: MIG on (its instances are), a mode change pending."""
    out = []
    if _enabled(r.mig_mode_current):
        out.append("mig-enabled")
    if r.mig_mode_current is not None and r.mig_mode_pending is not None and \
            r.mig_mode_current.strip().lower() != r.mig_mode_pending.strip().lower():
        out.append("mig-mode-change-pending")
    return tuple(out)


def _fabric(r: QueryRow) -> Fabric | None:
    values = (r.fabric_state, r.fabric_status, r.fabric_clique_id, r.fabric_cluster_uuid,
              r.fabric_health_summary, r.fabric_health_bandwidth)
    if all(v is None for v in values):
        return None
    return Fabric(*values, tray_index=r.tray_index)


def _note(cap: HostCapture, text: str) -> None:
    if text not in cap.notes:  # the same captures may be read more than once
        cap.notes.append(text)


def mig_instances(cap: HostCapture, gpu: Gpu, processes: Sequence[GpuProcess] = ()) -> list[Gpu]:
    """The MIG instances of a MIG-enabled GPU (``mig.txt``), as schedulable units of their own
    card type (``<GPU name> MIG <profile>``).

    Memory comes from ``mig-usage.txt`` (the instance's share); utilization, which the driver
    does not report per instance, is 1 when compute processes run on the instance and 0 when
    none do (``None``, counted busy, without ``mig-usage.txt``). Health is the GPU's; a pending
    MIG mode change holds the instances too.
    """
    if cap.mig is None:
        _note(cap, f"GPU {gpu.index} has MIG enabled but no mig.txt lists its instances: none handed out")
        return []
    devices = cap.mig.of(gpu.index)
    listed_uuid = cap.mig.gpus.get(gpu.index)
    if listed_uuid is not None and gpu.uuid and listed_uuid != gpu.uuid:
        _note(cap, f"GPU {gpu.index}: mig.txt lists {listed_uuid}, query.csv {gpu.uuid}: instances not used")
        return []
    out = []
    holds = tuple(h for h in gpu.unschedulable if h != "mig-enabled")
    for dev in devices:
        usage = cap.mig_usage.devices.get((gpu.index, dev.device)) if cap.mig_usage is not None else None
        outside: tuple[GpuProcess, ...] = ()
        if usage is not None and processes:
            outside = instance_processes(cap, gpu.index, usage.gpu_instance, usage.compute_instance, processes)
        if usage is not None:
            busy = bool(cap.mig_usage.processes_on(usage))
            memory_total, memory_used, util = usage.memory_total_mib, usage.memory_used_mib, (1.0 if busy else 0.0)
        else:
            memory_total = memory_used = util = None
        out.append(Gpu(
            host=gpu.host, index=gpu.index, instance=dev.device, uuid=dev.uuid,
            name=mig_card_type(gpu.name, dev.profile), memory_total_mib=memory_total,
            memory_used_mib=memory_used, utilization=util, temperature_c=gpu.temperature_c,
            pci_bus_id=gpu.pci_bus_id, healthy=gpu.healthy, reasons=gpu.reasons,
            mig_profile=dev.profile, gpu_uuid=gpu.uuid, unschedulable=holds, outside=outside,
        ))
    if not devices:
        _note(cap, f"GPU {gpu.index} has MIG enabled and no MIG instances")
    return out


class HostMemo:
    """Each host's GPUs and wiring from one build of a cluster, for the next build of the same
    fleet: a host whose :class:`HostCapture` is the very same object is not read again.

    A reader that keeps the parsed captures of unchanged hosts (the ledger's cache of the stored
    inventory, which a health check changes a part of the hosts at a time) passes one memo to
    every :func:`cluster_from_captures`; the memo forgets everything when the config or the Xid
    rule is another one, and the hosts no longer in the captures.
    """

    def __init__(self) -> None:
        self._under: tuple[ClusterConfig, XidRule | None] | None = None
        self.hosts: dict[str, tuple[HostCapture, list[Gpu], HostWiring | None]] = {}
        self.reasons: dict[tuple, tuple[str, ...]] = {}

    def start(self, config: ClusterConfig, xid_rule: XidRule | None, names: Iterable[str]) -> None:
        if self._under is None or self._under[0] is not config or self._under[1] is not xid_rule:
            self._under, self.hosts, self.reasons = (config, xid_rule), {}, {}
        keep = set(names)
        for name in [n for n in self.hosts if n not in keep]:
            del self.hosts[name]


def cluster_from_captures(captures: CaptureSet, config: ClusterConfig | None = None, *,
                          xid_rule: XidRule | None = None, memo: HostMemo | None = None) -> Cluster:
    """Build the planner's cluster from parsed captures.

    ``xid_rule``: :data:`XIDS_FROM_LEDGER` for readers with a ledger; default the offline rule
    (cluster.yaml's ``thresholds.xid_window_s``) for a capture directory read on its own.
    ``memo``: a :class:`HostMemo` kept between builds (only with a rule that does not depend on
    the time, as :data:`XIDS_FROM_LEDGER`).
    """
    config = config or ClusterConfig()
    gpus: list[Gpu] = []
    wiring: dict[str, HostWiring] = {}
    errors: dict[str, str] = {}
    if memo is not None:
        memo.start(config, xid_rule, captures.hosts)
    reasons_memo: dict[tuple, tuple[str, ...]] = {} if memo is None else memo.reasons
    duplicates = duplicate_hosts({name: [r.uuid for r in cap.query.rows] if cap.query else []
                                  for name, cap in captures.hosts.items()})
    for name, cap in captures.hosts.items():
        if name in duplicates:
            continue  # one machine under two names: its first name has the GPUs
        kept = memo.hosts.get(name) if memo is not None else None
        if kept is not None and kept[0] is cap:
            _cap, host_list, wire = kept
        else:
            host_list = host_gpus(cap, config, xid_rule, reasons_memo)
            wire = None if cap.topo is None else HostWiring.from_links(cap.topo.gpus, cap.topo.links)
            if memo is not None:
                memo.hosts[name] = (cap, host_list, wire)
        gpus.extend(host_list)
        if cap.error is not None:
            errors[name] = cap.error
        if wire is not None:
            wiring[name] = wire
    if captures.switches is None:
        net = NetworkTiers.single_switch()
    else:
        net = network_tiers(captures.switches)
    cluster = build_cluster(gpus, wiring, net, config, errors)
    cluster.host_notes = {n: list(c.notes) + ([c.stale] if c.stale else [])
                          for n, c in captures.hosts.items() if (c.notes or c.stale) and n not in duplicates}
    cluster.duplicates = {host: first for host, (first, _why) in duplicates.items()}
    for host, (first, why) in sorted(duplicates.items()):
        cluster.host_notes.setdefault(first, []).append(duplicate_line(host, first, why))
    for host, note in cluster.host_domain_notes.items():
        cluster.host_notes.setdefault(host, []).append(note)
    return cluster


def network_tiers(switches: SwitchTopology) -> NetworkTiers:
    """Every switch of ``topology.conf`` as a group: (name, tier, hosts under it at any depth)."""
    members: dict[str, set[str]] = {name: set() for name in switches.switches}
    for host in switches.hosts:
        for name in switches.switches_of(host):
            members[name].add(host)
    return NetworkTiers.from_groups(
        (name, sw.tier, members[name]) for name, sw in switches.switches.items()
    )


def load_cluster(captures_dir: str | Path, config_path: str | Path | None = None, *,
                 xid_rule: XidRule | None = None) -> Cluster:
    """Read a capture directory (SPEC §2) and its cluster.yaml (``--config`` overrides it);
    ``xid_rule`` as in :func:`cluster_from_captures`."""
    captures = read_capture_dir(captures_dir)
    if config_path is None and captures.config_path is not None:
        config_path = captures.config_path
    return cluster_from_captures(captures, load_config(config_path), xid_rule=xid_rule)
