#!/usr/bin/env bash
# Device check: on a machine with a real NVIDIA GPU, the NVML agent must report the same GPUs as
# nvidia-smi does.
#
#   bash scripts/device_check_nvml.sh            # from the repository root; PYTHON=... to choose
#
# Runs `nvidia-smi --query-gpu=<fields> --format=csv` with the fields the NVML agent reports (the
# SPEC fields, the optional health fields, the MIG mode and the NVLink fabric registration; an
# older driver's refusal of some is handled as the collector does) and the NVML agent (piped into
# the interpreter exactly as the SSH collector does), parses both with the package's query reader
# and compares them GPU by GPU: identity, sizes, ECC, retired pages, row remapping, the
# HW-slowdown flag, the MIG mode and the fabric registration exactly; utilization, memory used,
# temperature and power within tolerances, since the two reads are a moment apart. It also
# checks that every cell has the same shape (units, decimals, bracketed values) and that the
# header names agree.
#
# It also records, for tests/data, what the collector reads where MIG is on and on NVLink fabric
# systems: `nvidia-smi -L` (mig-list.txt: MIG devices and their UUIDs), the plain table
# (table.txt: MIG devices' memory, processes), every fabric field with the tray index
# (fabric.csv) and `nvidia-smi -q` (q.txt: the Fabric and MIG Device sections); the report reads
# the MIG devices and NVLink domains back with the package's readers. Raw outputs and the report
# go to $OUT (or a temp dir).
#
# Exit status: 0 same inventory, 1 a difference (listed), 3 cannot check here (no GPU/driver,
# no pynvml).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
DEST=${OUT:-$(mktemp -d -t nvml-check-XXXXXX)}
mkdir -p "$DEST"
SPEC_FIELDS="index,uuid,name,pci.bus_id,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw,power.limit,ecc.errors.uncorrected.volatile.total,retired_pages.pending"

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "cannot check: nvidia-smi is not on PATH (no NVIDIA driver here)"; exit 3
fi
if ! "$PYTHON" -c "import pynvml" >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q nvidia-ml-py >/dev/null 2>&1 || true
  if ! "$PYTHON" -c "import pynvml" >/dev/null 2>&1; then
    echo "cannot check: $PYTHON has no pynvml and 'pip install nvidia-ml-py' failed"; exit 3
  fi
fi

nvidia-smi --version > "$DEST/nvidia-smi-version.txt" 2>&1 || true
set +e
MIG="mig.mode.current,mig.mode.pending"
FABRIC="fabric.state,fabric.status,fabric.cliqueId,fabric.clusterUuid"
for extra in "remapped_rows.pending,remapped_rows.failure,clocks_event_reasons.hw_slowdown,$MIG,$FABRIC" \
             "remapped_rows.pending,remapped_rows.failure,clocks_throttle_reasons.hw_slowdown,$MIG,$FABRIC" \
             "clocks_throttle_reasons.hw_slowdown,$MIG,$FABRIC" "clocks_throttle_reasons.hw_slowdown,$MIG" \
             "clocks_throttle_reasons.hw_slowdown" ""; do
  nvidia-smi --query-gpu="$SPEC_FIELDS${extra:+,$extra}" --format=csv > "$DEST/nvidia-smi.csv" 2> "$DEST/nvidia-smi.err"
  smi_rc=$?
  grep -q "is not a valid field to query" "$DEST/nvidia-smi.csv" || break
done
"$PYTHON" - < airflow_hetero_gpu/collect/nvml_agent.py > "$DEST/agent.json" 2> "$DEST/agent.err"
agent_rc=$?
# what the collector adds where MIG is on, and the fabric of NVLink fabric systems (real samples)
nvidia-smi -L > "$DEST/mig-list.txt" 2>&1
nvidia-smi > "$DEST/table.txt" 2>&1
nvidia-smi --query-gpu=index,uuid,name,memory.total,$MIG,$FABRIC,fabric.health.summary,fabric.health.bandwidth,platform.tray_index \
  --format=csv > "$DEST/fabric.csv" 2>&1
nvidia-smi -q > "$DEST/q.txt" 2>&1
set -e
echo "nvidia-smi exit $smi_rc, agent exit $agent_rc; outputs in $DEST"

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - "$DEST" <<'PY' | tee "$DEST/report.txt"
import json
import re
import sys
from pathlib import Path

from airflow_hetero_gpu.capture.query import parse_query_csv

dest = Path(sys.argv[1])
smi_text = (dest / "nvidia-smi.csv").read_text()
reply = json.loads((dest / "agent.json").read_text() or "{}")
smi_ok = any(line.startswith("index") for line in smi_text.splitlines())
if reply.get("error") or not smi_ok:
    print(f"agent: {reply.get('error') or 'ok'}; nvidia-smi: {smi_text.strip()[:200] if not smi_ok else 'ok'}")
    sys.exit(1 if smi_ok or not reply.get("error") else 3)  # only one of them works: a difference
agent_text = reply["query_csv"]
(dest / "agent.csv").write_text(agent_text)

problems = []
notes = []
smi_lines, agent_lines = smi_text.splitlines(), agent_text.splitlines()
ALIASES = {"clocks_throttle_reasons.hw_slowdown": "clocks_event_reasons.hw_slowdown"}


def header(lines):
    line = next((l for l in lines if l.startswith("index")), "")
    return [ALIASES.get(c.strip(), c.strip()) for c in line.split(",")]


smi_header, agent_header = header(smi_lines), header(agent_lines)
missing = [f for f in agent_header if f not in smi_header]
if [f for f in agent_header if f in smi_header] != smi_header:
    problems.append(f"headers differ:\n  nvidia-smi: {smi_header}\n  agent:      {agent_header}")
