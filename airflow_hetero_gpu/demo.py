"""The demo: the retraining DAG on an emulated heterogeneous cluster, end to end.

``python -m airflow_hetero_gpu.demo`` (what ``make demo`` runs):

1. starts the emulated cluster (real sshd per host on 127.0.0.x, nvidia-smi emulated): two
   8 x A100-SXM4-80GB NVSwitch hosts (one half busy), an 8 x V100 DGX-1, a 4 x RTX 4090 PCIe box
   and an 8 x H200 host with a faulty GPU, under two leaf switches and a spine;
2. configures an embedded Airflow (SQLite metadata database in a temporary AIRFLOW_HOME, one ssh
   connection per host with its host key pinned, a SQLite ledger) through environment variables;
3. runs the ``hetero_gpu_retrain`` DAG with ``airflow dags test``: the health gate, the placement
   (every pool's stage, reason and score terms), real torchrun training on CPU across the chosen
   GPUs' hosts, the evaluation;
4. prints the placement explanation and the training loss, and stops everything it started.

``python -m airflow_hetero_gpu.demo --ui`` (``make demo-ui``) starts the same cluster and runs
``airflow standalone`` against it, so the DAGs and the cluster page can be clicked through.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from airflow_hetero_gpu.testing.airflow_env import airflow_command, airflow_env, connection_env, dags_test, migrate
from airflow_hetero_gpu.testing.cluster import EmulatedCluster
from airflow_hetero_gpu.testing.demo import demo_hosts

DEMO_DAG = "hetero_gpu_retrain"

CLUSTER_YAML = """\
# The demo fleet's task types: the NVSwitch A100 and H200 boxes take pre-training and
# fine-tuning, the RTX 4090 box fine-tuning and vision; the V100s keep their default.
task_types:
  hosts:
    "dgx-a*": [llm-pretrain, finetune]
    "hgx-*": [llm-pretrain, finetune]
  models:
    "RTX 4090": [finetune, cv]
"""

TOPOLOGY_CONF = """\
# Two leaf switches under a spine (Slurm topology.conf syntax)
SwitchName=leaf1 Nodes=dgx-a[1-2],hgx-h200
SwitchName=leaf2 Nodes=dgx1-v100,rtx-box
SwitchName=spine Switches=leaf[1-2]
"""

_PREFIX = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z \[\w+\s*\] ")
_TAIL = re.compile(r"\s+\[[\w.]+\]\s+loc=\S+\s*$")


def default_dags_folder() -> Path:
    """The repository's ``dags/`` beside the package (a source checkout), else the cwd's."""
    here = Path(__file__).resolve().parent.parent / "dags"
    return here if here.is_dir() else Path.cwd() / "dags"


class Narrator:
    """Keeps the parts of the DAG run's output a person wants to read."""

    KEEP = (
        re.compile(r"GPU inventory: "),
        re.compile(r"GPU host \S+: collection failed"),
        re.compile(r"gate "),
        re.compile(r"\] epoch \d+ loss "),
        re.compile(r"resumed from epoch"),
        re.compile(r"job \S+: (starting on|reservation released|restarting)"),
        re.compile(r"evaluation: "),
        re.compile(r"DagRun Finished: "),
    )

    def __init__(self, out=sys.stdout):
        self.out = out
        self.in_block = False
        self.lines: list[str] = []

    def __call__(self, raw: str) -> None:
        self.lines.append(raw)
        line = _PREFIX.sub("", raw.rstrip("\n"))
        if self.in_block:
            end = _TAIL.search(line)
            self.out.write("    " + _TAIL.sub("", line) + "\n")
            if end:
                self.in_block = False
                self.out.write("\n")
            return
        if "placement for job" in line:
            self.in_block = not _TAIL.search(line)
            self.out.write("\n" + _TAIL.sub("", line) + "\n")
            return
        if any(p.search(line) for p in self.KEEP):
            line = _TAIL.sub("", line)
            if "DagRun Finished" in line:
                state = re.search(r"state=(\w+)", line)
                line = f"DAG run finished: {state.group(1) if state else line}"
            self.out.write("  " + line + "\n")
        self.out.flush()


