"""Deferred run phases at scale: what a triggerer pays to watch N running trainings.

::

    python benchmarks/deferred_watch.py                    # 100 jobs on 50 hosts, 60 s window
    python benchmarks/deferred_watch.py --jobs 20 --window 30

One embedded emulated fleet (:class:`~airflow_hetero_gpu.testing.embedded.EmbeddedCluster`, 8 GPUs a
host, each an Airflow ``ssh`` connection, host key pinned) and a SQLite ledger with one stored
collection. Each job gets a reservation of one GPU in the ledger and is launched supervised on its
host, as a durable task launches it (a shell loop printing a line every ``--line-every`` seconds,
standing in for a training's log), then let go of (``RemoteJob.detach``), as the task does before
it defers. A child process then plays the triggerer: one event loop running the real
:class:`~airflow_hetero_gpu.triggers.training.TrainingRunTrigger` of every job (reattach, heartbeats,
relay, lease renewals, the ledger looks every 5 s), its log not printed.

Printed: the child's CPU seconds per watched job per minute in the steady state (every job watched,
measured over ``--window`` seconds), its threads, its resident memory, the SSH connections the
emulator accepted while the triggers started and during the window (per job), and the output
bytes relayed. At the end the triggers are cancelled (they let go of the jobs) and every job is
stopped by its markers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

UNATTENDED_S, GRACE_S = 120.0, 5.0


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Warnings(logging.Handler):
    """Counts the triggers' warnings (the first few printed)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if self.count <= 5:
            print(f"warning: {record.getMessage()[:300]}", file=sys.stderr, flush=True)


def _watching(triggers: list) -> int:
    """Triggers whose job is attached and followed on every host."""
    return sum(1 for t in triggers if t._watcher is not None and t._watcher.job is not None
               and t._watcher.job._runs and all(r.channel is not None for r in t._watcher.job._runs))


def _relayed(triggers: list) -> int:
    """Bytes of output relayed by every trigger so far."""
    return sum(sum(r.relayed) for t in triggers if t._watcher is not None and t._watcher.job is not None
               for r in t._watcher.job._runs)


