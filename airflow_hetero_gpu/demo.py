"""The demo: the retraining DAG on an emulated heterogeneous cluster, end to end.

``python -m airflow_hetero_gpu.demo`` (what ``make demo`` runs):

1. starts the emulated cluster (real sshd per host on 127.0.0.x, or the embedded SSH server
   where OpenSSH's is not installed; nvidia-smi emulated): two
   8 x A100-SXM4-80GB NVSwitch hosts (one half busy), an 8 x V100 DGX-1, a 4 x RTX 4090 PCIe box
   and an 8 x H200 host with a faulty GPU, under two leaf switches and a spine;
2. configures an embedded Airflow (SQLite metadata database in a temporary AIRFLOW_HOME, one ssh
   connection per host with its host key pinned, a SQLite ledger) through environment variables;
3. runs the ``hetero_gpu_retrain`` DAG with ``airflow dags test``: the health gate, the placement
   (every pool's stage, reason and score terms), real torchrun training on CPU across the chosen
   GPUs' hosts, the evaluation;
4. prints the placement explanation and the training loss, and stops everything it started (also
   on SIGTERM: ``demo_setup.stop_on_signals``). The one directory it names first
   (``$TMPDIR/hetero-gpu-demo-<random>``) keeps the DAG run's whole log afterwards,
   ``dag-run.log``; everything else in it is removed (``--keep`` keeps it all).

``python -m airflow_hetero_gpu.demo --ui [--port N]`` (``make demo-ui [PORT=N]``) starts the same
cluster and runs ``airflow standalone`` against it (``demo_ui.py``), so the DAGs and the cluster
page can be clicked through.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

from airflow_hetero_gpu.demo_setup import SSH_SERVERS, DemoError, Stopped, demo_cluster, demo_env, stop_on_signals
from airflow_hetero_gpu.demo_ui import DEFAULT_PORT, run_ui
from airflow_hetero_gpu.testing.airflow_env import dags_test, migrate
from airflow_hetero_gpu.testing.sshd import SshdError

DEMO_DAG = "hetero_gpu_retrain"

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


#: the DAG run's log, the one file of the demo directory kept after the run
LOG_NAME = "dag-run.log"


def keep_only_the_log(root: Path) -> None:
    """Remove everything of the demo directory but its DAG-run log (the emulated hosts' files, the
    ledger, Airflow's home): the directory the demo named first holds the log afterwards."""
    for entry in root.iterdir():
        if entry.name == LOG_NAME:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def run_demo(dags: Path, *, epochs: int, gpus: int, keep: bool = False, ssh_server: str = "auto",
             out=sys.stdout) -> int:
    root = Path(tempfile.mkdtemp(prefix="hetero-gpu-demo-"))
    narrator = Narrator(out)
    with stop_on_signals():
        try:
            out.write(f"demo directory: {root} (the DAG run's log stays there: {LOG_NAME})\n")
            with demo_cluster(root / "cluster", ssh_server, out) as cluster:
                for host in cluster.hosts:
                    out.write(f"  emulated host {host.name:10s} ssh {cluster.user}@{host.address}:{host.port}\n")
                env = demo_env(root, cluster, dags)
                out.write("preparing Airflow (SQLite metadata database)...\n")
                out.flush()
                migrate(env)
                out.write(f"running DAG {DEMO_DAG}: gate -> train ({gpus} GPUs, {epochs} epochs) -> evaluate\n")
                out.flush()
                result = dags_test(DEMO_DAG, env, conf={"gpu_count": gpus, "epochs": epochs}, stream=narrator)
                ok = result.returncode == 0 and "state=success" in result.stdout
                out.write(f"\n{'demo finished' if ok else 'demo FAILED'}\n")
                return 0 if ok else 1
        except Stopped as sig:
            out.write(f"\ndemo stopped ({sig}): stopping the emulated hosts and removing {root} but its log\n")
            return 143
        except KeyboardInterrupt:
            out.write(f"\ndemo interrupted: stopping the emulated hosts and removing {root} but its log\n")
            return 130
        finally:
            log = root / LOG_NAME
            if narrator.lines:
                log.write_text("".join(narrator.lines), encoding="utf-8")
            if keep:
                out.write(f"demo directory kept: {root}\n")
            elif log.exists():
                keep_only_the_log(root)
            else:
                shutil.rmtree(root, ignore_errors=True)
            if log.exists():
                out.write(f"DAG run log: {log}\n")
            out.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m airflow_hetero_gpu.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--dags-folder", type=Path, default=None, help="default: the repository's dags/")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--ui", action="store_true", help="run `airflow standalone` against the emulated cluster")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT,
                    help=f"with --ui: the port of Airflow's UI (default {DEFAULT_PORT})")
    ap.add_argument("--ssh-server", choices=SSH_SERVERS, default="auto",
                    help="the emulated hosts' SSH server: a real sshd each, the embedded one, or sshd "
                         "where installed (auto, the default)")
    ap.add_argument("--keep", action="store_true", help="keep the demo directory")
    args = ap.parse_args(argv)
    dags = (args.dags_folder or default_dags_folder()).resolve()
    if not (dags / f"{DEMO_DAG}.py").exists():
        print(f"demo: {dags} has no {DEMO_DAG}.py (give --dags-folder)", file=sys.stderr)
        return 2
    try:
        if args.ui:
            return run_ui(dags, port=args.port, ssh_server=args.ssh_server)
        return run_demo(dags, epochs=args.epochs, gpus=args.gpus, keep=args.keep, ssh_server=args.ssh_server)
    except (DemoError, SshdError, RuntimeError, OSError) as err:
        print(f"demo: {' '.join(str(err).split())[:2000]}", file=sys.stderr)
        return 2 if isinstance(err, DemoError) else 1


if __name__ == "__main__":
    sys.exit(main())