def _env(root: Path, cluster: EmulatedCluster, dags: Path) -> dict[str, str]:
    conns, ids = connection_env(cluster)
    config = root / "cluster.yaml"
    config.write_text(CLUSTER_YAML)
    topology = root / "topology.conf"
    topology.write_text(TOPOLOGY_CONF)
    return airflow_env(root / "airflow", dags, {
        **conns,
        "AIRFLOW__HETERO_GPU__SSH_CONN_IDS": ",".join(f"{h}={c}" for h, c in ids.items()),
        "AIRFLOW__HETERO_GPU__CAPTURES_DIR": str(root / "captures"),
        "AIRFLOW__HETERO_GPU__CLUSTER_CONFIG": str(config),
        "AIRFLOW__HETERO_GPU__TOPOLOGY_CONF": str(topology),
        "AIRFLOW__HETERO_GPU__LEDGER_URL": f"sqlite:///{root / 'ledger.db'}",
        "HETERO_GPU_CHECKPOINT_ROOT": str(root / "checkpoints"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(dags), os.environ.get("PYTHONPATH", "")) if p),
    })


def run_demo(dags: Path, *, epochs: int, gpus: int, keep: bool = False, out=sys.stdout) -> int:
    root = Path(tempfile.mkdtemp(prefix="hetero-gpu-demo-"))
    try:
        out.write(f"demo directory: {root}\n")
        with EmulatedCluster(root / "cluster", demo_hosts()) as cluster:
            for host in cluster.hosts:
                out.write(f"  emulated host {host.name:10s} ssh {cluster.user}@{host.address}:{host.port}\n")
            env = _env(root, cluster, dags)
            out.write("preparing Airflow (SQLite metadata database)...\n")
            out.flush()
            migrate(env)
            out.write(f"running DAG {DEMO_DAG}: gate -> train ({gpus} GPUs, {epochs} epochs) -> evaluate\n")
            out.flush()
            narrator = Narrator(out)
            result = dags_test(DEMO_DAG, env, conf={"gpu_count": gpus, "epochs": epochs}, stream=narrator)
            (root / "dag-run.log").write_text("".join(narrator.lines))
            ok = result.returncode == 0 and "state=success" in result.stdout
            out.write(f"\n{'demo finished' if ok else 'demo FAILED'}; full log: {root / 'dag-run.log'}\n")
            return 0 if ok else 1
    finally:
        if not keep:
            log = root / "dag-run.log"
            if log.exists():
                saved = Path(tempfile.gettempdir()) / "hetero-gpu-demo-dag-run.log"
                shutil.copyfile(log, saved)
                out.write(f"(log kept at {saved})\n")
            shutil.rmtree(root, ignore_errors=True)


def run_ui(dags: Path, out=sys.stdout) -> int:
    root = Path(tempfile.mkdtemp(prefix="hetero-gpu-demo-ui-"))
    try:
        with EmulatedCluster(root / "cluster", demo_hosts()) as cluster:
            env = _env(root, cluster, dags)
            env["AIRFLOW__HETERO_GPU__REFRESH_SECONDS"] = "30"
            migrate(env)
            out.write("starting `airflow standalone` on http://localhost:8080 (admin password: see its output "
                      f"or {root / 'airflow' / 'simple_auth_manager_passwords.json.generated'}); Ctrl-C stops "
                      "everything\n")
            out.flush()
            proc = subprocess.Popen([*airflow_command(), "standalone"], env=env)
            try:
                return proc.wait()
            except KeyboardInterrupt:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m airflow_hetero_gpu.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--dags-folder", type=Path, default=None, help="default: the repository's dags/")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--ui", action="store_true", help="run `airflow standalone` against the emulated cluster")
    ap.add_argument("--keep", action="store_true", help="keep the demo directory")
    args = ap.parse_args(argv)
    dags = (args.dags_folder or default_dags_folder()).resolve()
    if not (dags / f"{DEMO_DAG}.py").exists():
        print(f"demo: {dags} has no {DEMO_DAG}.py (give --dags-folder)", file=sys.stderr)
        return 2
    if args.ui:
        return run_ui(dags)
    return run_demo(dags, epochs=args.epochs, gpus=args.gpus, keep=args.keep)


if __name__ == "__main__":
    sys.exit(main())
