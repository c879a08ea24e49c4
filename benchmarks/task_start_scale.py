"""Task start at fleet scale: from ``HeteroTrainOperator.execute()`` to the job running on its host.

::

    python benchmarks/task_start_scale.py                       # 10, 100, 1000 hosts, 3 reps
    python benchmarks/task_start_scale.py --hosts 10,100 --reps 2 --no-collect
    python benchmarks/task_start_scale.py --reps 5 --collect-reps 1

One embedded emulated fleet (:class:`~airflow_hetero_gpu.testing.embedded.EmbeddedCluster`, 8 GPUs
a host, every host its own 127.x address and host key) serves every size; a fleet of N is its
first N hosts, each an Airflow ``ssh`` connection (``AIRFLOW_CONN_*``, host key pinned). Per size a
SQLite ledger gets one collection of the N hosts first (``hetero-gpu collect --ledger``, what the
health watch does). Then, in a fresh child process per run (as a task runs in a fresh process),
the real operator runs: ``HeteroTrainOperator(gpu_count=8, command=[...]).execute(context)`` with
a minimal task-instance context: placement from the ledger's inventory (collecting the stale hosts
only), the reservation, the sweep of leftovers, the launch over SSH, the run, the release. The
command launched prints the host's clock (``date +%s.%N``), so the figure is the time from the
start of ``execute()`` to the command running on the chosen host (both on this machine's clock).

Sizes and modes are interleaved within each repetition. Modes:

- ``fresh``: ``inventory_max_age=3600``: the stored inventory is used, no host is collected;
- ``collect`` (unless ``--no-collect``): ``inventory_max_age=0``: every host is collected first.

Printed per size and mode: median / min / max seconds to the command running, the median of the
whole ``execute()``, SSH connections (and sessions) the emulator accepted during the run (the
chosen host's and all others'), and the ratio of the median against the 10-host ``fresh`` figure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GPUS = 8  # the whole of one scale host: the job is on one host


# ---------------------------------------------------------------------------------------------
# One execute(), in a child process
# ---------------------------------------------------------------------------------------------

class _TaskInstance:
    """What ``execute()`` reads of its task instance, and the XComs it pushes."""

    dag_id, task_id, map_index, try_number = "task_start_scale", "train", -1, 1

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


def child(args: argparse.Namespace) -> int:
    import logging  # noqa: PLC0415

    from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator  # noqa: PLC0415

    logging.basicConfig(level=logging.WARNING)
    ids = json.loads(Path(args.conn_ids).read_text())
    op = HeteroTrainOperator(task_id="train", gpu_count=GPUS, command=["date", "+%s.%N"], ssh_conn_ids=ids,
                             ledger_url=args.ledger, inventory_max_age=args.max_age, lease_seconds=120)
    lines: list[tuple[str, str]] = []
    op._on_line = lambda host, rank, stream, line: lines.append((host, line))  # the launched command's output
    ti = _TaskInstance(args.run_id)
    profile = None
    if args.profile:
        import cProfile  # noqa: PLC0415

        profile = cProfile.Profile()
        profile.enable()
    started = time.time()
    out = op.execute({"ti": ti})
    ended = time.time()
    if profile is not None:
        profile.disable()
        profile.dump_stats(args.profile)
    ran = [float(line) for host, line in lines if line.strip().replace(".", "", 1).isdigit()]
    if not ran:
        raise SystemExit(f"the command printed no time: {lines}")
    print(json.dumps({"to_running": ran[0] - started, "execute": ended - started, "hosts": out["hosts"],
                      "collected_now": (ti.xcom.get("decision") or {}).get("inventory", {}).get("collected_now")}))
    return 0


def run_child(cluster: Any, env: dict[str, str], conn_ids: Path, ledger: str, max_age: float,
              run_id: str, profile: str | None = None) -> dict[str, Any]:
    opened, sessions = cluster.connections_opened(), cluster.sessions_opened()
    argv = [sys.executable, __file__, "_child", "--conn-ids", str(conn_ids), "--ledger", ledger,
            "--max-age", str(max_age), "--run-id", run_id] + (["--profile", profile] if profile else [])
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=3600, env=env)
    if done.returncode != 0:
        raise SystemExit(f"execute() failed: {done.stderr.strip()[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    after_opened, after_sessions = cluster.connections_opened(), cluster.sessions_opened()
    used = set(result["hosts"])
    new = {h: after_opened[h] - opened[h] for h in after_opened}
    result["conns_used"] = sum(n for h, n in new.items() if h in used)
    result["conns_other"] = sum(n for h, n in new.items() if h not in used)
    result["sessions"] = sum(after_sessions[h] - sessions[h] for h in after_sessions)
    return result


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    inner = sub.add_parser("_child", help=argparse.SUPPRESS)
    for name in ("--conn-ids", "--ledger", "--run-id"):
        inner.add_argument(name, required=True)
    inner.add_argument("--max-age", type=float, required=True)
    inner.add_argument("--profile")
    parser.add_argument("--hosts", default="10,100,1000", help="fleet sizes, comma separated")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-collect", action="store_true", help="skip the inventory_max_age=0 runs")
    parser.add_argument("--collect-reps", type=int, default=None,
                        help="repetitions of the inventory_max_age=0 runs (default --reps; each collects the fleet)")
    parser.add_argument("--profile", metavar="DIR", help="write a cProfile of each execute() here")
    args = parser.parse_args(argv)
    if args.command == "_child":
        return child(args)

    from airflow_hetero_gpu.cli.app import main as hetero_gpu  # noqa: PLC0415 - parent only
    from airflow_hetero_gpu.testing.airflow_env import connection_env  # noqa: PLC0415
    from airflow_hetero_gpu.testing.embedded import EmbeddedCluster  # noqa: PLC0415
    from airflow_hetero_gpu.testing.fleets import scale_hosts  # noqa: PLC0415

    sizes = sorted({int(v) for v in args.hosts.split(",")})
    modes = [("fresh", 3600.0)] + ([] if args.no_collect else [("collect", 0.0)])
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; job: {GPUS} GPUs "
          f"(one host), command 'date +%s.%N'; {args.reps} reps")
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="task-start-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        with EmbeddedCluster(root / "fleet", scale_hosts(max(sizes))) as cluster:
            print(f"{max(sizes)} emulated hosts started in {time.perf_counter() - started:.1f} s")
            conns, ids = connection_env(cluster)
            env = dict(os.environ, **conns, PYTHONPATH=str(ROOT), AIRFLOW_HOME=str(root / "airflow"))
            prepared = {}
            for size in sizes:  # one stored collection per fleet size first
                names = [h.name for h in cluster.hosts[:size]]
                conn_ids = root / f"conn-ids-{size}.json"
                conn_ids.write_text(json.dumps({n: ids[n] for n in names}))
                ledger = f"sqlite:///{root / f'ledger-{size}.db'}"
                hosts_file = cluster.write_hosts_file(root / f"hosts-{size}", names)
                t0 = time.perf_counter()
                with contextlib.redirect_stdout(io.StringIO()):  # a line per host
                    code = hetero_gpu(["collect", "--hosts-file", str(hosts_file), "--identity-file",
                                       str(cluster.identity_file), "--known-hosts", str(cluster.known_hosts_path),
                                       "--ledger", ledger, "--out", str(root / f"captures-{size}")])
                if code != 0:
                    raise SystemExit(f"collecting {size} hosts into the ledger failed ({code})")
                print(f"  {size} hosts: one collection stored in the ledger in {time.perf_counter() - t0:.1f} s",
                      file=sys.stderr, flush=True)
                prepared[size] = (conn_ids, ledger)
            # sizes and modes interleaved within each repetition: drift from other load hits all
            for rep in range(args.reps):
                for size in sizes:
                    conn_ids, ledger = prepared[size]
                    for mode, max_age in modes:
                        if mode == "collect" and args.collect_reps is not None and rep >= args.collect_reps:
                            continue
                        run_id = f"run-{size}-{mode}-{rep}"
                        r = run_child(cluster, env, conn_ids, ledger, max_age, run_id,
                                      str(Path(args.profile) / f"{run_id}.pstats") if args.profile else None)
                        results.setdefault((size, mode), []).append(r)
                        print(f"  {size:>5} hosts rep {rep + 1} {mode:<7} to running {r['to_running']:6.2f} s  "
                              f"execute {r['execute']:6.2f} s  connections: job's host {r['conns_used']}, "
                              f"others {r['conns_other']}; sessions {r['sessions']}  on {r['hosts']}",
                              file=sys.stderr, flush=True)
    base = statistics.median(r["to_running"] for r in results[(sizes[0], "fresh")])
    print(f"{'hosts':>5} {'mode':<7} {'to running: median':>18} {'min':>6} {'max':>6} {'execute':>8} "
          f"{'conns job host':>14} {'conns others':>12} {'sessions':>8} {'vs ' + str(sizes[0]) + ' fresh':>12}")
    for (size, mode), values in sorted(results.items()):
        walls = [r["to_running"] for r in values]
        med = statistics.median(walls)
        print(f"{size:>5} {mode:<7} {med:16.2f} s {min(walls):6.2f} {max(walls):6.2f} "
              f"{statistics.median(r['execute'] for r in values):8.2f} "
              f"{max(r['conns_used'] for r in values):>14} {max(r['conns_other'] for r in values):>12} "
              f"{max(r['sessions'] for r in values):>8} {med / base:10.2f}x ({med - base:+.2f} s)")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
