"""The emulated nvidia-smi prints what the real one prints, checked against real outputs.

The main checks read the copies in tests/data/emulated/; the extra ones read the project's full
collection of real outputs (tests/data/real, or $HETERO_GPU_SHARED_DATA) and skip without it.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_hetero_gpu.testing import nvsmi
from airflow_hetero_gpu.testing.demo import A100_80, make_gpus
from airflow_hetero_gpu.testing.fake_tools import nvidia_smi, write_tool_scripts
from airflow_hetero_gpu.testing.state import HostSpec, write_state
from shared_data import shared_data

HERE = Path(__file__).resolve().parent
LOCAL = HERE / "data" / "emulated"
SHARED = shared_data()
SHARED_SMI = SHARED / "nvidia-smi"
needs_shared = pytest.mark.skipif(
    not SHARED_SMI.is_dir(), reason=f"shared real-output collection not found at {SHARED_SMI} "
    "(set HETERO_GPU_SHARED_DATA); the local copies are checked regardless")

COLLECT_FIELDS = ("index,uuid,name,pci.bus_id,memory.total,memory.used,utilization.gpu,temperature.gpu,"
                  "power.draw,power.limit,ecc.errors.uncorrected.volatile.total,retired_pages.pending")


def csv_cells(path: Path) -> tuple[list[str], list[list[str]]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return lines[0].split(", "), [line.split(", ") for line in lines[1:]]


def host_state(gpus: list[dict], **extra) -> dict:
    state = {"hostname": "h", "driver_version": "535.183.01", "gpus": gpus,
             "topology": {"matrix": [["X"]]}, "faults": []}
    state.update(extra)
    return state


def run_fake(state: dict, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = nvidia_smi(list(argv), state, out, err)
    return rc, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------------------------------------
# --query-gpu against real CSVs (local copies)
# ---------------------------------------------------------------------------------------------


def test_a800_query_is_reproduced_byte_for_byte():
    """index,name,memory.total,memory.free,driver_version,compute_cap on 8x A800 (driver 580)."""
    sample = LOCAL / "query-gpu-8x-a800-index-name-memtotal-memfree-driver-cc.csv"
    _, rows = csv_cells(sample)
    gpus = []
    for index, name, total, free, _driver, cap in rows:
        total_mib, free_mib = int(total.split()[0]), int(free.split()[0])
        gpus.append({"index": int(index), "name": name, "memory_total_mib": total_mib,
                     "memory_used_mib": total_mib - free_mib, "pci_bus_id": "00000000:07:00.0",
                     "compute_cap": cap})
    state = host_state(gpus, driver_version=rows[0][4])
    rc, out, _ = run_fake(state, "--query-gpu=index,name,memory.total,memory.free,driver_version,compute_cap",
                          "--format=csv")
    assert rc == 0
    assert out == sample.read_text(encoding="utf-8")


H100_ROW_FIELDS = {
    # real header cell -> GPU state key the emulation reads it from
    "index": "index", "name": "name", "uuid": "uuid", "serial": "serial", "pci.bus_id": "pci_bus_id",
    "memory.total [MiB]": "memory_total_mib", "memory.used [MiB]": "memory_used_mib",
    "memory.reserved [MiB]": "memory_reserved_mib", "utilization.gpu [%]": "utilization_gpu",
    "utilization.memory [%]": "utilization_memory", "temperature.gpu": "temperature_c",
    "temperature.memory": "temperature_memory_c", "power.draw [W]": "power_draw_w",
    "power.limit [W]": "power_limit_w", "ecc.errors.uncorrected.volatile.total": "ecc_uncorrected_volatile",
    "retired_pages.pending": "retired_pages_pending", "pstate": "pstate", "compute_cap": "compute_cap",
    "fan.speed [%]": "fan_speed", "clocks.max.sm [MHz]": "clock_sm_max_mhz",
    "vbios_version": "vbios_version",
}


TEXT_KEYS = {"name", "uuid", "serial", "pci_bus_id", "pstate", "compute_cap", "vbios_version"}


def _state_value(key: str, cell: str):
    """Real cell text -> the state value that should print it back."""
    if cell == "[N/A]":
        return None
    if key in TEXT_KEYS:
        return cell
    number = cell.split(" ")[0]
    for kind in (int, float):
        try:
            return kind(number)
        except ValueError:
            pass
    return cell


def test_h100_allfields_cells_have_the_real_shape():
    """Units, decimals, [N/A] and bus-id form of every modelled field match a real H100 row."""
    header, rows = csv_cells(LOCAL / "query-gpu-allfields-h100-80gb-hbm3-load.csv")
    real = dict(zip(header, rows[0]))
    gpu = {"index": 0, "name": "x", "memory_total_mib": 1, "pci_bus_id": "00000000:00:00.0"}
    for cell, key in H100_ROW_FIELDS.items():
        gpu[key] = _state_value(key, real[cell])
    fields = [c.split(" [")[0] for c in H100_ROW_FIELDS]
    rc, out, _ = run_fake(host_state([gpu]), "--query-gpu=" + ",".join(fields), "--format=csv")
    assert rc == 0
    got_header, got_row = out.splitlines()
    assert got_header == ", ".join(H100_ROW_FIELDS)
    assert dict(zip(H100_ROW_FIELDS, got_row.split(", "))) == {c: real[c] for c in H100_ROW_FIELDS}


def test_collector_field_header_equals_the_real_header_subset():
    header, _ = csv_cells(LOCAL / "query-gpu-allfields-h100-80gb-hbm3-load.csv")
    by_name = {cell.split(" [")[0]: cell for cell in header}
    expected = ", ".join(by_name[f] for f in COLLECT_FIELDS.split(","))
    assert nvsmi.header_line(COLLECT_FIELDS.split(",")) == expected


def test_every_real_field_is_accepted_with_its_real_unit():
    header, _ = csv_cells(LOCAL / "query-gpu-allfields-h100-80gb-hbm3-load.csv")
    names = [cell.split(" [")[0] for cell in header]
    assert nvsmi.header_line([nvsmi.canonical_field(n) for n in names]) == ", ".join(header)


@pytest.mark.parametrize("fmt, expected", [
    ("csv", ["index, memory.total [MiB], utilization.gpu [%], power.draw [W], temperature.gpu",
             "0, 81920 MiB, 35 %, 250.00 W, 41"]),
    ("csv,noheader", ["0, 81920 MiB, 35 %, 250.00 W, 41"]),
    ("csv,nounits", ["index, memory.total [MiB], utilization.gpu [%], power.draw [W], temperature.gpu",
                     "0, 81920, 35, 250.00, 41"]),
    ("csv,noheader,nounits", ["0, 81920, 35, 250.00, 41"]),
])
def test_format_options(fmt, expected):
    gpu = {"index": 0, "name": "n", "memory_total_mib": 81920, "pci_bus_id": "00000000:07:00.0",
           "utilization_gpu": 35, "power_draw_w": 250, "temperature_c": 41}
    rc, out, _ = run_fake(host_state([gpu]), "--query-gpu=index,memory.total,utilization.gpu,power.draw,"
                          "temperature.gpu", f"--format={fmt}")
    assert (rc, out.splitlines()) == (0, expected)


@pytest.mark.parametrize("value, units, expected", [
    (None, True, "[N/A]"),      # [N/A] never carries a unit
    (None, False, "[N/A]"),
    (0, True, "0 %"),
])
def test_na_and_units(value, units, expected):
    gpu = {"index": 0, "name": "n", "memory_total_mib": 1, "pci_bus_id": "00000000:07:00.0",
           "utilization_gpu": value}
    assert nvsmi.value_text({}, gpu, "utilization.gpu", units) == expected


@pytest.mark.parametrize("alias, header", [
    ("gpu_name", "name"), ("gpu_bus_id", "pci.bus_id"), ("gpu_uuid", "uuid"),
    ("clocks.gr", "clocks.current.graphics [MHz]"), ("clocks.mem", "clocks.current.memory [MHz]"),
])
def test_aliases_are_echoed_under_the_canonical_name(alias, header):
    rc, out, _ = run_fake(host_state([{"index": 0, "name": "n", "memory_total_mib": 1,
                                       "pci_bus_id": "00000000:07:00.0"}]),
                          f"--query-gpu={alias}", "--format=csv")
    assert rc == 0 and out.splitlines()[0] == header


@pytest.mark.parametrize("argv, rc, stdout", [
    (["--query-gpu=index,foo", "--format=csv"], 2, 'Field "foo" is not a valid field to query.\n\n'),
    (["--query-gpu=index", "--format=json"], 2, nvsmi.INVALID_ARGS + "\n\n"),
    (["--query-gpu=index"], 2, nvsmi.INVALID_ARGS + "\n\n"),
    (["--bogus"], 2, nvsmi.INVALID_ARGS + "\n\n"),
])
def test_refused_arguments(argv, rc, stdout):
    assert run_fake(host_state([]), *argv)[:2] == (rc, stdout)


def test_lost_gpu_prints_the_real_line_first_and_keeps_the_others():
    gpus = [g.to_state() for g in make_gpus("h", A100_80, ["07", "0B", "47"])]
    gpus[1]["lost"] = True
    rc, out, _ = run_fake(host_state(gpus), "--query-gpu=index,pci.bus_id", "--format=csv")
    assert rc == nvsmi.RC_OTHER
    assert out.splitlines() == [
        "Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error",
        "index, pci.bus_id", "0, 00000000:07:00.0", "2, 00000000:47:00.0",
    ]


def test_list_gpus_format():
    gpu = {"index": 0, "name": "NVIDIA H200", "memory_total_mib": 1, "pci_bus_id": "00000000:07:00.0",
           "uuid": "GPU-00000000-0000-0000-0000-000000000000"}
    assert run_fake(host_state([gpu]), "-L") == (
        0, "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n", "")


@pytest.mark.parametrize("fault, rc, stdout", [
    ("driver_gone", 9, nvsmi.DRIVER_NOT_LOADED + "\n\n"),
    ("no_devices", 6, "No devices were found\n"),
])
@pytest.mark.parametrize("argv", [["--query-gpu=index", "--format=csv"], ["topo", "-m"], ["-L"]])
def test_host_faults(fault, rc, stdout, argv):
    gpus = [g.to_state() for g in make_gpus("h", A100_80, ["07"])]
    assert run_fake(host_state(gpus, faults=[fault]), *argv)[:2] == (rc, stdout)


# ---------------------------------------------------------------------------------------------
# topo -m
# ---------------------------------------------------------------------------------------------


def parse_topo(text: str) -> dict:
    """A topology dict for render_topo() from a real tab-separated sample (NICs included)."""
    lines = text.replace(nvsmi.ANSI_UNDERLINE, "").replace(nvsmi.ANSI_RESET, "").split("\n")
    head = lines[0].split("\t")[1:]
    n = sum(1 for c in head if c.startswith("GPU") and c[3:].isdigit())
    k = sum(1 for c in head if c.startswith("NIC"))
    rows = [line.split("\t") for line in lines[1:1 + n + k]]
    topo = {
        "matrix": [[c.strip() for c in r[1:1 + n]] for r in rows[:n]],
        "cpu_affinity": [r[1 + n + k] for r in rows[:n]],
        "numa_affinity": [r[2 + n + k] for r in rows[:n]],
        "gpu_numa_id": [r[-1] for r in rows[:n]],
        "gpu_numa_id_column": "GPU NUMA ID" in head,
        "ansi_header": nvsmi.ANSI_UNDERLINE in text,
    }
    legend = {line.split(":")[0].strip(): line.split(":")[1].strip()
              for line in lines if line.startswith("  NIC")}
    topo["nics"] = [{"name": legend[f"NIC{j}"], "links": [c.strip() for c in rows[n + j][1:1 + n + k]]}
                    for j in range(k)]
    return topo


def test_generated_topo_equals_a_real_single_gpu_sample():
    sample = (LOCAL / "1x-l40s-ansi-underline-header.txt").read_text(encoding="utf-8")
    assert nvsmi.render_topo(parse_topo(sample)) == sample


def test_generated_topo_equals_the_real_hgx_h200_sample_with_nics():
    sample = nvsmi.read_sample("hgx-h200-8gpu-nv18-10nic-ansi")
    assert nvsmi.render_topo(parse_topo(sample)) == sample


def test_named_sample_is_printed_verbatim():
    state = host_state([], topology={"sample": "8x-a100-sxm-nv12-4nic-hgx-2numa"})
    state["gpus"] = [g.to_state() for g in make_gpus("h", A100_80, ["07"])]
    assert run_fake(state, "topo", "-m")[1] == nvsmi.read_sample("8x-a100-sxm-nv12-4nic-hgx-2numa")


@pytest.mark.parametrize("matrix, message", [
    ([["X", "NV1"], ["NV2", "X"]], "not symmetric"),
    ([["X", "NV1"], ["NV1", "NV1"]], "diagonal"),
    ([["X", "QPI"], ["QPI", "X"]], "not a link label"),
    ([["X", "NV1"]], "row 0 has 2 cells"),
])
def test_bad_generated_matrix_is_refused(matrix, message):
    with pytest.raises(ValueError, match=message):
        nvsmi.render_topo({"matrix": matrix})


# ---------------------------------------------------------------------------------------------
# Kernel log
# ---------------------------------------------------------------------------------------------


def test_xid_lines_have_the_kernel_format():
    gpus = [g.to_state() for g in make_gpus("h", A100_80, ["3B"])]
    state = host_state(gpus, xid=[{"time": 1234.56789, "gpu": 0, "xid": 79, "pid": 1234, "name": "python3"}])
    assert nvsmi.dmesg_text(state).splitlines()[-1] == (
        "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.")
    journal = nvsmi.journal_text(state, "NVRM: Xid").splitlines()
    assert len(journal) == 1 and journal[0].endswith(
        " h kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.")


# ---------------------------------------------------------------------------------------------
# The installed scripts (a real process, as sshd runs it)
# ---------------------------------------------------------------------------------------------


def test_scripts_run_in_a_clean_environment(tmp_path):
    spec = HostSpec("box", make_gpus("box", A100_80, ["07", "0F"]), {"matrix": [["X", "NV12"], ["NV12", "X"]]})
    write_state(tmp_path / "state.json", spec.to_state())
    write_tool_scripts(tmp_path / "bin", sys.executable, HERE.parent)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HETERO_GPU_EMU_STATE": str(tmp_path / "state.json")}
    proc = subprocess.run(["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert (proc.returncode, proc.stdout) == (0, "0, NVIDIA A100-SXM4-80GB\n1, NVIDIA A100-SXM4-80GB\n")
    proc = subprocess.run(["nvidia-smi"], env={"PATH": env["PATH"]}, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255 and "HETERO_GPU_EMU_STATE" in proc.stderr


# ---------------------------------------------------------------------------------------------
# More real samples (shared collection)
# ---------------------------------------------------------------------------------------------


@needs_shared
@pytest.mark.parametrize("name, text", [
    ("failed-to-communicate-with-driver.txt", nvsmi.DRIVER_NOT_LOADED),
    ("no-devices-were-found.txt", nvsmi.NO_DEVICES),
    ("unable-to-determine-device-handle-unknown-error-2015.txt",
     nvsmi.lost_message({"pci_bus_id": "00000000:0B:00.0"})),
    ("gpu-is-lost.txt", nvsmi.lost_message({"pci_bus_id": "00000000:02:00.0",
                                            "lost_reason": "GPU is lost. Reboot the system to recover this GPU"})),
])
def test_error_texts_match_real_ones(name, text):
    assert (SHARED_SMI / "query" / "errors" / name).read_text(encoding="utf-8").splitlines()[0] == text


@needs_shared
def test_alias_query_matches_the_real_h100_sample():
    """gpu_name,gpu_bus_id,vbios_version: the header echoes canonical names (rows 1 and 8)."""
    lines = (SHARED_SMI / "query" / "query-gpu-name-busid-vbios-h100-elided.csv").read_text().splitlines()
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
             "pci_bus_id": f"00000000:{bus}:00.0", "vbios_version": "96.00.89.00.01"}
            for i, bus in enumerate(["04", "8B"])]
    rc, out, _ = run_fake(host_state(gpus), "--query-gpu=gpu_name,gpu_bus_id,vbios_version", "--format=csv")
    assert rc == 0 and out.splitlines() == [lines[0], lines[1], lines[-1]]


@needs_shared
def test_nounits_query_matches_the_real_p100_sample():
    sample = (SHARED_SMI / "query" / "query-gpu-tesla-p100-pcie-netdata.csv").read_text()
    header, row = sample.split("\n")[0], sample.split("\n")[1].split(", ")
    gpu = {"index": 0, "name": row[0], "uuid": row[1], "fan_speed": None, "pstate": row[3],
           "memory_reserved_mib": int(row[4]), "memory_used_mib": int(row[5]),
           "memory_total_mib": int(row[4]) + int(row[5]) + int(row[6]), "utilization_gpu": int(row[7]),
           "utilization_memory": int(row[8]), "temperature_c": int(row[9]), "power_draw_w": float(row[10]),
           "clock_sm_mhz": int(row[11]), "clock_mem_mhz": int(row[13]), "pci_bus_id": "00000000:00:00.0",
           "overrides": {"clocks.current.video": row[14]}}
    fields = [c.split(" [")[0] for c in header.split(", ")]
    rc, out, _ = run_fake(host_state([gpu]), "--query-gpu=" + ",".join(fields), "--format=csv,nounits")
    assert rc == 0 and out == sample + "\n"


@needs_shared
def test_legend_matches_the_real_capture():
    real = (SHARED_SMI / "topo" / "8x-a100-sxm-nv12-4nic-hgx-2numa.txt").read_text()
    assert nvsmi.LEGEND in real


# ---------------------------------------------------------------------------------------------
# MIG and the NVLink fabric (real samples in tests/data/mig and tests/data/fabric)
# ---------------------------------------------------------------------------------------------
import datetime as _dt  # noqa: E402

from airflow_hetero_gpu.testing.demo import GB200, GB200_TRAY_BUS, nvl72_rack  # noqa: E402

MIG_DATA = HERE / "data" / "mig"
FABRIC_DATA = HERE / "data" / "fabric"
MASKED = "GPU-00000000-0000-0000-0000-000000000000"


def _masked_mig(n: int) -> str:
    return f"MIG-{n:08d}-0000-0000-0000-{n:012d}"


def _dev(profile, gi, ci, used, total, bar1, sm, ce, dec, jpg, processes=()):
    return {"profile": profile, "gpu_instance": gi, "compute_instance": ci, "memory_used_mib": used,
            "memory_total_mib": total, "bar1_total_mib": bar1, "sm": sm, "ce": ce, "enc": 0, "dec": dec, "ofa": 0,
            "jpg": jpg, "processes": list(processes)}


def _stamp(*when) -> float:
    return _dt.datetime(*when).timestamp()


def h100_mig_state() -> dict:
    """The H100 of the nvidia_gpu_exporter MIG capture, idle (its table and -L)."""
    devices = [_dev("3g.40gb", 2, 0, 26, 40448, 24739, 60, 3, 3, 3), _dev("2g.20gb", 3, 0, 17, 20096, 12369, 32, 2, 2, 2),
               _dev("1g.10gb", 9, 0, 9, 9984, 6184, 16, 1, 1, 1), _dev("1g.10gb", 10, 0, 9, 9984, 6184, 16, 1, 1, 1)]
    for n, d in enumerate(devices):
        d["uuid"] = _masked_mig(n)
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": MASKED, "pci_bus_id": "00000000:00:09.0",
           "memory_total_mib": 81559, "memory_used_mib": 59, "temperature_c": 42, "power_draw_w": 98.0,
           "power_limit_w": 700.0, "mig_mode": "Enabled", "mig_devices": devices}
    return host_state([gpu], driver_version="590.48.01", cuda_version="13.1", table_time=_stamp(2026, 7, 14, 9, 0, 26))


def h200_mig_load_state() -> dict:
    burn = [{"pid": 12249, "name": "/root/tools/memhog", "memory_mib": 2194},
            {"pid": 12250, "name": "/root/tools/memhog", "memory_mib": 1170},
            {"pid": 12267, "name": "./gpu_burn", "memory_mib": 13526}]
    devices = [_dev("1c.3g.71gb", 2, 0, 16925, 71424, 59237, 16, 3, 3, 3),
               _dev("2c.3g.71gb", 2, 1, 16925, 71424, 59237, 32, 3, 3, 3, burn),
               _dev("2g.35gb", 3, 0, 17, 33280, 29618, 32, 2, 2, 2), _dev("1g.18gb", 9, 0, 9, 16384, 14809, 16, 1, 1, 1),
               _dev("1g.18gb", 10, 0, 9, 16384, 14809, 16, 1, 1, 1)]
    for n, d in enumerate(devices):
        d["uuid"] = _masked_mig(n)
    gpu = {"index": 0, "name": "NVIDIA H200", "uuid": MASKED, "pci_bus_id": "00000000:83:00.0",
           "memory_total_mib": 143771, "memory_used_mib": 16959, "temperature_c": 36, "power_draw_w": 295.0,
           "power_limit_w": 700.0, "mig_mode": "Enabled", "mig_devices": devices}
    return host_state([gpu], driver_version="590.48.01", cuda_version="13.1", table_time=_stamp(2026, 7, 3, 22, 22, 26))


@pytest.mark.parametrize("state, sample", [(h100_mig_state, "L-h100-mig-4-instances.txt"),
                                           (h200_mig_load_state, "L-h200-mig.txt")])
def test_mig_listing_is_reproduced_byte_for_byte(state, sample):
    rc, out, _ = run_fake(state(), "-L")
    assert rc == 0 and out == (MIG_DATA / sample).read_text(encoding="utf-8")


@pytest.mark.parametrize("state, sample", [(h100_mig_state, "table-h100-mig-4-instances-idle.txt"),
                                           (h200_mig_load_state, "table-h200-mig-load.txt")])
def test_mig_table_is_reproduced_byte_for_byte(state, sample):
    rc, out, _ = run_fake(state())  # no arguments: the plain table
    assert rc == 0 and out == (MIG_DATA / sample).read_text(encoding="utf-8")


def test_plain_table_with_processes_is_reproduced_byte_for_byte():
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:00:09.0", "memory_total_mib": 81559,
           "memory_used_mib": 19818, "temperature_c": 59, "power_draw_w": 629.0, "power_limit_w": 700.0,
           "utilization_gpu": 100, "ecc_uncorrected_volatile": 0, "mig_mode": "Disabled",
           "processes": [{"pid": 11327, "name": "/root/tools/memhog", "memory_mib": 2566},
                         {"pid": 11328, "name": "/root/tools/memhog", "memory_mib": 1542},
                         {"pid": 11345, "name": "./gpu_burn", "memory_mib": 15690}]}
    state = host_state([gpu], driver_version="590.48.01", cuda_version="13.1", table_time=_stamp(2026, 7, 14, 8, 12, 53))
    assert nvsmi.table_text(state) == (MIG_DATA / "table-h100-80gb-hbm3-load.txt").read_text(encoding="utf-8")


def test_gb200_tray_table_is_reproduced():
    """A real GB200 compute tray (4 GPUs, one PCI domain each); the copy lost its time stamp's
    trailing spaces, so the first line is compared without them."""
    spec = nvl72_rack(trays=1)[0]
    for gpu, temp, watts in zip(spec.gpus, (37, 37, 36, 36), (166.0, 157.0, 150.0, 172.0)):
        gpu.temperature_c, gpu.power_draw_w, gpu.memory_used_mib, gpu.mig_mode = temp, watts, 0, "Disabled"
    state = dict(spec.to_state(), driver_version="590.48.01", cuda_version="13.1",
                 table_time=_stamp(2026, 4, 20, 17, 3, 28))
    real = (FABRIC_DATA / "table-gb200-4gpu-tray-driver590.txt").read_text(encoding="utf-8").splitlines()
    got = nvsmi.table_text(state).splitlines()
    assert [got[0].rstrip()] + got[1:] == real
    assert [g["pci_bus_id"] for g in state["gpus"]] == list(GB200_TRAY_BUS) and GB200.memory_total_mib == 189471


# real allfields sample, GPU state: the MIG and fabric cells must come out as the real row has them
FABRIC_CELLS = ["mig.mode.current", "mig.mode.pending", "utilization.gpu [%]", "utilization.memory [%]",
                "fabric.state", "fabric.status", "fabric.cliqueId", "fabric.clusterUuid", "fabric.health.summary",
                "fabric.health.bandwidth", "platform.tray_index"]
HGX = {"state": "Completed", "status": "Success", "clique_id": 0, "cluster_uuid": "00000000-0000-0000-0000-000000000000"}


@pytest.mark.parametrize("sample, gpu", [
    (MIG_DATA / "query-gpu-allfields-h100-mig-enabled-idle.csv", {"mig_mode": "Enabled", "utilization_gpu": 0, "fabric": HGX}),
    (FABRIC_DATA / "query-gpu-allfields-h100-80gb-hbm3-idle.csv",
     {"mig_mode": "Disabled", "utilization_gpu": 0, "utilization_memory": 0, "fabric": HGX}),
    (FABRIC_DATA / "query-gpu-allfields-l40s-load.csv", {"utilization_gpu": 9, "utilization_memory": 2}),
])
def test_mig_and_fabric_cells_of_real_rows(sample, gpu):
    header, rows = csv_cells(sample)
    real = dict(zip(header, rows[0]))
    state = host_state([{"index": 0, "name": "x", "memory_total_mib": 1, "pci_bus_id": "00000000:00:09.0", **gpu}])
    fields = [c.split(" [")[0] for c in FABRIC_CELLS]
    rc, out, _ = run_fake(state, "--query-gpu=" + ",".join(fields), "--format=csv")
    got_header, got_row = out.splitlines()
    assert rc == 0 and got_header == ", ".join(FABRIC_CELLS)
    assert dict(zip(FABRIC_CELLS, got_row.split(", "))) == {c: real[c] for c in FABRIC_CELLS}