elif missing:
    notes.append(f"this driver's nvidia-smi lacks {missing}; compared the rest")


def shape(cell: str) -> str:
    cell = cell.strip()
    if cell.startswith("["):
        return cell
    if cell.startswith("GPU-"):
        return "uuid"
    return re.sub(r"[0-9A-Fa-f]+", "9", re.sub(r"\d+\.\d\d", "9.99", cell))


def rows(lines):
    return [l for l in lines if l and not l.startswith("index") and not l.startswith("Unable")]


for s_row, a_row in zip(rows(smi_lines), rows(agent_lines)):
    a_cells = dict(zip(agent_header, a_row.split(",")))
    for field, s_cell in zip(smi_header, s_row.split(",")):
        a_cell = a_cells.get(field, "")
        if field == "name":  # compared whole below
            continue
        if shape(s_cell) != shape(a_cell):
            problems.append(f"cell shapes differ in {field}: {s_cell.strip()!r} vs {a_cell.strip()!r}")

smi = parse_query_csv(smi_text, "nvidia-smi.csv")
agent = parse_query_csv(agent_text, "agent.csv")
if len(smi.rows) != len(agent.rows):
    problems.append(f"{len(smi.rows)} GPUs from nvidia-smi, {len(agent.rows)} from NVML")
if [d.pci_bus_id for d in smi.lost] != [d.pci_bus_id for d in agent.lost]:
    problems.append(f"lost GPUs differ: {smi.lost} vs {agent.lost}")
EXACT = ("index", "uuid", "name", "pci_bus_id", "memory_total_mib", "power_limit_w", "ecc_uncorrected",
         "retired_pages_pending", "problems")
OPTIONAL = {"remapped_rows_pending": "remapped_rows.pending", "remapped_rows_failure": "remapped_rows.failure",
            "hw_slowdown": "clocks_event_reasons.hw_slowdown", "mig_mode_current": "mig.mode.current",
            "mig_mode_pending": "mig.mode.pending", "fabric_state": "fabric.state", "fabric_status": "fabric.status",
            "fabric_clique_id": "fabric.cliqueId", "fabric_cluster_uuid": "fabric.clusterUuid"}
TOLERANCE = {"memory_used_mib": 512, "utilization_pct": 15, "temperature_c": 3, "power_w": 40}
for s, a in zip(smi.rows, agent.rows):
    for name in EXACT:
        if getattr(s, name) != getattr(a, name):
            problems.append(f"GPU {s.index} {name}: nvidia-smi {getattr(s, name)!r}, NVML {getattr(a, name)!r}")
    for name, field in OPTIONAL.items():
        if field in smi_header and getattr(s, name) != getattr(a, name):
            problems.append(f"GPU {s.index} {name}: nvidia-smi {getattr(s, name)!r}, NVML {getattr(a, name)!r}")
    for name, tol in TOLERANCE.items():
        x, y = getattr(s, name), getattr(a, name)
        if (x is None) != (y is None) or (x is not None and abs(x - y) > tol):
            problems.append(f"GPU {s.index} {name}: nvidia-smi {x!r}, NVML {y!r} (tolerance {tol})")
    print(f"GPU {s.index} {s.name} {s.pci_bus_id}: "
          + ", ".join(f"{n}={getattr(s, n)!r}/{getattr(a, n)!r}" for n in ("memory_total_mib", "memory_used_mib",
                      "utilization_pct", "temperature_c", "power_w", "power_limit_w", "ecc_uncorrected",
                      "retired_pages_pending", "remapped_rows_pending", "remapped_rows_failure", "hw_slowdown")))
# MIG devices and NVLink domains, read back with the collector's readers
from airflow_hetero_gpu.capture.mig import parse_mig_list, parse_mig_usage  # noqa: E402
from airflow_hetero_gpu.core.model import Fabric  # noqa: E402
from airflow_hetero_gpu.errors import CaptureError  # noqa: E402

if any((r.mig_mode_current or "").lower() == "enabled" for r in smi.rows):
    try:
        listing = parse_mig_list((dest / "mig-list.txt").read_text(), "mig-list.txt")
        usage = parse_mig_usage((dest / "table.txt").read_text(), "table.txt")
        for gpu, devices in sorted(listing.devices.items()):
            for d in devices:
                row = usage.devices.get((gpu, d.device))
                busy = bool(row and usage.processes_on(row))
                memory = f"{row.memory_used_mib:g}/{row.memory_total_mib:g}" if row else "?/?"
                print(f"GPU {gpu} MIG device {d.device}: {d.profile} {d.uuid} memory {memory} MiB"
                      f"{', in use' if busy else ''}")
    except CaptureError as err:
        problems.append(f"MIG outputs unreadable: {err}")
try:
    fabric = parse_query_csv((dest / "fabric.csv").read_text(), "fabric.csv")
    for r in fabric.rows:
        f = Fabric(r.fabric_state, r.fabric_status, r.fabric_clique_id, r.fabric_cluster_uuid,
                   r.fabric_health_summary, r.fabric_health_bandwidth, r.tray_index)
        print(f"GPU {r.index} fabric: state={f.state!r} status={f.status!r} clique={f.clique_id!r} "
              f"cluster={f.cluster_uuid!r} health={f.health_summary!r}/{f.bandwidth!r} tray={f.tray_index!r} "
              f"-> NVLink domain {f.domain or 'none'}")
except CaptureError as err:
    notes.append(f"fabric fields not read on this driver: {err}")
for note in notes:
    print("note: " + note)
if problems:
    print("DIFFERENT:")
    for p in problems:
        print("  " + p)
    sys.exit(1)
print(f"SAME inventory from nvidia-smi and NVML: {len(smi.rows)} GPU(s), header identical, cell shapes identical")
PY
