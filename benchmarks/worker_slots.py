"""Worker slots held by N running trainings whose run phase is deferred (``deferrable=True``).

::

    python benchmarks/worker_slots.py                 # 50 trainings of 1 GPU on 25 hosts
    python benchmarks/worker_slots.py --jobs 4 --window 10   # a quick try (about 2.5 min)

A Celery deployment as the deployment tests start it (api-server, scheduler, dag-processor,
triggerer, two Celery workers of 8 slots, PostgreSQL for Airflow and the ledger, Redis) and an
emulated fleet (real sshd per host, 2 GPUs a host). N runs of the test DAG
``hg_durable_deferred_test`` (tests/dags/hg_operator_test.py): durable, ``deferrable=True``, a
``command=`` job of one GPU each (a shell loop printing a line every 2 s until its run's stop file
appears, in place of a training). Every second, from the triggers on, the benchmark reads the task
instances' states from the metadata database and the jobs' processes on the hosts (by their
``HETERO_GPU_JOB_ID`` marker). Printed: the task instances ``running`` (each holds a worker slot),
``deferred`` (none), ``queued`` and ``scheduled`` at the first sample where every job runs on its
host; the peak of ``running`` while the jobs started; the same over ``--window`` seconds once
every task deferred; then every run is stopped (its stop file) and waited for (all ``success``).
Without ``deferrable`` each running training holds a slot for its whole life: N trainings need N
slots (16 here: the rest would wait in Celery's queue).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DAG = "hg_durable_deferred_test"
LEDGER_CONN_ID = "hetero_gpu_ledger"


def _job_of(pid: int) -> str | None:
    """The job id in a process's environment (``HETERO_GPU_JOB_ID``), None when gone."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"HETERO_GPU_JOB_ID="):
            return item.split(b"=", 1)[1].decode()
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--window", type=float, default=20.0, help="seconds sampled once every task deferred")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--concurrency", type=int, default=8, help="slots of each of the two Celery workers")
    parser.add_argument("--samples", help="write every sample (seconds, states, jobs running) to this JSON file")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONPATH", str(ROOT))  # Airflow's components and tasks run this checkout's code

    import subprocess

    from airflow_hetero_gpu.operators.hetero_train import default_job_id
    from airflow_hetero_gpu.testing import EmulatedCluster, procs
    from airflow_hetero_gpu.testing.airflow_env import connection_env
    from airflow_hetero_gpu.testing.celery_deployment import CeleryDeployment
    from airflow_hetero_gpu.testing.demo import A100_80, HGX_A100_BUS, make_gpus, small_hosts
    from airflow_hetero_gpu.testing.postgres import PostgresServer
    from airflow_hetero_gpu.testing.redis_server import RedisServer
    from airflow_hetero_gpu.testing.state import HostSpec

    hosts = (args.jobs + 1) // 2
    topo = small_hosts(1)[0].topology
    specs = [HostSpec(f"slots{n:03d}", make_gpus(f"slots{n:03d}", A100_80, HGX_A100_BUS[:2]), dict(topo))
             for n in range(1, hosts + 1)]
    runs = [f"slots-{n:03d}" for n in range(1, args.jobs + 1)]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hg-slots-", dir="/tmp") as tmp:
        root = Path(tmp)
        stops = root / "stops"
        stops.mkdir()
        pg = PostgresServer().start()
        redis = RedisServer(root / "redis").start()
        try:
            with EmulatedCluster(root / "cluster", specs) as cluster:
                metadata_url, ledger_url = pg.create_database("airflow"), pg.create_database("ledger")
                # the inventory, collected while Airflow migrates its database
                check = subprocess.Popen(
                    [sys.executable, "-m", "airflow_hetero_gpu.cli", "check", "--ledger", ledger_url, "--hosts",
                     cluster.hosts_arg(), "--identity-file", str(cluster.identity_file), "--known-hosts",
                     str(cluster.known_hosts_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                conns, ids = connection_env(cluster, inline_key=True)
                loop = f'while [ ! -e {stops}/"$HG_RUN" ]; do echo tick; sleep 2; done'
                cfg = {"ssh_conn_ids": ids, "workdir": str(root), "gpu_count": 1, "inventory_max_age": 3600,
                       "command": ["sh", "-c", loop], "env": {"HG_RUN": "{{ run_id }}"}}
                durable = {"durable": True, "unattended_timeout": 300, "preemption_grace": 5,
                           "lease_seconds": 320, "host_timeout": 60, "retries": 0}
                ledger_db = ledger_url.rsplit("/", 1)[1]
                env = {**conns,
                       f"AIRFLOW_CONN_{LEDGER_CONN_ID.upper()}": json.dumps(
                           {"conn_type": "postgres", "host": "127.0.0.1", "port": pg.port, "login": "ledger",
                            "schema": ledger_db}),
                       "AIRFLOW__HETERO_GPU__LEDGER_CONN_ID": LEDGER_CONN_ID,
                       "HG_TEST_CONFIG": json.dumps(cfg), "HG_TEST_DURABLE_CONFIG": json.dumps(durable),
                       "AIRFLOW__CORE__PARALLELISM": "32",
                       "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(args.jobs),
                       "AIRFLOW__CORE__MAX_ACTIVE_RUNS_PER_DAG": str(args.jobs)}
                with CeleryDeployment(root / "airflow", ROOT / "tests" / "dags", env, metadata_url=metadata_url,
                                      broker_url=redis.url(), concurrency=args.concurrency) as airflow:
                    out, _ = check.communicate(timeout=args.timeout)
                    if check.returncode != 0:
                        print(out[-3000:])
                        return 1
                    airflow.wait_until_ready(args.timeout)
                    airflow.wait_for_dag(DAG, args.timeout)
                    ready = time.monotonic()
                    with airflow.client() as client:
                        for run_id in runs:
                            airflow.trigger_rest(DAG, run_id, {}, client=client)

                    def states() -> dict[str, int]:
                        rows = airflow.query("select state, count(*) from task_instance where dag_id = ? "
                                             "group by state", DAG)
                        return {str(s): int(n) for s, n in rows}

                    # this benchmark's jobs only: other deployments on the machine may run the same DAG
                    ours = {default_job_id(DAG, "train", run_id) for run_id in runs}

                    def jobs_running() -> int:
                        return len({_job_of(p) for p in procs.with_env_in("HETERO_GPU_JOB_ID", ours)} - {None})

                    def sample(t: float) -> tuple[float, dict[str, int], int]:
                        return (t, states(), jobs_running())

                    # every second from the triggers on: until every job runs on its host and every
                    # task has deferred (or a task ends: a failure, reported)
                    start: list[tuple[float, dict[str, int], int]] = []
                    all_jobs: tuple[float, dict[str, int], int] | None = None
                    while True:
                        tick = time.monotonic()
                        start.append(sample(tick - ready))
                        t, now, jobs = start[-1]
                        if all_jobs is None and jobs >= args.jobs:
                            all_jobs = start[-1]
                        ended = {k: n for k, n in now.items() if k in ("failed", "up_for_retry", "success")}
                        if ended:
                            print(f"tasks ended while the jobs started ({t:.0f} s): {now}")
                            break
                        if all_jobs is not None and now.get("deferred", 0) == args.jobs:
                            break
                        if t > args.timeout:
                            print(f"not every job ran with its task deferred within {args.timeout:g} s: {now}, "
                                  f"{jobs} jobs with processes on the hosts")
                            break
                        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
                    settled = start[-1][0]
                    window: list[tuple[float, dict[str, int], int]] = []
                    end = time.monotonic() + args.window
                    while all_jobs is not None and time.monotonic() < end:
                        tick = time.monotonic()
                        window.append(sample(tick - ready))
                        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
                    stopping = time.monotonic()
                    for run_id in runs:
                        (stops / run_id).touch()
                    finals = {r: airflow.wait_for_state(DAG, r, None, {"success", "failed"}, args.timeout)
                              for r in runs}
                    done = time.monotonic() - stopping
        finally:
            redis.stop()
            pg.stop()
    peak = max(s.get("running", 0) for _, s, _ in start)
    peak_at = next(t for t, s, _ in start if s.get("running", 0) == peak)
    print(f"{args.jobs} trainings of 1 GPU on {hosts} hosts; 2 Celery workers x {args.concurrency} slots; "
          f"sampled every second ({len(start)} samples while they started)")
    if all_jobs is not None:
        t, s, jobs = all_jobs
        print(f"  all {jobs} jobs running on their hosts {t:.0f} s after the triggers: task instances running "
              f"(a worker slot each) {s.get('running', 0)}, deferred {s.get('deferred', 0)}, queued "
              f"{s.get('queued', 0)}, scheduled {s.get('scheduled', 0)}")
    else:
        print(f"  jobs running on their hosts at most {max(j for _, _, j in start)} of {args.jobs}")
    print(f"  peak of task instances running while the jobs started: {peak} (at {peak_at:.0f} s); "
          f"every task deferred at {settled:.0f} s")
    if window:
        running = [s.get("running", 0) for _, s, _ in window]
        deferred = [s.get("deferred", 0) for _, s, _ in window]
        jobs = [j for _, _, j in window]
        print(f"  then {len(window)} samples over {args.window:g} s: jobs with processes on the hosts "
              f"{min(jobs)}-{max(jobs)}, task instances running {min(running)}-{max(running)}, "
              f"deferred {min(deferred)}-{max(deferred)}")
    print(f"  every run stopped: all ended {done:.0f} s after the stop files, "
          f"{sum(1 for s in finals.values() if s == 'success')} success, "
          f"{sum(1 for s in finals.values() if s != 'success')} other; {time.monotonic() - t0:.0f} s in all")
    if args.samples:
        Path(args.samples).write_text(json.dumps({"start": start, "window": window}))
    return 0 if all(s == "success" for s in finals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
