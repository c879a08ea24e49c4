"""One health check of 10, 100 and 1,000 emulated hosts (``hetero-gpu check``), first and steady state.

::

    python benchmarks/health_check_scale.py                        # 10,100,1000 hosts
    python benchmarks/health_check_scale.py --hosts 100 --checks 4 --interval 2

One embedded emulated fleet (:class:`~airflow_hetero_gpu.testing.embedded.EmbeddedCluster`, 8 GPUs
a host, its own address and host key each, ``--processes`` server processes) serves every size;
a fleet of N is its first N hosts (``--hosts-file``). Per size, in a fresh child process each (so
the collector's CPU is measured alone):

- ``first``: ``hetero-gpu check --ledger URL --hosts-file F --json``, the real command's code
  path (``airflow_hetero_gpu.cli.app``): every host collected over new connections (host keys
  verified), judged, the evictions and the inventory written to a SQLite ledger. ``--reps`` runs.
- ``steady``: ``hetero-gpu check --interval S --count K`` (a check begins every S seconds): the
  connections stay open between checks (:class:`~airflow_hetero_gpu.collect.persistent.KeptConnections`);
  checks 2..K are the steady state. After check 2 an Xid 79 is logged on GPU 3 of the middle host
  and GPU 5 of the last host gets an uncorrectable ECC error (that host was read at the very end
  of check 2: the worst case, its next read is a whole interval later); the parent polls the
  ledger from then on and reports when each fault became an eviction row, against the bound
  ``interval + 2 s``. Two watches per size: ``parts`` as shipped (the check records its hosts in
  a ledger transaction every second as they answer, :mod:`airflow_hetero_gpu.healthcheck.parts`)
  and the baseline ``whole`` (the same check with one transaction at its end, as before;
  ``--no-baseline`` skips it).

Each check is timed in the child around ``HealthWatch.check`` (wall and the process's CPU), the
SSH connections are counted at the emulated server. Printed per size and watch: median wall and
CPU per host of the first check and of the steady-state checks, connections opened, the ratio
first / steady measured in the same run, the fault-to-eviction times and the ratio whole / parts
of the slower of the two.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# ---------------------------------------------------------------------------------------------
# The child: the real command, each check timed
# ---------------------------------------------------------------------------------------------

def child(argv: list[str]) -> int:
    from airflow_hetero_gpu.cli.app import main as hetero_gpu  # noqa: PLC0415
    from airflow_hetero_gpu.healthcheck.check import HealthWatch  # noqa: PLC0415

    check = HealthWatch.check

    def timed(self: HealthWatch):
        cpu0, wall0 = _cpu(), time.perf_counter()
        report = check(self)
        print(json.dumps({"timing": {"check": report.number, "wall": time.perf_counter() - wall0,
                                     "cpu": _cpu() - cpu0}}), file=sys.stderr, flush=True)
        return report

    HealthWatch.check = timed  # instrumentation only: the command runs as shipped
    window = os.environ.get(PART_WINDOW_ENV)
    if window:  # the baseline: one ledger transaction per check ("whole")
        init = HealthWatch.__init__

        def with_window(self: HealthWatch, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **{**kwargs, "part_window": float(window)})

        HealthWatch.__init__ = with_window  # type: ignore[method-assign]
    return hetero_gpu(["check", *argv])


#: The child's part window when set (``whole``: longer than any check, so one transaction a check).
PART_WINDOW_ENV = "HETERO_GPU_BENCH_PART_WINDOW"
MODES = {"parts": None, "whole": "1e9"}


def _cpu() -> float:
    """CPU seconds of this process, of its children waited for, and of its collector worker
    processes still running (a watch keeps them, with their connections, between checks)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    children = [c for task in Path(f"/proc/{os.getpid()}/task").iterdir()
                for c in (task / "children").read_text().split()]
    for child in children:
        try:
            fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


