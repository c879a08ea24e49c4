"""A day of the whole system, shortened: the real deployment at fleet size on one machine.

:func:`run_day` starts

* an embedded emulated fleet (:class:`~airflow_hetero_gpu.testing.embedded.EmbeddedCluster`) of
  ``hosts`` 8-GPU hosts of four platforms (:func:`~airflow_hetero_gpu.testing.fleets.scale_hosts`:
  NVLink domains of the HGX and DGX samples, PCIe boxes), a few of them with MIG on;
* PostgreSQL (Airflow's metadata and the ledger, two databases), Redis (the Celery broker);
* Airflow with the CeleryExecutor, every component a process of its own: api-server, scheduler,
  dag-processor, triggerer and two Celery workers
  (:class:`~airflow_hetero_gpu.testing.celery_deployment.CeleryDeployment`), on the DAGs of
  ``testing/data/fleet_day_dags``: the health watch (``GpuHealthSensor`` in watch mode,
  deferrable, one check every ``watch_interval`` seconds, over the day's hosts file and one ssh
  connection for them all) and two training DAGs (priorities 0
  and 5, ``HeteroTrainOperator`` with a ``command`` that sleeps, deferrable capacity waits);

fills the ledger with one check of the fleet, applies three teams' quotas (``hetero-gpu teams
apply``), triggers the health watch, then a stream of training runs through the api-server's REST
API (``rate`` a minute for ``minutes``, 1-16 GPUs, three teams, two priorities, preemption on)
and injects faults on the way (an Xid 79 and an uncorrectable ECC error on GPUs that jobs hold,
a host that stops answering and later comes back). It waits for every run to end, then measures
(:mod:`airflow_hetero_gpu.testing.fleet_day_report`). ``benchmarks/fleet_day.py`` is its command
line; ``tests/test_fleet_day.py`` runs a smaller day and asserts the invariants.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from airflow_hetero_gpu.operators.hetero_train import default_job_id
from airflow_hetero_gpu.testing import fleet_day_contention as contention
from airflow_hetero_gpu.testing import procs
from airflow_hetero_gpu.testing.airflow_env import connection_env, fleet_connection
from airflow_hetero_gpu.testing.fleet_day_report import WATCH_DAG, fault_outcomes, job_end, report
from airflow_hetero_gpu.testing.fleet_day_samplers import CpuMeter, Sampler, tree_cpu

DAGS = Path(__file__).with_name("data") / "fleet_day_dags"
TRAIN_DAGS = {0: "fleet_day_train", 5: "fleet_day_urgent"}
LEDGER_CONN_ID = "hetero_gpu_ledger"
#: The health watch's one ssh connection: it reaches every host of the day's hosts file
FLEET_CONN_ID = "hetero_gpu_fleet"
TEAMS_YAML = """\
teams:
  research: {quota: {"*": 32}, weight: 2}
  prod:     {quota: {"*": 16}}
  intern:   {quota: {"*": 8}, borrowing_limit: {"*": 8}}
