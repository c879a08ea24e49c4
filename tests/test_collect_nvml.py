"""The NVML collector: the same ``query.csv`` (and so the same inventory) as nvidia-smi.

No GPU on the test machines, so NVML itself is the one thing faked here (``fake_pynvml``: NVML's
return values and error codes, answering from an emulated host's state); the text it yields is
compared with what the emulated nvidia-smi prints for the same state, and the SSH path runs the
agent over real sshd.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from collect_helpers import mixed_fleet, paramiko_factory
from fake_pynvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_UNKNOWN,
    FakeNvml,
    install_as_pynvml,
    install_python3,
)

from airflow_hetero_gpu.capture.directory import QUERY_FIELDS, HostCapture
from airflow_hetero_gpu.capture.query import EXTRA_HEALTH_FIELDS, FABRIC_FIELDS, MIG_FIELDS, parse_query_csv
from airflow_hetero_gpu.collect import nvml_agent
from airflow_hetero_gpu.collect.nvml import (
    AgentReply,
    NvmlUnavailable,
    agent_command,
    agent_script,
    nvml_query_csv,
    parse_agent_reply,
)
from airflow_hetero_gpu.collect.ssh import collect_captures
from airflow_hetero_gpu.collect.targets import parse_hosts_arg
from airflow_hetero_gpu.core.config import ClusterConfig
from airflow_hetero_gpu.core.inventory import host_gpus, load_cluster
from airflow_hetero_gpu.testing import nvsmi
from airflow_hetero_gpu.testing.demo import demo_hosts, small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from airflow_hetero_gpu.testing.state import HostSpec

REPO = Path(__file__).resolve().parents[1]


#: What the agent prints: the SPEC fields, the optional health fields, the MIG mode and the
#: fabric registration (nvidia-smi is asked for the fabric health and tray index as well).
COLLECTED_FIELDS = ",".join([QUERY_FIELDS, *EXTRA_HEALTH_FIELDS, *MIG_FIELDS, *FABRIC_FIELDS[:4]])


def smi_csv(state) -> str:
    return nvsmi.query_gpu(state, COLLECTED_FIELDS, "csv")[0]


def realistic(state):
    """NVML reports row remapping for both flags or for neither (one call); the emulation's
    specs leave ``remapped_rows_failure`` False on cards without remapping, so align it."""
    for gpu in state["gpus"]:
        if gpu.get("remapped_rows_pending") is None or gpu.get("remapped_rows_failure") is None:
            gpu["remapped_rows_pending"] = gpu["remapped_rows_failure"] = None
    return state


def proc_dir_for(tmp_path: Path, state) -> str:
    """A /proc/driver/nvidia/gpus look-alike: one directory per GPU, kernel spelling."""
    root = tmp_path / "proc-gpus"
    for gpu in state["gpus"]:
        domain, bus, devfn = gpu["pci_bus_id"].split(":")
        (root / f"{domain[-4:]}:{bus}:{devfn}".lower()).mkdir(parents=True, exist_ok=True)
    return str(root)


def inventory(host: str, text: str):
    cap = HostCapture(host, query=parse_query_csv(text, f"{host}/query.csv"))
    return host_gpus(cap, ClusterConfig())


ALL_SPECS = demo_hosts() + mixed_fleet()


def test_agent_fields_are_the_collected_fields():
    assert ",".join(nvml_agent.FIELDS) == COLLECTED_FIELDS


def test_agent_imports_only_the_standard_library_and_pynvml():
    tree = ast.parse(agent_script().decode())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"__future__", "json", "os", "sys", "typing", "pynvml"}, imported


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.name)
def test_nvml_csv_is_what_nvidia_smi_prints_for_the_same_gpus(spec: HostSpec, tmp_path):
    state = realistic(spec.to_state())
    text = nvml_query_csv(FakeNvml(state), proc_dir=proc_dir_for(tmp_path, state))
    assert text == smi_csv(state)
    assert inventory(spec.name, text) == inventory(spec.name, smi_csv(state))


@pytest.mark.parametrize("lost_reason", ["Unknown Error", "GPU is lost. Reboot the system to recover this GPU"])
def test_lost_gpus_are_named_by_the_kernel_modules_bus_ids(tmp_path, lost_reason):
    spec = small_hosts(1, gpus=4)[0]
    for index in (1, 3):
        spec.gpus[index].lost = True
        spec.gpus[index].lost_reason = lost_reason
    state = spec.to_state()
    text = nvml_query_csv(FakeNvml(state), proc_dir=proc_dir_for(tmp_path, state))
    assert text == smi_csv(state)
    assert text.splitlines()[:2] == [
        f"Unable to determine the device handle for GPU 0000:0F:00.0: {lost_reason}",
        f"Unable to determine the device handle for GPU 0000:4E:00.0: {lost_reason}",
    ]
    gpus = inventory("node01", text)
    assert [(g.index, g.healthy, g.reasons) for g in gpus if not g.healthy] == [(1, False, ("lost",)), (3, False, ("lost",))]
    assert gpus == inventory("node01", smi_csv(state))


def test_gpu_lost_while_read_is_reported_with_its_own_bus_id(tmp_path):
    state = small_hosts(1, gpus=2)[0].to_state()
    text = nvml_query_csv(FakeNvml(state, lost_during_read={1}), proc_dir=str(tmp_path / "none"))
    assert text.splitlines()[0] == (
        "Unable to determine the device handle for GPU 0000:0F:00.0: GPU is lost. Reboot the system to recover this GPU")
    assert [g.reasons for g in inventory("node01", text)] == [(), ("lost",)]


def test_old_pynvml_bytes_strings_give_the_same_text(tmp_path):
    state = realistic(demo_hosts()[0].to_state())
    assert nvml_query_csv(FakeNvml(state, bytes_strings=True)) == smi_csv(state)


# NVML error of one value -> what nvidia-smi prints in its cell, and whether the GPU is "lost".
VALUE_ERRORS = [
    ("temperature.gpu", "[N/A]", "[N/A]", ()),
    ("temperature.gpu", "[Unknown Error]", "[Unknown Error]", ("lost",)),
    ("utilization.gpu", "[GPU requires reset]", "[GPU requires reset]", ("lost",)),
    ("power.draw", "[Not Supported]", "[Not Supported]", ()),  # NVML_ERROR_FUNCTION_NOT_FOUND
    ("ecc.errors.uncorrected.volatile.total", "[Insufficient Permissions]", "[Insufficient Permissions]", ()),
    ("retired_pages.pending", "[N/A]", "[N/A]", ()),
]


@pytest.mark.parametrize("field, override, printed, reasons", VALUE_ERRORS)
def test_value_errors_print_as_nvidia_smi_prints_them(field, override, printed, reasons):
    spec = small_hosts(1, gpus=1)[0]
    spec.gpus[0].overrides = {field: override}
    state = spec.to_state()
    text = nvml_query_csv(FakeNvml(state))
    header, row = text.splitlines()
    cells = dict(zip([h.split(" [")[0] for h in header.split(", ")], row.split(", ")))
    assert cells[field] == printed
    assert text == smi_csv(state)
    assert inventory("node01", text)[0].reasons == reasons


@pytest.mark.parametrize("fields, printed", [
    ({"remapped_rows_pending": True}, {"remapped_rows.pending": "Yes", "remapped_rows.failure": "No"}),
    ({"remapped_rows_failure": True}, {"remapped_rows.failure": "Yes"}),
    ({"remapped_rows_pending": None, "remapped_rows_failure": None},
     {"remapped_rows.pending": "[N/A]", "remapped_rows.failure": "[N/A]"}),
    ({"hw_slowdown": True}, {"clocks_event_reasons.hw_slowdown": "Active"}),
    ({"hw_slowdown": None}, {"clocks_event_reasons.hw_slowdown": "[N/A]"}),
])
def test_optional_health_fields_read_through_nvml(fields, printed):
    spec = small_hosts(1, gpus=1)[0]
    for key, value in fields.items():
        setattr(spec.gpus[0], key, value)
    state = spec.to_state()
    text = nvml_query_csv(FakeNvml(state))
    header, row = text.splitlines()
    cells = dict(zip([h.split(" [")[0] for h in header.split(", ")], row.split(", ")))
    assert {k: cells[k] for k in printed} == printed
    assert text == smi_csv(state)
    assert inventory("node01", text) == inventory("node01", smi_csv(state))


def test_older_pynvml_without_a_function(monkeypatch):
    """A pynvml release that predates a call: that value prints [Not Supported], the rest stand."""
    state = small_hosts(1, gpus=1)[0].to_state()
    fake = FakeNvml(state)
    monkeypatch.setattr(FakeNvml, "nvmlDeviceGetRemappedRows", property(lambda self: _missing()), raising=True)
    text = nvml_query_csv(fake)
    assert text.splitlines()[1].endswith(", [Not Supported], [Not Supported], Not Active, Disabled, Disabled, N/A, N/A, N/A, N/A")
    assert inventory("node01", text) == inventory("node01", smi_csv(state))


def _missing():
    raise AttributeError("module 'pynvml' has no attribute 'nvmlDeviceGetRemappedRows'")


def test_error_codes_map_to_nvidia_smi_texts():
    assert nvml_agent.VALUE_ERRORS[NVML_ERROR_NO_PERMISSION] == "[Insufficient Permissions]"
    assert nvml_agent.VALUE_ERRORS[NVML_ERROR_FUNCTION_NOT_FOUND] == "[Not Supported]"
    assert nvml_agent.VALUE_ERRORS[NVML_ERROR_UNKNOWN] == "[Unknown Error]"


@pytest.mark.parametrize("init_error, faults, message", [
    (NVML_ERROR_DRIVER_NOT_LOADED, [], "NVML: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."),
    (NVML_ERROR_LIBRARY_NOT_FOUND, [], "NVML: NVIDIA-SMI couldn't find libnvidia-ml.so library in your system."),
    (NVML_ERROR_UNKNOWN, [], "Failed to initialize NVML: Unknown Error"),
    (None, ["no_devices"], "NVML: No devices were found"),
])
def test_nvml_that_cannot_report_raises_with_the_reason(init_error, faults, message):
    state = dict(small_hosts(1, gpus=1)[0].to_state(), faults=faults)
    fake = FakeNvml(state, init_error=init_error)
    with pytest.raises(NvmlUnavailable) as caught:
        nvml_query_csv(fake)
    assert str(caught.value).startswith(message)
    assert fake.initialised == 0  # shut down again whenever it was started


def test_default_module_is_pynvml(monkeypatch):
    state = small_hosts(1, gpus=2)[0].to_state()
    fake = FakeNvml(state)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert nvml_query_csv() == smi_csv(state)
    assert fake.calls[0] == "nvmlInit" and fake.calls[-1] == "nvmlShutdown"
    monkeypatch.setitem(sys.modules, "pynvml", None)  # "import pynvml" raises ImportError
    with pytest.raises(NvmlUnavailable, match="pynvml is not installed"):
        nvml_query_csv()


@pytest.mark.parametrize("stdout, reply", [
    ('{"query_csv": "index, name\\n", "error": null}\n', AgentReply("index, name\n", None)),
    ('noise\n{"query_csv": null, "error": "NVML:  Driver\\nNot Loaded"}\n', AgentReply(None, "NVML: Driver Not Loaded")),
    ("", AgentReply(None, "unexpected agent output: 'no output'")),
    ("Traceback (most recent call last):\n", AgentReply(None, "unexpected agent output: 'Traceback (most recent call last):'")),
    ("[1, 2]\n", AgentReply(None, "unexpected agent output: not a JSON object")),
    ('{"query_csv": "", "error": null}\n', AgentReply(None, "agent answered no query_csv")),
])
def test_parse_agent_reply(stdout, reply):
    assert parse_agent_reply(stdout) == reply


def _run_agent(argv, tmp_path, *, with_fake: bool, state_file: Path | None = None):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HETERO_GPU_EMU_STATE")}
    if with_fake:
        env["PYTHONPATH"] = str(install_as_pynvml(tmp_path / "fake").parent)
        env["HETERO_GPU_EMU_STATE"] = str(state_file)
    return subprocess.run(argv, input=agent_script(), capture_output=True, cwd=tmp_path, env=env, timeout=60)


def test_agent_script_runs_alone_from_stdin(tmp_path):
    """Piped into a bare interpreter in an empty directory: this package is not importable."""
    state = realistic(demo_hosts()[3].to_state())
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(state))
    done = _run_agent([sys.executable, "-"], tmp_path, with_fake=True, state_file=state_file)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout) == {"query_csv": smi_csv(state), "error": None}
    # -S: no site-packages, so no pynvml.
    missing = _run_agent([sys.executable, "-S", "-"], tmp_path, with_fake=False)
    reply = json.loads(missing.stdout)
    assert reply["query_csv"] is None and reply["error"].startswith("pynvml is not installed")


def test_agent_with_the_real_pynvml_on_this_machine(tmp_path):
    """The real pynvml (a dependency): without an NVIDIA driver it answers why, in JSON."""
    pytest.importorskip("pynvml")
    done = _run_agent([sys.executable, "-"], tmp_path, with_fake=False)
    assert done.returncode == 0, done.stderr.decode()
    reply = json.loads(done.stdout)
    if Path("/proc/driver/nvidia/gpus").is_dir() and reply["error"] is None:
        assert reply["query_csv"].splitlines()[0] == nvml_agent.header_line()  # a GPU machine
    else:
        assert reply == {"query_csv": None, "error": (
            "NVML: NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure "
            "that the NVIDIA Display Driver is properly installed and present in your system.")}


def test_agent_runs_as_a_module(tmp_path):
    state = demo_hosts()[0].to_state()
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(state))
    env = {**os.environ, "HETERO_GPU_EMU_STATE": str(state_file),
           "PYTHONPATH": os.pathsep.join([str(install_as_pynvml(tmp_path / "fake").parent), str(REPO)])}
    done = subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.collect.nvml_agent"],
                          capture_output=True, env=env, timeout=60, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["query_csv"] == smi_csv(state)


# ---------------------------------------------------------------------------------------------
# Over SSH, against the emulated cluster
# ---------------------------------------------------------------------------------------------


def test_ssh_collection_with_nvml_gives_the_same_inventory(emulated_cluster, tmp_path):
    """With an interpreter that has (the fake) pynvml the agent answers, and gives what nvidia-smi
    gives; where NVML cannot start (node03's driver is gone) nvidia-smi says why, with the same
    reason as without NVML; where the interpreter lacks pynvml, nvidia-smi is used."""
    cluster = emulated_cluster(small_hosts(3, gpus=2))
    python = install_python3(tmp_path / "agent-bin", install_as_pynvml(tmp_path / "fake").parent)
    cluster.update_gpu("node01", 1, utilization_gpu=64, temperature_c=71)
    cluster.inject_fault("node03", "driver_gone")
    targets = parse_hosts_arg(cluster.hosts_arg())

    via_nvml = collect_captures(targets, tmp_path / "nvml", paramiko_factory(cluster), use_nvml=True,
                                nvml_python=str(python))
    via_smi = collect_captures(targets, tmp_path / "smi", paramiko_factory(cluster))
    no_pynvml = collect_captures(targets, tmp_path / "fallback", paramiko_factory(cluster), use_nvml=True,
                                 nvml_python=sys.executable + "-missing")

    assert [h.query_source for h in via_nvml.hosts] == ["nvml", "nvml", None]
    assert [h.query_source for h in via_smi.hosts] == ["nvidia-smi", "nvidia-smi", None]
    assert [h.query_source for h in no_pynvml.hosts] == ["nvidia-smi", "nvidia-smi", None]
    assert via_nvml["node01"].warnings == []
    assert no_pynvml["node01"].warnings == [
        f"NVML agent not used ({sys.executable}-missing: command not found); used nvidia-smi"]
    assert via_nvml["node03"].reason == via_smi["node03"].reason == no_pynvml["node03"].reason
    assert via_nvml["node03"].reason.startswith("nvidia-smi exit 9: NVIDIA-SMI has failed")
    for host in ("node01", "node02"):
        # the agent's fields as nvidia-smi prints them; nvidia-smi is also asked for the fabric
        # health and the tray index
        assert (tmp_path / "nvml" / "hosts" / host / "query.csv").read_text() == smi_csv(cluster.state(host))
        assert ((tmp_path / "smi" / "hosts" / host / "query.csv").read_text()
                == (tmp_path / "fallback" / "hosts" / host / "query.csv").read_text())
    a, b = load_cluster(tmp_path / "nvml"), load_cluster(tmp_path / "smi")
    assert [g.to_json() for g in a.gpus] == [g.to_json() for g in b.gpus]
    assert a.gpu(("node01", 1)).utilization == 0.64


@pytest.mark.parametrize("python, ok", [
    ("python3", True), ("/opt/gpu-venv/bin/python", True), ("python3.11", True),
    ("python3 -c 'x'", False), ("py;rm", False), ("$(id)", False), ("", False), ("a//b", False),
])
def test_nvml_python_must_be_a_plain_name_or_path(tmp_path, python, ok):
    targets = parse_hosts_arg("node01=127.0.0.1:1")
    if ok:
        assert agent_command(python) == f"{python} -"
    else:
        with pytest.raises(ValueError, match="must be a command name or path"):
            collect_captures(targets, tmp_path, lambda t: None, use_nvml=True, nvml_python=python)


def test_device_check_script_against_the_emulation(tmp_path):
    """scripts/device_check_nvml.sh, run here with the emulated nvidia-smi and the fake NVML on
    the same state: it must find the same inventory (and a difference when there is one)."""
    from airflow_hetero_gpu.testing.cluster import PACKAGE_ROOT
    from airflow_hetero_gpu.testing.fake_tools import write_tool_scripts

    spec = mixed_fleet()[1]  # a loaded A100 host with an ECC error
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(spec.to_state()))
    write_tool_scripts(tmp_path / "bin", sys.executable, PACKAGE_ROOT)
    python = install_python3(tmp_path / "agent-bin", install_as_pynvml(tmp_path / "fake").parent)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "PYTHON": str(python),
           "HETERO_GPU_EMU_STATE": str(state_file), "OUT": str(tmp_path / "out")}
    script = str(REPO / "scripts" / "device_check_nvml.sh")
    same = subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=120)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "SAME inventory from nvidia-smi and NVML: 8 GPU(s)" in same.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "agent.csv", "agent.err", "agent.json", "fabric.csv", "mig-list.txt", "nvidia-smi-version.txt",
        "nvidia-smi.csv", "nvidia-smi.err", "q.txt", "report.txt", "table.txt"]
    assert "GPU 0 fabric: state=None status=None clique=None" in same.stdout  # a PCIe-era A100 emulation

    # A MIG-enabled GPU and an NVL72 tray: the MIG devices and the NVLink domain are read back.
    from airflow_hetero_gpu.testing.demo import enable_mig, nvl72_rack

    mig_spec = mixed_fleet()[1]
    enable_mig(mig_spec, 1)
    state_file.write_text(json.dumps(mig_spec.to_state()))
    mig = subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=120)
    assert mig.returncode == 0, mig.stdout + mig.stderr
    assert "GPU 1 MIG device 0: 3g.40gb MIG-" in mig.stdout and "memory 9/40448 MiB" in mig.stdout
    state_file.write_text(json.dumps(nvl72_rack(trays=1)[0].to_state()))
    tray = subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=120)
    assert tray.returncode == 0, tray.stdout + tray.stderr
    assert "-> NVLink domain 9c6f5af3-53bf-49b5-a436-b66766c413c3/1" in tray.stdout
    state_file.write_text(json.dumps(spec.to_state()))

    # An older driver that refuses remapped_rows.failure: compared on the fields it knows.
    old = dict(spec.to_state(), unknown_query_fields=["remapped_rows.failure"])
    state_file.write_text(json.dumps(old))
    older = subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=120)
    assert older.returncode == 0, older.stdout + older.stderr
    assert "note: this driver's nvidia-smi lacks ['remapped_rows.pending', 'remapped_rows.failure']" in older.stdout
    state_file.write_text(json.dumps(spec.to_state()))

    # NVML sees a different card in slot 3.
    state = spec.to_state()
    agent_state = tmp_path / "agent-state.json"
    state["gpus"][3]["uuid"] = "GPU-00000000-0000-0000-0000-000000000003"
    agent_state.write_text(json.dumps(state))
    python.write_text(python.read_text().replace(
        "export PYTHONPATH\n", f"export PYTHONPATH\nHETERO_GPU_EMU_STATE={str(agent_state)!r}\n"
                               "export HETERO_GPU_EMU_STATE\n"))
    differ = subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=120)
    assert differ.returncode == 1, differ.stdout + differ.stderr
    assert "GPU 3 uuid: nvidia-smi 'GPU-" in differ.stdout and "DIFFERENT:" in differ.stdout