class Child:
    """A ``hetero-gpu check`` child; its JSON report lines and timing lines, as they come."""

    def __init__(self, args: list[str], part_window: str | None = None):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop(PART_WINDOW_ENV, None)
        if part_window is not None:
            env[PART_WINDOW_ENV] = part_window
        self.proc = subprocess.Popen([sys.executable, __file__, "_child", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1, env=env)
        self.reports: queue.Queue[tuple[float, dict[str, Any] | None]] = queue.Queue()
        self.timings: list[dict[str, Any]] = []
        self.errors: list[str] = []
        threading.Thread(target=self._out, daemon=True).start()
        self._err_thread = threading.Thread(target=self._err, daemon=True)
        self._err_thread.start()

    def _out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.reports.put((time.monotonic(), json.loads(line)))
        self.reports.put((time.monotonic(), None))

    def _err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if line.startswith('{"timing"'):
                self.timings.append(json.loads(line)["timing"])
            else:
                self.errors.append(line.rstrip())

    def next_report(self, timeout: float = 1800) -> tuple[float, dict[str, Any]]:
        when, report = self.reports.get(timeout=timeout)
        if report is None:
            raise SystemExit(f"hetero-gpu check ended early ({self.proc.wait()}): {self.errors[-20:]}")
        return when, report

    def finish(self) -> None:
        code = self.proc.wait(timeout=1800)
        self._err_thread.join(60)
        if code != 0:
            raise SystemExit(f"hetero-gpu check exited {code}: {self.errors[-20:]}")


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------

def evicted(report: dict[str, Any], host: str, index: int) -> bool:
    return any(e["host"] == host and e["index"] == index for e in report["evicted"] + report["evicted_now"])


def measure(cluster: Any, root: Path, size: int, reps: int, checks: int, interval: float,
            modes: list[str]) -> dict[str, Any]:
    names = [h.name for h in cluster.hosts[:size]]
    hosts_file = cluster.write_hosts_file(root / f"hosts-{size}", names)
    ledger = f"sqlite:///{root / f'ledger-{size}.db'}"
    common = ["--hosts-file", str(hosts_file), "--identity-file", str(cluster.identity_file),
              "--known-hosts", str(cluster.known_hosts_path), "--ledger", ledger, "--json"]
    out: dict[str, Any] = {"first": []}
    for rep in range(reps):
        opened = sum(cluster.connections_opened().values())
        one = Child(common)
        _, report = one.next_report()
        one.finish()
        if report["collected"] != size:
            raise SystemExit(f"first check: {report['collected']}/{size} hosts collected")
        timing = one.timings[0]
        timing["connections"] = sum(cluster.connections_opened().values()) - opened
        out["first"].append(timing)
        print(f"  {size:>5} hosts first  rep {rep + 1}: {timing['wall']:6.2f} s, collector CPU "
              f"{1000 * timing['cpu'] / size:5.1f} ms/host, {timing['connections']} connections",
              file=sys.stderr, flush=True)

    for mode in modes:
        out[mode] = _watch(cluster, names, common, ledger, size, checks, interval, mode)
    return out


class _EvictionClock:
    """Polls the ledger from the injection on; when each injected fault became an eviction row."""

    def __init__(self, url: str, faults: dict[str, tuple[str, int]]):
        self.url, self.faults, self.injected = url, faults, time.monotonic()
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        from airflow_hetero_gpu.ledger import Ledger  # noqa: PLC0415

        while not self._stop.is_set() and len(self.seen) < len(self.faults):
            with Ledger.open_existing(self.url) as led:
                evicted = {(k.host, k.index) for k in led.evicted_map()}
            now = time.monotonic()
            for label, key in self.faults.items():
                if label not in self.seen and key in evicted:
                    self.seen[label] = now - self.injected
            self._stop.wait(0.05)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(60)
        return dict(self.seen)


def _watch(cluster: Any, names: list[str], common: list[str], ledger: str, size: int, checks: int,
           interval: float, mode: str) -> dict[str, Any]:
    """One steady-state watch (connections kept), a fault injected after its check 2."""
    from airflow_hetero_gpu.ledger import Ledger  # noqa: PLC0415

    xid_host, ecc_host = names[len(names) // 2], names[-1]
    faults = {"xid79": (xid_host, 3), "ecc": (ecc_host, 5)}
    opened_before = sum(cluster.connections_opened().values())
    watch = Child([*common, "--interval", str(interval), "--count", str(checks)], MODES[mode])
    clock: _EvictionClock | None = None
    reported: dict[str, float] = {}
    connections_steady = None
    for number in range(1, checks + 1):
        when, report = watch.next_report()
        if report["collected"] != size:
            print(f"  check {number}: {report['collected']}/{size} collected", file=sys.stderr)
        if number == 1:
            connections_steady = sum(cluster.connections_opened().values())
        if clock is not None:
            for label, (host, index) in faults.items():
                if label not in reported and evicted(report, host, index):
                    reported[label] = when - clock.injected
        if number == 2:
            cluster.add_xid(xid_host, 3, 79)
            cluster.update_gpu(ecc_host, 5, ecc_uncorrected_volatile=3)
            clock = _EvictionClock(ledger, faults)
    watch.finish()
    found = clock.stop() if clock is not None else {}
    with Ledger.from_url(ledger) as led:
        in_ledger = {(k.host, k.index) for k in led.evicted_map()}
        for label, (host, index) in faults.items():  # readmitted for the next watch
            if (host, index) in in_ledger:
                led.uncordon(host, index)
    timings = sorted(watch.timings, key=lambda t: t["check"])
    for t in timings:
        print(f"  {size:>5} hosts {mode} watch check {t['check']}: {t['wall']:6.2f} s, collector CPU "
              f"{1000 * t['cpu'] / size:5.1f} ms/host", file=sys.stderr, flush=True)
    # the hosts are healthy again for the next watch
    cluster.update_gpu(ecc_host, 5, ecc_uncorrected_volatile=0)
    cluster.set_state(xid_host, xid=[])
    return {"steady": timings[1:], "steady_first": timings[0],
            "steady_connections": sum(cluster.connections_opened().values()) - (connections_steady or 0),
            "watch_connections": sum(cluster.connections_opened().values()) - opened_before,
            "faults": found, "reported": reported,
            "in_ledger": tuple(key in in_ledger for key in faults.values())}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_child"]:
        return child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="10,100,1000", help="fleet sizes, comma separated")
    parser.add_argument("--reps", type=int, default=3, help="first checks per size")
    parser.add_argument("--checks", type=int, default=5, help="checks of the steady-state watch (>= 3)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between the watch's checks")
    parser.add_argument("--processes", type=int, default=1, help="server processes of the emulated fleet")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the baseline watch (one ledger transaction per check, 'whole')")
    args = parser.parse_args(argv)
    modes = ["parts"] if args.no_baseline else ["parts", "whole"]
    from airflow_hetero_gpu.testing.embedded import EmbeddedCluster  # noqa: PLC0415 - parent only
    from airflow_hetero_gpu.testing.fleets import scale_hosts  # noqa: PLC0415

    sizes = sorted({int(v) for v in args.hosts.split(",")})
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; first checks: {args.reps} "
          f"per size; watch: {args.checks} checks every {args.interval:g} s (connections kept)")
    results = {}
    with tempfile.TemporaryDirectory(prefix="health-check-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        with EmbeddedCluster(root / "fleet", scale_hosts(max(sizes)), processes=args.processes) as cluster:
            print(f"{max(sizes)} emulated hosts started in {time.perf_counter() - started:.1f} s "
                  f"({args.processes} server process(es))")
            for size in sizes:
                results[size] = measure(cluster, root, size, args.reps, args.checks, args.interval, modes)
    print(f"{'hosts':>5} {'watch':<5} {'first: wall':>11} {'CPU/host':>9} {'conns':>6} {'steady: wall':>12} "
          f"{'CPU/host':>9} {'conns':>6} {'first/steady':>12}  fault -> eviction row in the ledger "
          f"(bound interval + 2 s = {args.interval + 2:g} s)")
    for size, r in results.items():
        first_wall = statistics.median(t["wall"] for t in r["first"])
        first_cpu = statistics.median(t["cpu"] for t in r["first"]) / size
        for mode in modes:
            w = r[mode]
            steady_wall = statistics.median(t["wall"] for t in w["steady"])
            steady_cpu = statistics.median(t["cpu"] for t in w["steady"]) / size
            faults = ", ".join(f"{k} {v:.2f} s" for k, v in sorted(w["faults"].items())) or "not seen"
            worst = max(w["faults"].values(), default=float("nan"))
            base = max(r[modes[-1]]["faults"].values(), default=float("nan"))
            ratio = f"  whole/parts {base / worst:.2f}x" if mode == "parts" and len(modes) > 1 else ""
            print(f"{size:>5} {mode:<5} {first_wall:9.2f} s {1000 * first_cpu:6.1f} ms "
                  f"{max(t['connections'] for t in r['first']):>6} {steady_wall:10.2f} s {1000 * steady_cpu:6.1f} ms "
                  f"{w['steady_connections']:>6} {first_wall / steady_wall:11.1f}x  {faults}; in the ledger: "
                  f"{all(w['in_ledger'])}; within the bound: {worst <= args.interval + 2}{ratio}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