"""
TEAMS = ("research", "prod", "intern")
#: GPUs a run asks for, and how often
SIZES = ((1, 3), (2, 3), (4, 2), (8, 2), (16, 1))


@dataclass
class DayConfig:
    hosts: int = 1250
    minutes: float = 10.0  # of the training stream
    rate: float = 12.0  # training runs triggered a minute
    job_seconds: tuple[float, float] = (20.0, 60.0)
    watch_interval: float = 60.0
    urgent_share: float = 0.2  # of the runs at priority 5
    concurrency: int = 8  # task slots of each Celery worker
    mig_hosts: int = 3
    server_processes: int = 2
    seed: int = 1
    faults: bool = True
    # the watch's thresholds: a host that stops answering is evicted after this many failed checks
    unreachable_checks: int = 2
    readmit_checks: int = 2
    preemption_min_runtime: float = 20.0
    preemption_delay: float = 15.0
    lease_seconds: float = 120.0  # of the training tasks (a preemption mark is seen within a third)
    # hosts of the contended card type left open (the others drained), with its quotas and an
    # opening burst on it (testing/fleet_day_contention.py); 0: no contended corner
    contended_hosts: int = 0
    settle_timeout: float = 1800.0  # safety net: every run final after the stream
    # safety net for the health watch's first check (its trigger reads the hosts file and one
    # connection, then collects the fleet through worker processes)
    first_check_timeout: float = 1200.0
    root: Path | None = None
    keep: bool = False

    @property
    def stream_seconds(self) -> float:
        return self.minutes * 60.0


@dataclass
class Fault:
    kind: str  # xid79, ecc, host_down, host_back
    host: str
    index: int | None
    at: float  # time.time() of the injection
    job: str | None = None  # the job that held the GPU


@dataclass
class Day:
    """What a day leaves for the report."""

    cfg: DayConfig
    root: Path
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # run id -> dag, job, conf, state
    faults: list[Fault] = field(default_factory=list)
    watch_run: str | None = None
    times: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    final: dict[str, Any] = field(default_factory=dict)
    no_faults_on: set[str] = field(default_factory=set)  # the contended card's hosts


def fleet_specs(cfg: DayConfig):
    """The day's hosts: :func:`scale_hosts`, MIG on GPUs 0-1 of the first ``mig_hosts`` A100 hosts."""
    from airflow_hetero_gpu.testing.demo import enable_mig
    from airflow_hetero_gpu.testing.fleets import scale_hosts

    specs = scale_hosts(cfg.hosts)
    for spec in [s for s in specs if "A100" in s.gpus[0].name][:cfg.mig_hosts]:
        for index in (0, 1):
            enable_mig(spec, index)
    return specs


