"""From a capture directory to the planner's cluster (S1, S2): GPUs with health, wiring, tiers."""

from __future__ import annotations

from pathlib import Path

from airflow_hetero_gpu.capture.directory import CaptureSet, HostCapture, read_capture_dir
from airflow_hetero_gpu.capture.slurm import SwitchTopology
from airflow_hetero_gpu.core.cluster import Cluster, build_cluster
from airflow_hetero_gpu.core.config import ClusterConfig, load_config
from airflow_hetero_gpu.core.health import GpuFacts, health_reasons
from airflow_hetero_gpu.core.model import Gpu
from airflow_hetero_gpu.core.topology import HostWiring, NetworkTiers


def host_gpus(cap: HostCapture, config: ClusterConfig) -> list[Gpu]:
    """The GPUs of one host with their health (SPEC §4)."""
    th = config.thresholds
    host_error = cap.error
    rows = cap.query.rows if cap.query else []
    lost = cap.query.lost if cap.query else []
    xids_by_bus: dict[str, list[int]] = {}
    for ev in cap.xid:
        xids_by_bus.setdefault(ev.pci_bus_id, []).append(ev.xid)
    gpus: list[Gpu] = []
    for r in rows:
        facts = GpuFacts.from_row(r, host_error=host_error, stale=cap.stale is not None,
                                  xids=xids_by_bus.get(r.pci_bus_id, ()) if r.pci_bus_id else ())
        reasons = health_reasons(facts, th)
        util = None if r.utilization_pct is None else r.utilization_pct / 100.0
        gpus.append(
            Gpu(
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
            )
        )
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


def cluster_from_captures(captures: CaptureSet, config: ClusterConfig | None = None) -> Cluster:
    """Build the planner's cluster from parsed captures."""
    config = config or ClusterConfig()
    gpus: list[Gpu] = []
    wiring: dict[str, HostWiring] = {}
    errors: dict[str, str] = {}
    for name, cap in captures.hosts.items():
        gpus.extend(host_gpus(cap, config))
        if cap.error is not None:
            errors[name] = cap.error
        if cap.topo is not None:
            wiring[name] = HostWiring.from_links(cap.topo.gpus, cap.topo.links)
    if captures.switches is None:
        net = NetworkTiers.single_switch()
    else:
        net = network_tiers(captures.switches)
    cluster = build_cluster(gpus, wiring, net, config, errors)
    cluster.host_notes = {n: list(c.notes) + ([c.stale] if c.stale else [])
                          for n, c in captures.hosts.items() if c.notes or c.stale}
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


def load_cluster(captures_dir: str | Path, config_path: str | Path | None = None) -> Cluster:
    """Read a capture directory (SPEC §2) and its cluster.yaml (``--config`` overrides it)."""
    captures = read_capture_dir(captures_dir)
    if config_path is None and captures.config_path is not None:
        config_path = captures.config_path
    return cluster_from_captures(captures, load_config(config_path))