def child(spec_path: str, window: float) -> int:
    """The triggerer's part: every job's trigger in one event loop."""
    from airflow_hetero_gpu.triggers.training import TrainingRunTrigger  # noqa: PLC0415

    specs = json.loads(Path(spec_path).read_text())
    counter = Warnings()
    logger = logging.getLogger("airflow_hetero_gpu")
    logger.addHandler(counter)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logging.getLogger("paramiko").setLevel(logging.WARNING)

    async def main() -> dict[str, Any]:
        events: list[Any] = []

        async def consume(trigger: TrainingRunTrigger) -> None:
            async for event in trigger.run():
                events.append(event.payload)

        triggers = [TrainingRunTrigger(**kw) for kw in specs]
        t0, cpu0 = time.monotonic(), _cpu()
        tasks = [asyncio.create_task(consume(t)) for t in triggers]
        while _watching(triggers) < len(triggers) and not events:
            await asyncio.sleep(0.2)
            if time.monotonic() - t0 > 300:
                raise SystemExit(f"only {_watching(triggers)} of {len(triggers)} triggers started in 300 s")
        start = {"start_s": time.monotonic() - t0, "start_cpu_s": _cpu() - cpu0}
        await asyncio.sleep(5)  # the first looks and heartbeats after the start
        print("READY", flush=True)
        lines0, cpu1, t1 = _relayed(triggers), _cpu(), time.monotonic()
        await asyncio.sleep(window)
        out = {**start, "cpu_s": _cpu() - cpu1, "wall_s": time.monotonic() - t1, "bytes": _relayed(triggers) - lines0,
               "threads": threading.active_count(), "events": events, "warnings": counter.count,
               "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        print("DONE", flush=True)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for trigger in triggers:
            await trigger.cleanup()
        return out

    print(json.dumps(asyncio.run(main()), default=str), flush=True)
    return 0


def _launch(cluster: Any, hook: Any, url: str, jobs: int, line_every: float) -> list[dict[str, Any]]:
    """Reserve one GPU per job and launch each supervised, then let go of it (as a task does
    before it defers); the trigger arguments of each."""
    from airflow_hetero_gpu.collect.freshness import FreshInventory  # noqa: PLC0415
    from airflow_hetero_gpu.core.model import PlanRequest  # noqa: PLC0415
    from airflow_hetero_gpu.launch import Command, LaunchSpec, RemoteJob, Worker, build_commands  # noqa: PLC0415
    from airflow_hetero_gpu.launch.command import HostShare  # noqa: PLC0415
    from airflow_hetero_gpu.launch.supervisor import Supervision  # noqa: PLC0415
    from airflow_hetero_gpu.ledger import Ledger  # noqa: PLC0415

    names = [h.name for h in cluster.hosts]
    targets = hook.ssh_targets(names)
    factory = hook.client_factory(names)
    loop = f"i=0; while :; do i=$((i+1)); echo \"tick $i\"; sleep {line_every}; done"
    specs = []
    with Ledger.from_url(url) as ledger:
        cluster_now = FreshInventory(ledger.inventory(names), 3600).cluster(None)
        for n in range(jobs):
            job_id = f"watch-{n:04d}"
            result = ledger.reserve(job_id, cluster_now, PlanRequest(gpus=1),
                                    lease_seconds=UNATTENDED_S + GRACE_S + 15 + 30)
            (gpu,) = result.decision.gpus
            target = targets[gpu.host]
            launch = f"bench{n:04d}"
            sup = Supervision(UNATTENDED_S, "TERM", GRACE_S, launch)
            (command,) = build_commands(LaunchSpec(job_id, Command(("sh", "-c", loop))),
                                        [HostShare(target.host_name, target.address, (gpu.index,))], 29400, sup)
            job = RemoteJob(job_id, [Worker(target, 0, command)], factory, supervision=sup,
                            keepalive_interval=15, host_timeout=60, on_line=lambda *a: None)
            job.start()
            job.detach()
            specs.append({"job_id": job_id, "launch": launch, "gpus": [[gpu.host, gpu.index, None]],
                          "ssh_conn_ids": dict(hook.hosts), "lease_seconds": UNATTENDED_S + GRACE_S + 15 + 30,
                          "unattended_timeout": UNATTENDED_S, "renew_every": UNATTENDED_S / 2,
                          "preemption_grace": GRACE_S, "host_timeout": 60.0, "max_age": 3600.0, "ledger_url": url})
    return specs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    inner = sub.add_parser("_child", help=argparse.SUPPRESS)
    inner.add_argument("--specs", required=True)
    inner.add_argument("--window", type=float, required=True)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--window", type=float, default=60.0, help="seconds of steady state measured")
    parser.add_argument("--line-every", type=float, default=2.0, help="seconds between two lines of a job")
    args = parser.parse_args(argv)
    if args.command == "_child":
        return child(args.specs, args.window)

    from airflow_hetero_gpu.cli.app import main as hetero_gpu  # noqa: PLC0415 - parent only
    from airflow_hetero_gpu.hooks.hetero_gpu import HeteroGpuHook  # noqa: PLC0415
    from airflow_hetero_gpu.launch.orphans import kill_orphans  # noqa: PLC0415
    from airflow_hetero_gpu.testing.airflow_env import connection_env  # noqa: PLC0415
    from airflow_hetero_gpu.testing.embedded import EmbeddedCluster  # noqa: PLC0415
    from airflow_hetero_gpu.testing.fleets import scale_hosts  # noqa: PLC0415

    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; {args.jobs} jobs on "
          f"{args.hosts} hosts, a line every {args.line_every:g} s each; window {args.window:g} s")
    with tempfile.TemporaryDirectory(prefix="deferred-watch-") as tmp:
        root = Path(tmp)
        with EmbeddedCluster(root / "fleet", scale_hosts(args.hosts)) as cluster:
            conns, ids = connection_env(cluster)
            os.environ.update(conns)
            os.environ.setdefault("AIRFLOW_HOME", str(root / "airflow"))
            url = f"sqlite:///{root / 'ledger.db'}"
            hosts_file = cluster.write_hosts_file(root / "hosts", [h.name for h in cluster.hosts])
            with contextlib.redirect_stdout(io.StringIO()):
                code = hetero_gpu(["collect", "--hosts-file", str(hosts_file), "--identity-file",
                                   str(cluster.identity_file), "--known-hosts", str(cluster.known_hosts_path),
                                   "--ledger", url, "--out", str(root / "captures")])
            if code != 0:
                raise SystemExit(f"collecting the fleet into the ledger failed ({code})")
            hook = HeteroGpuHook(ids)
            t0 = time.perf_counter()
            specs = _launch(cluster, hook, url, args.jobs, args.line_every)
            print(f"{args.jobs} jobs launched and let go of in {time.perf_counter() - t0:.1f} s", flush=True)
            (root / "specs.json").write_text(json.dumps(specs))
            before = sum(cluster.connections_opened().values())
            proc = subprocess.Popen([sys.executable, __file__, "_child", "--specs", str(root / "specs.json"),
                                     "--window", str(args.window)], stdout=subprocess.PIPE, text=True,
                                    env=dict(os.environ, PYTHONPATH=str(ROOT)))
            assert proc.stdout is not None
            marks: dict[str, int] = {}
            result: dict[str, Any] = {}
            for line in proc.stdout:
                if line.strip() in ("READY", "DONE"):
                    marks[line.strip()] = sum(cluster.connections_opened().values())
                elif line.startswith("{"):
                    result = json.loads(line)
            proc.wait()
            try:
                if proc.returncode != 0 or not result:
                    raise SystemExit(f"the watching process failed ({proc.returncode})")
                per_min = result["cpu_s"] / args.jobs / (result["wall_s"] / 60)
                print(f"start: every trigger reattached in {result['start_s']:.1f} s, {result['start_cpu_s']:.1f} CPU s "
                      f"({1000 * result['start_cpu_s'] / args.jobs:.0f} ms a job); "
                      f"{(marks['READY'] - before) / args.jobs:.2f} SSH connections a job")
                print(f"steady ({result['wall_s']:.0f} s): {per_min * 1000:.0f} ms CPU a job a minute "
                      f"({100 * result['cpu_s'] / result['wall_s']:.0f}% of one core for {args.jobs} jobs); "
                      f"{(marks['DONE'] - marks['READY']) / args.jobs:.2f} new SSH connections a job; "
                      f"{result['bytes']} bytes relayed ({result['bytes'] / result['wall_s']:.0f}/s); "
                      f"{result['threads']} threads ({(result['threads'] - 1) / args.jobs:.1f} a job); "
                      f"max RSS {result['rss_mib']:.0f} MiB; events {len(result['events'])}, "
                      f"warnings {result['warnings']}")
            finally:
                for spec in specs:
                    host = spec["gpus"][0][0]
                    kill_orphans(spec["job_id"], [hook.ssh_targets([host])[host]], hook.client_factory([host]),
                                 grace=1.0)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