# --- the day ----------------------------------------------------------------------------------------
def _hetero_gpu(args: list[str], cpu: CpuMeter, timeout: float = 1800) -> str:
    """Run ``hetero-gpu ARGS`` (the provider's own process: its CPU counts as the provider's)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", *args], capture_output=True,
                          text=True, timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu.extra["hetero-gpu commands"] = cpu.extra.get("hetero-gpu commands", 0.0) + (
        after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    if done.returncode != 0:
        raise RuntimeError(f"hetero-gpu {args[0]} failed ({done.returncode}): {(done.stdout + done.stderr)[-2000:]}")
    return done.stdout


def _stream_plan(cfg: DayConfig) -> list[tuple[float, str, dict[str, Any], tuple[int, ...]]]:
    """(seconds after the stream's start, DAG, conf, the runs whose jobs must hold their GPUs
    before it is triggered) of every training run."""
    rng = random.Random(cfg.seed)
    count = max(1, round(cfg.rate * cfg.minutes))
    sizes = [s for s, w in SIZES for _ in range(w)]
    plan = contention.opening_plan(TRAIN_DAGS) if cfg.contended_hosts else []
    for n in range(count):
        priority = 5 if rng.random() < cfg.urgent_share else 0
        conf = {"gpus": rng.choice(sizes), "team": TEAMS[n % len(TEAMS)],
                "seconds": round(rng.uniform(*cfg.job_seconds))}
        plan.append((n * 60.0 / cfg.rate, TRAIN_DAGS[priority], conf, ()))
    return plan


def _fault_plan(cfg: DayConfig) -> list[tuple[float, str]]:
    """(seconds after the stream's start, fault) for the day's faults."""
    if not cfg.faults:
        return []
    s = cfg.stream_seconds
    return [(0.25 * s, "xid79"), (0.40 * s, "ecc"), (0.50 * s, "host_down"), (0.75 * s, "host_back")]


def _held_gpus(ledger_url: str) -> list[tuple[str, str, int]]:
    """(job, host, index) of every whole GPU held now."""
    from airflow_hetero_gpu.ledger import Ledger

    with Ledger.open_existing(ledger_url) as ledger:
        return [(r.job_id, g.host, g.index) for r in ledger.live_reservations() for g in r.gpus
                if g.instance is None]


def _inject(day: Day, cluster, ledger_url: str, kind: str, log: Callable[[str], None]) -> None:
    held = _held_gpus(ledger_url)
    used = {f.host for f in day.faults}
    held_hosts = {h for _, h, _ in held}
    if kind in ("xid79", "ecc"):
        used |= day.no_faults_on
        # the GPU of the job with the longest time left: it still runs when the watch evicts it
        choices = sorted([(j, h, i) for j, h, i in held if h not in used],
                         key=lambda c: -(job_end(day, c[0]) or 0.0))
        if not choices:  # nothing runs: a GPU of an idle host
            choices = [(None, h.name, 3) for h in cluster.hosts[len(cluster.hosts) // 3:] if h.name not in used]
        job, host, index = choices[0]
        if kind == "xid79":
            cluster.add_xid(host, index, 79)
        else:
            cluster.update_gpu(host, index, ecc_uncorrected_volatile=2)
        day.faults.append(Fault(kind, host, index, time.time(), job))
    elif kind == "host_down":  # a host no job runs on (its jobs would fail with it, by design)
        host = next(h.name for h in reversed(cluster.hosts)
                    if h.name not in held_hosts and h.name not in used and h.name not in day.no_faults_on)
        cluster.inject_fault(host, "host_down")
        day.faults.append(Fault(kind, host, None, time.time()))
    elif kind == "host_back":
        down = next(f.host for f in day.faults if f.kind == "host_down")
        cluster.clear_fault(down, "host_down")
        day.faults.append(Fault(kind, down, None, time.time()))
    log(f"fault: {day.faults[-1].kind} on {day.faults[-1].host}"
        + (f" GPU {day.faults[-1].index}" if day.faults[-1].index is not None else "")
        + (f" (held by {day.faults[-1].job})" if day.faults[-1].job else ""))


def _postpone(day: Day, cfg: DayConfig, ledger_url: str, kind: str, at: float) -> bool:
    """Whether a fault waits: a GPU fault until a job that holds a GPU runs on long enough for the
    watch to see it holding it (until 90 % of the stream), the host's return until the watch has
    evicted the host (until the stream's end plus ten minutes)."""
    if kind in ("xid79", "ecc"):  # a GPU of a job with a check's time and more left
        used = day.no_faults_on | {f.host for f in day.faults}
        left = [(job_end(day, j) or 0.0) - time.time() for j, h, _ in _held_gpus(ledger_url) if h not in used]
        return at < 0.9 * cfg.stream_seconds and not any(t >= cfg.watch_interval + 10 for t in left)
    if kind == "host_back":
        down = [o for o in fault_outcomes(day, ledger_url) if o["kind"] == "host_down"]
        return at < cfg.stream_seconds + 600 and bool(down) and down[0]["seen_at"] is None
    return False


def _waits_for_holders(day: Day, cfg: DayConfig, ledger_url: str, after: tuple[int, ...], at: float) -> bool:
    """Whether a run waits for the jobs of earlier runs (by their index among the day's runs) to
    hold their GPUs (until half the stream: then it is triggered whatever holds what)."""
    if not after or at >= 0.5 * cfg.stream_seconds:
        return False
    jobs = list(day.runs.values())
    needed = {jobs[i]["job"] for i in after if i < len(jobs)}
    return len(needed) < len(after) or not needed <= {j for j, _, _ in _held_gpus(ledger_url)}


def _run_states(airflow, dags: list[str]) -> dict[str, str]:
    marks = ",".join("?" for _ in dags)
    return {r: s for r, s in airflow.query(f"select run_id, state from dag_run where dag_id in ({marks})", *dags)}


def run_day(cfg: DayConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run one day; returns the report (:func:`fleet_day_report.report`)."""
    from airflow_hetero_gpu.testing.celery_deployment import CeleryDeployment
    from airflow_hetero_gpu.testing.embedded import EmbeddedCluster
    from airflow_hetero_gpu.testing.postgres import PostgresServer
    from airflow_hetero_gpu.testing.redis_server import RedisServer

    root = Path(cfg.root or tempfile.mkdtemp(prefix="fleet-day-"))
    root.mkdir(parents=True, exist_ok=True)
    results = root / "results"
    results.mkdir(exist_ok=True)
    day = Day(cfg, root)
    cpu = CpuMeter()
    t0 = time.monotonic()
    day.times["started"] = time.time()
    pg = PostgresServer().start()
    redis = RedisServer(root / "redis")
    try:
        redis.start()
        cpu.add("postgresql", lambda: tree_cpu(_postmaster_pid(pg)))
        cpu.add("redis", lambda: tree_cpu(redis.proc.pid))
        metadata_url, ledger_url = pg.create_database("airflow"), pg.create_database("ledger")
        specs = fleet_specs(cfg)
        with EmbeddedCluster(root / "fleet", specs, processes=cfg.server_processes) as cluster:
            log(f"{cfg.hosts} emulated hosts ({8 * cfg.hosts} GPUs, {cfg.mig_hosts} with MIG) started in "
                f"{time.monotonic() - t0:.0f} s")
            cpu.add("emulated fleet (servers)", cluster.server_cpu_seconds)
            hosts_file = cluster.write_hosts_file(root / "hosts")
            check = time.monotonic()
            _hetero_gpu(["check", "--ledger", ledger_url, "--hosts-file", str(hosts_file), "--identity-file",
                         str(cluster.identity_file), "--known-hosts", str(cluster.known_hosts_path)], cpu)
            log(f"the first check filled the ledger in {time.monotonic() - check:.0f} s")
            (root / "teams.yaml").write_text(contention.TEAMS_YAML if cfg.contended_hosts else TEAMS_YAML)
            _hetero_gpu(["teams", "apply", str(root / "teams.yaml"), "--ledger", ledger_url], cpu)
            if cfg.contended_hosts:
                opened, drained = contention.split_hosts(specs, cfg.contended_hosts)
                _hetero_gpu(["drain", *drained, "--reason", "maintenance (the fleet day's contended corner)",
                             "--ledger", ledger_url], cpu)
                day.no_faults_on = {*opened, *drained}
                log(f"{contention.CARD}: {len(opened)} hosts open ({', '.join(opened)}), {len(drained)} drained")
            day.final.update(_deploy_and_stream(day, cfg, cluster, pg, redis, metadata_url, ledger_url, results,
                                                cpu, log, CeleryDeployment, hosts_file=hosts_file))
            day.times["ended"] = time.time()
            day.cpu["total"] = cpu.sample()
            return report(day, ledger_url, results)
    finally:
        redis.stop()
        pg.stop()
        if not cfg.keep and cfg.root is None:
            shutil.rmtree(root, ignore_errors=True)


def _postmaster_pid(pg) -> int:
    return int((Path(pg.root) / "data" / "postmaster.pid").read_text().split()[0])


def _environment(cfg: DayConfig, cluster, pg, ledger_url: str, results: Path, hosts_file: Path) -> dict[str, str]:
    """The deployment's environment: one ssh connection per host (the training tasks launch on
    the hosts they get), the health watch's hosts file and its one connection for them all."""
    conns, ids = connection_env(cluster)
    ledger_db = ledger_url.rsplit("/", 1)[1]
    watch_seconds = cfg.stream_seconds + cfg.settle_timeout + 600
    return {
        **conns,
        f"AIRFLOW_CONN_{FLEET_CONN_ID.upper()}": fleet_connection(cluster),
        f"AIRFLOW_CONN_{LEDGER_CONN_ID.upper()}": json.dumps(
            {"conn_type": "postgres", "host": "127.0.0.1", "port": pg.port, "login": "ledger", "schema": ledger_db}),
        "AIRFLOW__HETERO_GPU__LEDGER_CONN_ID": LEDGER_CONN_ID,
        "AIRFLOW__HETERO_GPU__SSH_CONN_IDS": ",".join(f"{name}={conn}" for name, conn in ids.items()),
        "AIRFLOW__HETERO_GPU__INVENTORY_MAX_AGE": "3600",  # the watch keeps the inventory fresh
        "AIRFLOW__HETERO_GPU__PREEMPTION": "on",
        "AIRFLOW__HETERO_GPU__PREEMPTION_MIN_RUNTIME": str(cfg.preemption_min_runtime),
        "AIRFLOW__HETERO_GPU__PREEMPTION_DELAY": str(cfg.preemption_delay),
        # the ledger's admission pass timings (a debug line per pass) into the task and triggerer logs
        "AIRFLOW__LOGGING__NAMESPACE_LEVELS": "airflow_hetero_gpu.ledger.admission=DEBUG",
        "AIRFLOW__CORE__PARALLELISM": str(4 * cfg.concurrency),
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "1000",
        "AIRFLOW__CORE__MAX_ACTIVE_RUNS_PER_DAG": "1000",
        "HG_FLEET_DAY": json.dumps({
            "results": str(results), "hosts_file": str(hosts_file), "fleet_conn_id": FLEET_CONN_ID,
            "watch_interval": cfg.watch_interval, "watch_seconds": watch_seconds,
            "thresholds": {"unreachable_checks": cfg.unreachable_checks,
                           "readmit_after_healthy_checks": cfg.readmit_checks},
            "capacity_timeout": cfg.settle_timeout + cfg.stream_seconds,
            "lease_seconds": cfg.lease_seconds,
            # a try launched on a host that went down before the watch evicted it fails; its retry
            # comes once the watch has evicted the host
            "retry_delay": cfg.watch_interval * (cfg.unreachable_checks + 1)}),
    }


def _deploy_and_stream(day: Day, cfg: DayConfig, cluster, pg, redis, metadata_url: str, ledger_url: str,
                       results: Path, cpu: CpuMeter, log, deployment_class, *, hosts_file: Path) -> dict[str, Any]:
    env = _environment(cfg, cluster, pg, ledger_url, results, hosts_file)
    started = time.monotonic()
    with deployment_class(day.root / "airflow", DAGS, env, metadata_url=metadata_url, broker_url=redis.url(),
                          concurrency=cfg.concurrency) as airflow:
        for name in airflow.procs:
            cpu.add(f"airflow {name}", lambda name=name: tree_cpu(airflow.procs[name].pid))
        airflow.wait_until_ready(900)
        for dag_id in (WATCH_DAG, *TRAIN_DAGS.values()):
            airflow.wait_for_dag(dag_id, 900)
        log(f"Airflow (CeleryExecutor, 2 workers x {cfg.concurrency} slots) ready in "
            f"{time.monotonic() - started:.0f} s")
        with airflow.client() as client:
            day.watch_run = airflow.trigger_rest(WATCH_DAG, "fleet-day-watch", client=client)
            watch_started = time.monotonic()
            airflow.wait_for(lambda: _watch_checks(ledger_url) >= 1, cfg.first_check_timeout,
                             "the health watch's first check")
            day.times["first_watch_check_s"] = time.monotonic() - watch_started
            log(f"the health watch made its first check {day.times['first_watch_check_s']:.0f} s after its trigger; "
                "the stream starts")
            sampler = Sampler(ledger_url, cluster.marker, cpu)
            sampler.start()
            day.cpu["before stream"] = cpu.sample()
            try:
                _stream(day, cfg, airflow, client, cluster, ledger_url, log)
                day.times["stream_end"] = time.time()
                _settle(day, cfg, airflow, log)
                day.times["settled"] = time.time()
                day.cpu["stream"] = cpu.sample()
                _wait_faults_seen(day, cfg, airflow, ledger_url)
            finally:
                sampler.stop()
        day.final["watch_state"] = airflow.task_state(WATCH_DAG, day.watch_run, "watch")
        day.final["orphans"] = _orphans(airflow, cluster)
        day.final["task_logs"] = {r: airflow.task_log(info["dag"], r, "train") for r, info in day.runs.items()}
        day.final["admission_lines"] = _admission_lines(day.root / "airflow")
        day.cpu["at end"] = cpu.sample()
    return {"sampler": {"samples": sampler.samples, "twice": sampler.twice, "held_twice": sampler.held_twice,
                        "outside": sampler.outside, "max_live": sampler.max_live, "max_gpus": sampler.max_gpus,
                        "error": repr(sampler.error) if sampler.error else None}}


def _watch_checks(ledger_url: str) -> int:
    """Collections the health watch stored (its collector names the sensor)."""
    from sqlalchemy import func, select

    from airflow_hetero_gpu.ledger import Ledger
    from airflow_hetero_gpu.ledger.schema import collections as coll_t

    with Ledger.open_existing(ledger_url) as ledger, ledger.db.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(coll_t).where(
            coll_t.c.collector.like(f"GpuHealthSensor {WATCH_DAG}/%"))).scalar_one())


