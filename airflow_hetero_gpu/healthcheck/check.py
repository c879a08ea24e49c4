"""The health check of a GPU fleet: collect, judge, record in the ledger, replace, decide.

:class:`HealthWatch` is the one implementation of a *check*; the sensor's poke mode, its
deferrable trigger and ``hetero-gpu check`` all run it:

1. collect the captures of every host over SSH (a collector: ``HeteroGpuHook`` in Airflow,
   plain paramiko on the command line);
2. judge every GPU with the pure watch (:func:`airflow_hetero_gpu.core.watch.evaluate`): SPEC §4
   rules plus the optional ones, Xid lines new since the last check only;
3. record the check in the ledger (evict, count healthy checks, readmit) as the hosts answer:
   every ``part_window`` seconds one transaction for the hosts that answered meanwhile
   (:mod:`.parts`), so a fault is an eviction within about a second of its host's answer; then
   one admission pass of the queue for the whole check (``Ledger.run_admission``);
4. in ``watch`` mode, swap every evicted GPU that a live reservation holds for the best healthy
   GPU of its pool (``Ledger.replace``, SPEC §8 S12); the training operator sees its reservation
   change and restarts its workers;
5. log what changed (evictions with host, index, uuid and reasons; readmissions; replacements;
   new hosts, GPUs and pools since the previous check, S10), emit metrics, and decide whether the
   sensor is done (``gate``: some pool has ``min_healthy`` available GPUs of the wanted type;
   ``watch``: the watch period is over, or the watched reservations are gone).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from airflow_hetero_gpu.collect.records import host_record
from airflow_hetero_gpu.core import watch
from airflow_hetero_gpu.core.changes import diff_inventory
from airflow_hetero_gpu.core.config import ClusterConfig, config_from_text
from airflow_hetero_gpu.core.model import Gpu, GpuKey
from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.healthcheck.metrics import Metrics, job_tags
from airflow_hetero_gpu.healthcheck.parts import DEFAULT_PART_WINDOW_S, collect_in_parts
from airflow_hetero_gpu.healthcheck.spec import GATE_MET, IDLE, WATCH_OVER, WatchSpec, merged_config
from airflow_hetero_gpu.ledger import Ledger, LedgerError, NoLiveReservation
from airflow_hetero_gpu.ledger.fleet import judge_parts

if TYPE_CHECKING:
    from airflow_hetero_gpu.collect.fleet import Collector
    from airflow_hetero_gpu.core.cluster import Cluster


def _gpu_json(key: GpuKey, uuid: str | None) -> dict[str, Any]:
    return {"host": key.host, "index": key.index, "uuid": uuid}


@dataclass
class CheckReport:
    """What one check found (also kept as the last check of a run)."""

    number: int
    steps: list[watch.Step]
    pools: list[dict[str, Any]]
    unhealthy: list[dict[str, Any]]
    gate: dict[str, Any] | None = None
    live_jobs: list[str] = field(default_factory=list)
    evicted: list[dict[str, Any]] = field(default_factory=list)
    readmitted: list[dict[str, Any]] = field(default_factory=list)
    replacements: list[dict[str, Any]] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    evicted_now: list[dict[str, Any]] = field(default_factory=list)  # the ledger's evictions after the check
    collected: int = 0  # hosts collected by this check
    failed: int = 0  # hosts that could not be collected
    orphans: list[dict[str, Any]] = field(default_factory=list)  # jobs without a reservation, stopped


def collector_name(what: str) -> str:
    """Who collected, as the ledger's inventory records it: ``what on HOST pid N``."""
    return f"{what} on {socket.gethostname()} pid {os.getpid()}"


