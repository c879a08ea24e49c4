"""The MIG readers on real outputs: ``nvidia-smi -L`` (mig.txt), the plain table (mig-usage.txt),
the MIG and fabric fields of ``--query-gpu``, and the inventory's MIG instances built from them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from airflow_hetero_gpu.capture.directory import read_capture_dir
from airflow_hetero_gpu.capture.mig import MigDevice, MigProcess, MigUsageRow, parse_mig_list, parse_mig_usage
from airflow_hetero_gpu.capture.query import parse_query_csv
from airflow_hetero_gpu.core.inventory import load_cluster
from airflow_hetero_gpu.errors import CaptureError

MIG = Path(__file__).resolve().parent / "data" / "mig"
FABRIC = Path(__file__).resolve().parent / "data" / "fabric"
Z = "0000-0000-0000-0000000000"  # the masked tail of the samples' UUIDs

# file, expected MIG devices of GPU 0: (device, profile, uuid)
LISTINGS = [
    ("L-h100-mig-4-instances.txt", [(0, "3g.40gb", "MIG-00000000-" + Z + "00"), (1, "2g.20gb", "MIG-00000001-0000-0000-0000-000000000001"),
                                    (2, "1g.10gb", "MIG-00000002-0000-0000-0000-000000000002"),
                                    (3, "1g.10gb", "MIG-00000003-0000-0000-0000-000000000003")]),
    ("L-h200-mig.txt", [(0, "1c.3g.71gb", "MIG-00000000-" + Z + "00"), (1, "2c.3g.71gb", "MIG-00000001-0000-0000-0000-000000000001"),
                        (2, "2g.35gb", "MIG-00000002-0000-0000-0000-000000000002"),
                        (3, "1g.18gb", "MIG-00000003-0000-0000-0000-000000000003"),
                        (4, "1g.18gb", "MIG-00000004-0000-0000-0000-000000000004")]),
    ("L-a100-sxm4-80gb-mig-7x-1g.10gb.txt", [(0, "1g.10gb", "MIG-feb88891-0321-5fef-9c87-d4af3b54259e"),
                                             (1, "1g.10gb", "MIG-a25704ba-3a06-5299-a795-fd7cf4d13973"),
                                             (2, "1g.10gb", "MIG-50f1c4c9-1508-5e8d-bb06-d08145b22e01"),
                                             (3, "1g.10gb", "MIG-36c795f2-5cf7-55d6-af30-e535e79b7bb6"),
                                             (4, "1g.10gb", "MIG-3f45d38c-8cee-503e-b806-a1f1bdceedeb"),
                                             (5, "1g.10gb", "MIG-96655de9-9525-58f9-a62b-0e4c1cc1c265"),
                                             (6, "1g.10gb", "MIG-1aae4990-b962-574e-8375-119d6d9b9687")]),
]


@pytest.mark.parametrize("name, expected", LISTINGS)
def test_real_mig_listings(name, expected):
    listing = parse_mig_list((MIG / name).read_text(), name)
    assert list(listing.gpus) == [0]
    assert [(d.device, d.profile, d.uuid) for d in listing.of(0)] == expected
    assert all(d.gpu_index == 0 and d.line == d.device + 2 for d in listing.of(0))


def test_an_old_driver_mig_uuid_and_a_lost_gpu_line():
    text = ("GPU 0: A100-SXM4-40GB (UUID: GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f)\n"
            "  MIG 3g.20gb Device 0: (UUID: MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/1/0)\n"
            "Unable to determine the device handle for GPU 0000:47:00.0: Unknown Error\n")
    listing = parse_mig_list(text, "mig.txt")
    assert listing.of(0) == [MigDevice(0, 0, "3g.20gb", "MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/1/0", 2)]


@pytest.mark.parametrize("text, line, fragment", [
    ("GPU 0: X (UUID: GPU-1)\n  MIG 3g.40gb Device 0: (UUID: GPU-1)\n", 2, "cannot read this MIG device line"),
    ("  MIG 3g.40gb     Device  0: (UUID: MIG-1)\n", 1, "before any GPU line"),
    ("GPU 0: X (UUID: GPU-1)\n  MIG 1g.10gb Device 0: (UUID: MIG-1)\n  MIG 1g.10gb Device 0: (UUID: MIG-2)\n", 3,
     "twice"),
    ("index, name\n0, NVIDIA A100\n", 1, "not nvidia-smi -L output"),
])
def test_bad_listings_are_one_line_errors(text, line, fragment):
    with pytest.raises(CaptureError) as info:
        parse_mig_list(text, "hosts/h/mig.txt")
    assert str(info.value).startswith(f"hosts/h/mig.txt:{line}: ") and fragment in str(info.value)


def test_an_empty_listing_is_an_error():
    with pytest.raises(CaptureError, match="no GPU lines"):
        parse_mig_list("\n", "mig.txt")


def test_real_tables_give_each_mig_device_its_memory_and_processes():
    idle = parse_mig_usage((MIG / "table-h100-mig-4-instances-idle.txt").read_text(), "t")
    assert idle.devices == {
        (0, 0): MigUsageRow(0, 2, 0, 0, 26, 40448), (0, 1): MigUsageRow(0, 3, 0, 1, 17, 20096),
        (0, 2): MigUsageRow(0, 9, 0, 2, 9, 9984), (0, 3): MigUsageRow(0, 10, 0, 3, 9, 9984)}
    assert idle.processes == []
    load = parse_mig_usage((MIG / "table-h200-mig-load.txt").read_text(), "t")
    assert [load.devices[(0, d)].memory_total_mib for d in range(5)] == [71424, 71424, 33280, 16384, 16384]
    assert [p.pid for p in load.processes_on(load.devices[(0, 1)])] == [12249, 12250, 12267]
    assert load.processes_on(load.devices[(0, 0)]) == []  # GI 2 CI 0: the other compute instance
    plain = parse_mig_usage((MIG / "table-h100-80gb-hbm3-load.txt").read_text(), "t")
    assert plain.devices == {} and plain.processes[0] == MigProcess(0, None, None, 11327, "C")


def test_a_table_that_is_not_one_is_an_error():
    with pytest.raises(CaptureError, match="not the nvidia-smi table"):
        parse_mig_usage("GPU 0: X (UUID: GPU-1)\n", "hosts/h/mig-usage.txt")
    bad = (MIG / "table-h100-mig-4-instances-idle.txt").read_text().replace("26MiB / 40448MiB", "26MiB of 40448MiB")
    with pytest.raises(CaptureError, match=r"mig-usage.txt:21: cannot read this MIG device row"):
        parse_mig_usage(bad, "hosts/h/mig-usage.txt")


def test_query_fields_of_real_rows():
    mig = parse_query_csv((MIG / "query-gpu-allfields-h100-mig-enabled-idle.csv").read_text(), "q").rows[0]
    assert (mig.mig_mode_current, mig.mig_mode_pending, mig.utilization_pct) == ("Enabled", "Enabled", None)
    hgx = parse_query_csv((FABRIC / "query-gpu-allfields-h100-80gb-hbm3-idle.csv").read_text(), "q").rows[0]
    assert (hgx.fabric_state, hgx.fabric_status, hgx.fabric_clique_id, hgx.fabric_cluster_uuid,
            hgx.fabric_health_summary, hgx.fabric_health_bandwidth, hgx.tray_index, hgx.mig_mode_current) == (
        "Completed", "Success", 0, "00000000-0000-0000-0000-000000000000", None, None, 0, "Disabled")
    pcie = parse_query_csv((FABRIC / "query-gpu-allfields-l40s-load.csv").read_text(), "q").rows[0]
    assert (pcie.fabric_state, pcie.fabric_clique_id, pcie.mig_mode_current) == (None, None, None)


def _real_mig_host(root: Path, table: str, listing: str) -> Path:
    d = root / "hosts" / "h100"
    d.mkdir(parents=True)
    shutil.copy(MIG / "query-gpu-allfields-h100-mig-enabled-idle.csv", d / "query.csv")
    shutil.copy(MIG / listing, d / "mig.txt")
    if table:
        shutil.copy(MIG / table, d / "mig-usage.txt")
    return root


def test_the_inventory_of_a_real_mig_gpu(tmp_path):
    cluster = load_cluster(_real_mig_host(tmp_path, "table-h100-mig-4-instances-idle.txt", "L-h100-mig-4-instances.txt"))
    gpu, *instances = cluster.gpus
    assert (gpu.key, gpu.unschedulable, gpu.healthy, gpu.utilization) == (("h100", 0), ("mig-enabled",), True, None)
    assert [(i.key, i.name, i.memory_total_mib, i.memory_used_mib, i.utilization, i.uuid[:12]) for i in instances] == [
        (("h100", 0, 0), "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40448, 26, 0.0, "MIG-00000000"),
        (("h100", 0, 1), "NVIDIA H100 80GB HBM3 MIG 2g.20gb", 20096, 17, 0.0, "MIG-00000001"),
        (("h100", 0, 2), "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9984, 9, 0.0, "MIG-00000002"),
        (("h100", 0, 3), "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9984, 9, 0.0, "MIG-00000003"),
    ]
    assert all(i.gpu_uuid == gpu.uuid and i.unschedulable == () for i in instances)
    assert sorted(p.id for p in cluster.pools) == ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
                                                    "NVIDIA H100 80GB HBM3 MIG 2g.20gb",
                                                    "NVIDIA H100 80GB HBM3 MIG 3g.40gb"]
    assert cluster.instances_of[gpu.key] == [i.key for i in instances]


def test_instances_without_the_table_count_busy(tmp_path):
    cluster = load_cluster(_real_mig_host(tmp_path, "", "L-h100-mig-4-instances.txt"))
    assert [g.utilization for g in cluster.gpus[1:]] == [None] * 4
    assert (cluster.base_load[1:] == 1.0).all()  # unknown utilization: not idle


def test_a_listing_that_is_not_this_gpus_is_not_used(tmp_path):
    root = _real_mig_host(tmp_path, "table-h100-mig-4-instances-idle.txt", "L-a100-sxm4-80gb-mig-7x-1g.10gb.txt")
    captures = read_capture_dir(root)
    cluster = load_cluster(root)
    assert [g.key for g in cluster.gpus] == [("h100", 0)]
    assert any("mig.txt lists GPU-7fdaf0a5" in note for note in cluster.host_notes["h100"])
    assert captures.hosts["h100"].mig is not None


def _q_mig_devices(text: str) -> tuple[dict[int, tuple[int, int, float]], list[tuple[int, int]]]:
    """From a real ``nvidia-smi -q``: per MIG device Index its (GI, CI, FB total MiB), and the
    (GI, CI) of every process — read here only to check the table reader's numbering."""
    devices, procs, current, section = {}, [], None, None
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if line.strip() == "MIG Device":
            current, section = {}, "mig"
        elif line.strip() == "Processes":
            section = "procs"
        elif section == "mig" and current is not None:
            if key in ("Index", "GPU Instance ID", "Compute Instance ID"):
                current[key] = int(value)
            elif key == "Total" and "total" not in current:
                current["total"] = float(value.split()[0])
                devices[current["Index"]] = (current["GPU Instance ID"], current["Compute Instance ID"], current["total"])
        elif section == "procs" and key == "GPU instance ID":
            procs.append([int(value)])
        elif section == "procs" and key == "Compute instance ID":
            procs[-1].append(int(value))
    return devices, [tuple(p) for p in procs]


def test_the_table_numbers_mig_devices_as_q_and_L_do():
    """The same H100 in three outputs: -q's MIG Device Index, the table's MIG Dev and -L's
    Device N name the same device (same GPU instance, compute instance and memory)."""
    devices, processes = _q_mig_devices((MIG / "q-h100-mig-enabled-load.txt").read_text())
    table = parse_mig_usage((MIG / "table-h100-mig-4-instances-idle.txt").read_text(), "t")
    listing = parse_mig_list((MIG / "L-h100-mig-4-instances.txt").read_text(), "l")
    assert {d: (r.gpu_instance, r.compute_instance, r.memory_total_mib) for (g, d), r in table.devices.items()} == devices
    assert [d.device for d in listing.of(0)] == sorted(devices)
    assert [d.profile for d in listing.of(0)] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    # under load, -q shows three processes on GI 2, CI 0: MIG device 0, the 3g.40gb
    assert processes == [(2, 0)] * 3
    assert [d for d, (gi, ci, _) in devices.items() if (gi, ci) == (2, 0)] == [0]