def _stream(day: Day, cfg: DayConfig, airflow, client, cluster, ledger_url: str, log) -> None:
    plan = _stream_plan(cfg)
    faults = _fault_plan(cfg)
    begin = time.monotonic()
    day.times["stream_start"] = time.time()
    events = sorted([(at, "run", (dag, conf, after)) for at, dag, conf, after in plan]
                    + [(at, "fault", kind) for at, kind in faults], key=lambda e: e[0])
    late = []
    n = -1
    while n + 1 < len(events):
        n += 1
        at, what, data = events[n]
        wait = at - (time.monotonic() - begin)
        if wait > 0:
            time.sleep(wait)  # the stream's pace (what is measured waits on events)
        else:
            late.append(-wait)
        if what == "fault":
            if _postpone(day, cfg, ledger_url, data, at):  # again in a few seconds (events stay in order)
                events[n + 1:] = sorted([*events[n + 1:], (at + 5.0, what, data)], key=lambda e: e[0])
                continue
            _inject(day, cluster, ledger_url, data, log)
            continue
        dag_id, conf, after = data
        if _waits_for_holders(day, cfg, ledger_url, after, at):  # again in a second (events stay in order)
            events[n + 1:] = sorted([*events[n + 1:], (at + 1.0, what, data)], key=lambda e: e[0])
            continue
        run_id = f"day-{len(day.runs):05d}"
        airflow.trigger_rest(dag_id, run_id, conf, client=client)
        day.runs[run_id] = {"dag": dag_id, "conf": conf, "job": default_job_id(dag_id, "train", run_id),
                            "triggered": time.time()}
        if len(day.runs) % 10 == 0:
            states = _run_states(airflow, list(TRAIN_DAGS.values()))
            log(f"  {time.monotonic() - begin:5.0f} s: {len(day.runs)} runs triggered, "
                f"{sum(s == 'success' for s in states.values())} succeeded, "
                f"{sum(s == 'running' for s in states.values())} running")
    day.times["trigger_late_max"] = max(late, default=0.0)