class HealthWatch:
    """The checks of one sensor run: collect, judge, record in the ledger, replace, decide.

    ``hook`` collects: a :class:`~airflow_hetero_gpu.collect.fleet.Collector` (``HeteroGpuHook``
    in Airflow; ``collect()``, ``cluster_config()``, ``fleet_files()``, ``ssh_targets()``,
    ``client_factory()``). ``ledger_url`` names the ledger (None: the default SQLite file);
    every check's collection is stored there (the fleet's inventory). ``collector`` names this
    watch in the inventory's records; ``history`` passes ``history_interval`` /
    ``history_retention`` to the ledger. The run's memory (checks made, events so far, the
    previous inventory) lives in this object; :meth:`to_state` / :meth:`from_state` carry it
    across reschedules. ``part_window``: seconds between the ledger transactions of one check
    (the hosts that answered meanwhile; :mod:`.parts`).
    """

    def __init__(self, spec: WatchSpec, hook: "Collector", ledger_url: str | None, *,
                 log: logging.Logger | logging.LoggerAdapter | None = None, metrics: Metrics | None = None,
                 clock=time.time, collector: str | None = None, history: Mapping[str, float] | None = None,
                 part_window: float = DEFAULT_PART_WINDOW_S):
        if not part_window > 0:
            raise ValueError(f"part_window: expected seconds > 0, got {part_window!r}")
        self.part_window = float(part_window)
        self.spec = spec.validate()
        self.hook = hook
        self.ledger_url = ledger_url
        self.collector = collector or collector_name("health check")
        self.history = dict(history or {})
        self.log = log or logging.getLogger(__name__)
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.checks = 0
        self.last_began: float | None = None  # time.monotonic() when the last check began
        self.started_at: float | None = None
        self.evictions: list[dict[str, Any]] = []
        self.readmissions: list[dict[str, Any]] = []
        self.replacements: list[dict[str, Any]] = []
        self.orphans: list[dict[str, Any]] = []
        self.seen_live = False
        self.last: CheckReport | None = None
        #: The cluster as the last check judged it (health on new Xids only, optional rules).
        self.cluster: Cluster | None = None
        self._inventory: list[list[Any]] | None = None  # [[host, index, uuid, name], ...]
        self._pools: list[str] = []
        self._stuck: set[tuple[str, str, int]] = set()  # (job, host, index) with no replacement, logged

    # -- the run's memory --------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        return {"checks": self.checks, "started_at": self.started_at, "evictions": self.evictions,
                "readmissions": self.readmissions, "replacements": self.replacements,
                "orphans": self.orphans, "seen_live": self.seen_live, "inventory": self._inventory, "pools": self._pools,
                "stuck": sorted(list(s) for s in self._stuck)}

    def from_state(self, state: Mapping[str, Any]) -> "HealthWatch":
        self.checks = int(state.get("checks") or 0)
        self.started_at = state.get("started_at")
        self.evictions = list(state.get("evictions") or [])
        self.readmissions = list(state.get("readmissions") or [])
        self.replacements = list(state.get("replacements") or [])
        self.orphans = list(state.get("orphans") or [])
        self.seen_live = bool(state.get("seen_live"))
        self._inventory = state.get("inventory")
        self._pools = list(state.get("pools") or [])
        self._stuck = {tuple(s) for s in state.get("stuck") or []}  # type: ignore[misc]
        return self

    # -- one check ---------------------------------------------------------------------------------
    def _judge(self):
        """The check's pure judgement, run inside the ledger's transaction on the stored outputs."""
        own = self.hook.cluster_config()

        def judge(captures, new_xids, fleet_files):
            base = own
            if base is None:
                text = fleet_files.get("cluster.yaml")
                base = config_from_text(text, "ledger inventory file cluster.yaml") if text else ClusterConfig()
            config = merged_config(base, self.spec.thresholds)
            return watch.evaluate(captures, config, new_xids), watch.WatchPolicy.from_thresholds(config.thresholds)

        return judge

    def check(self) -> CheckReport:
        """Run one check (blocking: SSH and the ledger); see the module docstring."""
        began = self.last_began = time.monotonic()
        started = datetime.now(timezone.utc)
        if self.started_at is None:
            self.started_at = self.clock()
        self.checks += 1
        report = CheckReport(number=self.checks, steps=[], pools=[], unhealthy=[])
        judge, fleet_files = self._judge(), self.hook.fleet_files()
        with Ledger.from_url(self.ledger_url) as ledger:
            def record(answered, parts):
                for host in answered:
                    if not host.ok:
                        self.log.warning("GPU host %s: collection failed: %s", host.host, host.reason)
                    for warning in host.warnings:
                        self.log.info("GPU host %s: %s", host.host, warning)
                return ledger.record_health_check(
                    [host_record(h) for h in answered], collector=self.collector, judge=judge,
                    fleet_files=fleet_files, started_at=started,
                    collection_id=parts[0].collection_id if parts else None, admit=False, **self.history)

            collected, parts = collect_in_parts(lambda on_host: self.hook.collect(on_host=on_host), record,
                                                self.part_window)
            ledger.run_admission()  # once the whole check is in: one queue pass for all its parts
            evaluation, policy = judge_parts(parts, judge)
            cluster = self.cluster = evaluation.cluster
            report.steps = [st for part in parts for st in part.steps]
            report.changes = self._inventory_changes(cluster)
            self._log_steps(report, cluster, policy)
            if self.spec.mode_kind == "watch":
                report.replacements = self._replace(ledger, cluster, cluster.config)
            live = ledger.live_reservations()
            reserved, evicted, drained = ledger.reserved_map(), ledger.evicted_map(), ledger.drained_map()
        if self.spec.mode_kind == "watch" and self.spec.sweep_orphans:
            report.orphans = self._sweep_orphans()
            self.orphans += report.orphans
        report.pools = watch.pool_counts(cluster, reserved, evicted, drained)
        report.unhealthy = [{**_gpu_json(g.key, g.uuid), "reasons": list(g.reasons)}
                            for g in cluster.gpus if not g.healthy]
        report.evicted_now = [{"host": k.host, "index": k.index, "reasons": list(v)} for k, v in sorted(evicted.items())]
        report.live_jobs = [r.job_id for r in live]
        report.collected = len(collected.ok)
        report.failed = len(collected.failed)
        if self.spec.mode_kind == "gate":
            report.gate = watch.gate_status(cluster, self.spec.request(), reserved, evicted, drained).to_json()
        watched = self._watched(report.live_jobs)
        self.seen_live = self.seen_live or bool(watched)
        self.metrics.pools(report.pools)
        self.metrics.check(time.monotonic() - began)
        self.last = report
        self.log.info(
            "health check %d: %d GPUs, %d unhealthy, %d evicted in the ledger, %d live reservation(s)%s",
            self.checks, len(cluster.gpus), len(report.unhealthy), len(evicted), len(live),
            "" if report.gate is None else f"; gate {'met' if report.gate['met'] else 'not met'}"
            + (f" by pool {report.gate['pool']}" if report.gate["pool"] else ""),
        )
        return report

    def _sweep_orphans(self) -> list[dict[str, Any]]:
        """Stop, on every host, the processes of jobs that hold no live reservation."""
        from airflow_hetero_gpu.launch.orphans import sweep_unreserved  # noqa: PLC0415

        def live_jobs() -> set[str]:
            with Ledger.from_url(self.ledger_url) as ledger:
                return {r.job_id for r in ledger.live_reservations()}

        try:
            targets, factory = list(self.hook.ssh_targets().values()), self.hook.client_factory()
        except HeteroGpuError as err:
            self.log.warning("orphan sweep skipped: %s", err)
            return []
        stopped = []
        for host, found in sorted(sweep_unreserved(targets, factory, live_jobs).items()):
            if found.error:
                self.log.warning("orphan sweep of %s: %s", host, found.error)
            for job_id, sweep in found.swept.items():
                self.log.warning("stopped %d orphaned process(es) of job %s on %s: it holds no live reservation%s",
                                 len(sweep.found), job_id, host,
                                 f"; {len(sweep.left)} survived SIGKILL" if sweep.left else "")
                stopped.append({"host": host, "job_id": job_id, "processes": len(sweep.found),
                                "left": len(sweep.left), "error": sweep.error})
        return stopped

    def _watched(self, live_jobs: Sequence[str]) -> list[str]:
        if self.spec.job_ids is None:
            return list(live_jobs)
        return [j for j in live_jobs if j in self.spec.job_ids]

    def _replace(self, ledger: Ledger, cluster: "Cluster", config: ClusterConfig) -> list[dict[str, Any]]:
        """S12: every evicted GPU held by a (watched) live reservation gets a replacement."""
        evicted = ledger.evicted_map()
        out = []
        for res in ledger.live_reservations():
            if self.spec.job_ids is not None and res.job_id not in self.spec.job_ids:
                continue
            for held in res.gpus:
                if held.key not in evicted:
                    continue
                bad = held.key
                pool = cluster.pools[int(cluster.pool_of[cluster.position[bad]])].id if bad in cluster.position else res.pool
                try:
                    new = ledger.replace(res.job_id, bad, cluster, reasons=evicted[bad], uuid=held.uuid, config=config)
                except NoLiveReservation:
                    break  # released meanwhile
                except LedgerError as err:
                    self.log.warning("job %s: GPU %s is evicted but cannot be replaced: %s", res.job_id, bad, err)
                    continue
                entry = {"check": self.checks, "job_id": res.job_id, **_gpu_json(bad, held.uuid),
                         "reasons": list(evicted[bad]), "pool": pool,
                         "replacement": None if new is None else _gpu_json(new, cluster.gpu(new).uuid)}
                if new is None:
                    mark = (res.job_id, bad.host, bad.index)
                    log = self.log.info if mark in self._stuck else self.log.warning
                    log("job %s: no healthy GPU of pool %s can replace evicted GPU %s (%s); the job's "
                        "on_no_replacement policy applies", res.job_id, pool, bad, ", ".join(evicted[bad]))
                    if mark not in self._stuck:
                        self._stuck.add(mark)
                        out.append(entry)
                        self.metrics.event("replacement_failures", pool, {"host": bad.host, **job_tags(res.team)})
                    continue
                self.log.warning("job %s: evicted GPU %s (%s) replaced by %s (%s) in pool %s", res.job_id, bad,
                                 held.uuid, new, cluster.gpu(new).uuid, pool)
                self._stuck.discard((res.job_id, bad.host, bad.index))
                self.metrics.event("replacements", pool, {"host": bad.host, **job_tags(res.team)})
                out.append(entry)
        self.replacements.extend(out)
        return out

    def _log_steps(self, report: CheckReport, cluster: "Cluster", policy: watch.WatchPolicy) -> None:
        for st in report.steps:
            pool = cluster.pools[int(cluster.pool_of[cluster.position[st.key]])].id
            if st.action == watch.EVICT:
                entry = {"check": self.checks, **_gpu_json(st.key, st.uuid), "reasons": list(st.evict_reasons),
                         "pool": pool}
                report.evicted.append(entry)
                self.evictions.append(entry)
                self.log.warning("GPU evicted: %s:%d uuid %s pool %s reason(s): %s", st.key.host, st.key.index,
                                 st.uuid, pool, ", ".join(st.evict_reasons))
                for reason in st.evict_reasons:
                    self.metrics.event("evictions", pool, {"host": st.key.host, "reason": reason})
            elif st.action == watch.READMIT:
                entry = {"check": self.checks, **_gpu_json(st.key, st.uuid), "pool": pool}
                report.readmitted.append(entry)
                self.readmissions.append(entry)
                self.log.info("GPU readmitted after %d healthy checks: %s:%d uuid %s pool %s",
                              policy.readmit_after, st.key.host, st.key.index, st.uuid, pool)
                self.metrics.event("readmissions", pool, {"host": st.key.host})
            elif st.action in (watch.PENDING, watch.HOLD):
                counts = ", ".join(f"{r} {st.streaks.get(r, 0)}/{policy.checks_to_evict(r)}" for r in st.reasons
                                   if watch.fault_kind(r) != watch.HARD)
                self.log.info("GPU %s:%d %s: bad checks in a row before eviction: %s", st.key.host, st.key.index,
                              "still evicted" if st.action == watch.HOLD else "unhealthy", counts)

    def _inventory_changes(self, cluster: "Cluster") -> list[str]:
        """S10: compare with the previous check's inventory; log new hosts, GPUs and pools."""
        now = [[g.host, g.index, g.uuid, g.name] for g in cluster.gpus if g.instance is None]
        pools = [p.id for p in cluster.pools]
        lines: list[str] = []
        if self._inventory is None:
            self.log.info("GPU inventory: %d GPUs on %d hosts, pools: %s", len(now), len(cluster.hosts),
                          ", ".join(pools) or "none")
        else:
            old = [Gpu(h, i, u, n) for h, i, u, n in self._inventory]
            new = [Gpu(h, i, u, n) for h, i, u, n in now]
            change = diff_inventory(old, new, old_pools=self._pools, new_pools=pools,
                                    unreachable_hosts=cluster.host_errors)
            lines = change.lines()
            for line in lines:
                self.log.info("GPU inventory change: %s", line)
        self._inventory, self._pools = now, pools
        return lines

    def until_next(self, interval: float) -> float:
        """Seconds to wait so that the next check begins ``interval`` seconds after the last one
        began (checks *every* ``interval`` seconds, whatever a check takes); 0 when the last check
        took longer than that, or none ran yet."""
        if self.last_began is None:
            return 0.0
        return max(0.0, interval - (time.monotonic() - self.last_began))

    # -- the sensor's decision ---------------------------------------------------------------------
    def outcome(self) -> str | None:
        """Why the sensor is done after the last check, or None to check again."""
        report = self.last
        if report is None:
            return None
        if self.spec.mode_kind == "gate":
            return GATE_MET if report.gate and report.gate["met"] else None
        if self.spec.watch_duration is not None and self.started_at is not None \
                and self.clock() - self.started_at >= self.spec.watch_duration:
            return WATCH_OVER
        if self.spec.stop_when_idle and self.seen_live and not self._watched(report.live_jobs):
            return IDLE
        return None

    def result(self, reason: str | None = None) -> dict[str, Any]:
        """The XCom value: every event of the run, and the state at the last check (JSON)."""
        last = self.last
        return {
            "mode_kind": self.spec.mode_kind,
            "reason": reason,
            "checks": self.checks,
            "evictions": list(self.evictions),
            "readmissions": list(self.readmissions),
            "replacements": list(self.replacements),
            "orphans_stopped": list(self.orphans),
            "unhealthy": last.unhealthy if last else [],
            "evicted": last.evicted_now if last else [],
            "pools": last.pools if last else [],
            "live_reservations": last.live_jobs if last else [],
            "gate": last.gate if last else None,
        }
