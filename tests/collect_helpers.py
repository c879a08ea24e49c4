"""Helpers of the collection tests: a mixed fleet, Airflow ssh connections for emulated hosts,
and the inventory a host's state implies."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import pytest

from airflow_hetero_gpu.capture.busid import normalize_bus_id
from airflow_hetero_gpu.collect.ssh import paramiko_client_factory
from airflow_hetero_gpu.testing.demo import (
    A100_80,
    DGX1_BUS,
    H200,
    HGX_A100_BUS,
    HGX_H200_BUS,
    RTX4090_4GPU_TOPOLOGY,
    RTX_4090,
    RTX_BOX_BUS,
    V100_32,
    make_gpus,
)
from airflow_hetero_gpu.testing.airflow_env import airflow_connection, host_public_key  # noqa: F401
from airflow_hetero_gpu.testing.state import HostSpec

A100_SAMPLE = {"sample": "8x-a100-sxm-nv12-4nic-hgx-2numa"}
V100_SAMPLE = {"sample": "dgx1-like-8x-v100-sxm2-hybrid-cube-mesh-1nic"}
H200_SAMPLE = {"sample": "hgx-h200-8gpu-nv18-10nic-ansi"}

#: (host, GPU index) -> the reasons the fleet's faults must give (every other GPU is healthy).
FLEET_UNHEALTHY = {
    ("a100-1", 7): ("lost",),                   # "Unable to determine the device handle"
    ("a100-2", 3): ("ecc",),                    # 2 uncorrectable volatile ECC errors
    ("v100-1", 6): ("retired-pages-pending",),
    ("rtx-2", 1): ("temperature",),             # 95 C >= 90 C
    ("h200-1", 5): ("xid-79",),                 # fell off the bus, in the kernel log
    ("h200-2", 2): ("lost",),                   # temperature.gpu reads [Unknown Error]
}


def mixed_fleet() -> list[HostSpec]:
    """Eight hosts of four card types (A100, V100, RTX 4090, H200), some loaded, six sick GPUs."""
    a100_1 = make_gpus("a100-1", A100_80, HGX_A100_BUS)
    a100_1[7].lost = True
    a100_2 = make_gpus("a100-2", A100_80, HGX_A100_BUS, load=[97, 95, 0, 0, 12, 0, 0, 60])
    a100_2[3].ecc_uncorrected_volatile = 2
    v100_1 = make_gpus("v100-1", V100_32, DGX1_BUS)
    v100_1[6].retired_pages_pending = True
    v100_2 = make_gpus("v100-2", V100_32, DGX1_BUS, load=[50, 50, 0, 0, 0, 0, 0, 0])
    rtx_1 = make_gpus("rtx-1", RTX_4090, RTX_BOX_BUS, load=[0, 35, 0, 0])
    rtx_2 = make_gpus("rtx-2", RTX_4090, RTX_BOX_BUS, temps=[40, 95, 41, 39])
    h200_1 = make_gpus("h200-1", H200, HGX_H200_BUS)
    h200_2 = make_gpus("h200-2", H200, HGX_H200_BUS, load=[0, 0, 0, 0, 0, 0, 99, 99])
    h200_2[2].overrides = {"temperature.gpu": "[Unknown Error]"}
    return [
        HostSpec("a100-1", a100_1, dict(A100_SAMPLE)),
        HostSpec("a100-2", a100_2, dict(A100_SAMPLE)),
        HostSpec("v100-1", v100_1, dict(V100_SAMPLE), driver_version="580.173.02"),
        HostSpec("v100-2", v100_2, dict(V100_SAMPLE), driver_version="580.173.02"),
        HostSpec("rtx-1", rtx_1, dict(RTX4090_4GPU_TOPOLOGY), driver_version="550.127.05"),
        HostSpec("rtx-2", rtx_2, dict(RTX4090_4GPU_TOPOLOGY), driver_version="550.127.05"),
        HostSpec("h200-1", h200_1, dict(H200_SAMPLE), driver_version="570.133.20",
                 xid=[{"time": 5123.25, "gpu": 5, "xid": 79, "pid": None, "name": None}]),
        HostSpec("h200-2", h200_2, dict(H200_SAMPLE), driver_version="570.133.20"),
    ]


def expected_inventory(host: str, state: Mapping[str, Any],
                       unhealthy: Mapping[tuple[str, int], tuple[str, ...]]) -> list[dict[str, Any]]:
    """The inventory rows (SPEC section 4 fields) a host's state must produce, by index."""
    rows = []
    for gpu in sorted(state["gpus"], key=lambda g: g["index"]):
        lost = bool(gpu.get("lost"))
        overrides = gpu.get("overrides") or {}
        util = gpu.get("utilization_gpu")
        reasons = tuple(unhealthy.get((host, gpu["index"]), ()))
        rows.append({
            "host": host,
            "index": gpu["index"],
            "uuid": f"lost-{normalize_bus_id(gpu['pci_bus_id'])}" if lost else gpu["uuid"],
            "name": gpu["name"],
            "memory_total_mib": None if lost else float(gpu["memory_total_mib"]),
            "memory_used_mib": None if lost else float(gpu["memory_used_mib"]),
            "utilization": None if lost or util is None else util / 100,
            "temperature_c": None if lost or "temperature.gpu" in overrides else float(gpu["temperature_c"]),
            "healthy": not reasons,
            "reasons": list(reasons),
        })
    return rows


def actual_inventory(cluster, host: str) -> list[dict[str, Any]]:
    keys = ("host", "index", "uuid", "name", "memory_total_mib", "memory_used_mib", "utilization",
            "temperature_c", "healthy", "reasons")
    return [{k: g.to_json()[k] for k in keys} for g in cluster.gpus if g.host == host]


def paramiko_factory(cluster):
    return paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)


def conn_id_of(name: str) -> str:
    return "gpu_" + name.replace("-", "_")


def set_airflow_connections(monkeypatch: pytest.MonkeyPatch, cluster, names: Iterable[str] | None = None,
                            ) -> dict[str, str]:
    """Define ``AIRFLOW_CONN_GPU_<HOST>`` for the cluster's hosts; returns label -> conn id."""
    out = {}
    for host in cluster.hosts if names is None else [cluster.host(n) for n in names]:
        conn_id = conn_id_of(host.name)
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(cluster, host.name))
        out[host.name] = conn_id
    return out