def _settle(day: Day, cfg: DayConfig, airflow, log) -> None:
    """Wait until every training run is final (an event in the metadata database)."""
    def final():
        states = _run_states(airflow, list(TRAIN_DAGS.values()))
        return states if all(states.get(r) in ("success", "failed") for r in day.runs) else None

    states = airflow.wait_for(final, cfg.settle_timeout, "every training run final", poll=5)
    for run_id, state in states.items():
        if run_id in day.runs:
            day.runs[run_id]["state"] = state
    log(f"every run final {time.time() - day.times['stream_end']:.0f} s after the stream: "
        f"{sum(s == 'success' for s in states.values())} succeeded, {sum(s == 'failed' for s in states.values())} failed")


def _wait_faults_seen(day: Day, cfg: DayConfig, airflow, ledger_url: str) -> None:
    """Wait (safety net: a few watch intervals) until each fault is an eviction / readmission."""
    budget = cfg.watch_interval * (cfg.unreachable_checks + cfg.readmit_checks + 3) + 300
    try:
        airflow.wait_for(lambda: all(o["seen_at"] is not None for o in fault_outcomes(day, ledger_url)), budget,
                         "every injected fault recorded in the ledger", poll=5)
    except TimeoutError:  # the report shows which was not
        pass


def _orphans(airflow, cluster) -> list[int]:
    """Job processes left on the emulated hosts once every run is final (waited for a while: a
    stopped job's processes take a moment to go)."""
    try:
        airflow.wait_for(lambda: not procs.with_env_marker(cluster.marker + ".", prefix=True), 120,
                         "no process left on the emulated hosts", poll=2)
    except TimeoutError:
        pass
    return sorted(procs.with_env_marker(cluster.marker + ".", prefix=True))


def _admission_lines(home: Path) -> list[str]:
    """The ledger's admission pass lines in every log of the deployment, each pass once."""
    seen: dict[str, str] = {}
    for path in home.rglob("*.log"):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            at = line.find("ledger: admission pass at ")
            if at >= 0:
                message = line[at:].split('"', 1)[0].split("\\", 1)[0]
                seen.setdefault(message.split(" ms", 1)[0], message)
    return list(seen.values())


__all__ = ["DayConfig", "run_day", "fleet_specs"]
