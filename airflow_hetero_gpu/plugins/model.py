"""The cluster page's model: what the page and its JSON show, built from plain inputs.

:class:`PageInputs` is the seam between where the facts come from (:mod:`.sources`: a capture
directory or the ledger's inventory, the ledger's reservations, evictions, history and queue) and
what is shown: :func:`build` turns it into a :class:`PageModel` without any I/O, so a test or
a benchmark hands it a cluster and records and gets the same page a server would render.

The JSON endpoint is :meth:`PageModel.to_json`; the templates read the same model, so the page
never says something the JSON does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence
from urllib.parse import quote

from airflow_hetero_gpu.core.foreign import intruder_reason, intruders, outside_reason
from airflow_hetero_gpu.core.drain import drain_line
from airflow_hetero_gpu.core import occupancy
from airflow_hetero_gpu.plugins.labels import job_labels
from airflow_hetero_gpu.plugins.team_chart import no_quota_cards

if TYPE_CHECKING:
    from airflow_hetero_gpu.core.cluster import Cluster
    from airflow_hetero_gpu.ledger.records import Eviction, Reservation

STATES = occupancy.STATES
#: The colours of the overview's GPU cells: evicted and unhealthy GPUs share one ("out"), and
#: every GPU of a host whose last collection failed shows "unreachable".
TILE_STATES = ("available", "busy", "drained", "reserved", "out", "unreachable")
DRAINED_TEXT = "drained (no new jobs)"
TILE_TEXT = {
    "available": "available",
    "busy": "busy (load above threshold)",
    "drained": DRAINED_TEXT,
    "reserved": "reserved",
    "out": "evicted or unhealthy",
    "unreachable": "hosts unreachable",
}
#: What the state filter accepts; each matches the GPUs the pools table counts under that name.
FILTER_STATES = ("available", "busy", "drained", "reserved", "evicted", "unhealthy", "unreachable")
STATE_TEXT = {
    "unhealthy": "unhealthy (collection)",
    "evicted": "evicted (ledger)",
    "reserved": "reserved",
    "drained": DRAINED_TEXT,
    "busy": "busy (load above threshold)",
    "available": "available",
    "unreachable": "host unreachable",
}


@dataclass(frozen=True)
class GpuStatus:
    """What the page shows of one GPU: its state, load, holder and why it is out."""

    state: str
    load: float
    job: str | None = None
    reasons: tuple[str, ...] = ()  # unhealthy reasons from the collection
    evicted: tuple[str, ...] | None = None  # eviction reasons from the ledger; None: not evicted
    available: bool = False
    label: str | None = None  # the job's short label (tells jobs apart in small spaces)
    utilization: float | None = None  # as collected (nvidia-smi), not the planner's load


def gpu_statuses(
    cluster: "Cluster",
    reserved: Mapping[tuple[str, int], str] | None = None,
    evicted: Mapping[tuple[str, int], Sequence[str]] | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    drained: Mapping[str, str] | None = None,
) -> dict[tuple[str, int], GpuStatus]:
    """Every GPU's status with the ledger applied (:mod:`airflow_hetero_gpu.core.occupancy`)."""
    from airflow_hetero_gpu.core.model import GpuKey

    reserved = {GpuKey(*k): v for k, v in (reserved or {}).items()}
    evicted = {GpuKey(*k): tuple(v) for k, v in (evicted or {}).items()}
    if labels is None:
        labels = job_labels(reserved.values())
    state = occupancy.fleet_state(cluster, reserved, evicted, drained)
    names = occupancy.gpu_states(state)
    load = state.load.tolist()
    avail = state.available.tolist()
    out: dict[tuple[str, int], GpuStatus] = {}
    for i, gpu in enumerate(cluster.gpus):
        key = gpu.key
        job = reserved.get(key)
        out[key] = GpuStatus(
            state=names[i], load=load[i], job=job, reasons=tuple(gpu.reasons), evicted=evicted.get(key),
            available=avail[i], label=labels.get(job) if job else None, utilization=gpu.utilization,
        )
    return out


# --- links into the Airflow UI ------------------------------------------------------------------
def run_path(dag_id: str, run_id: str) -> str:
    """The Airflow UI path of a DAG run (relative to the UI's base URL)."""
    return f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def gpu_unit(index: int, instance: int | None) -> str:
    """How the page names a schedulable unit: the GPU's index, or ``1 MIG 3`` for MIG device 3
    of GPU 1 (as ``hetero-gpu inventory`` does)."""
    return str(index) if instance is None else f"{index} MIG {instance}"


def task_path(dag_id: str, run_id: str, task_id: str, map_index: int | None = None) -> str:
    path = f"{run_path(dag_id, run_id)}/tasks/{quote(task_id, safe='')}"
    if map_index is not None and map_index >= 0:
        path += f"/mapped/{map_index}"
    return path


def iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.isoformat()


def reservation_facts(res: "Reservation", *, show_identity: bool = True) -> dict:
    """A live reservation as the page and the JSON show it, with links to its DAG run."""
    out = res.to_json()
    ident = res.identity
    out["identity_hidden"] = False
    out["run_path"] = out["task_path"] = None
    if ident is not None and not show_identity:
        out["identity"] = None
        out["identity_hidden"] = True
    elif ident is not None and ident.dag_id and ident.run_id:
        out["run_path"] = run_path(ident.dag_id, ident.run_id)
        if ident.task_id:
            out["task_path"] = task_path(ident.dag_id, ident.run_id, ident.task_id, ident.map_index)
    return out


# --- the queue (the ledger's waiting jobs, docs/queue.md) --------------------------------------
@dataclass(frozen=True)
class QueueEntry:
    """A job waiting for GPUs: its place, priority, how long it has waited and why it waits;
    ``state`` (head, waiting, impossible) and, for a head, the GPUs ``claim``-ed for it."""

    job_id: str
    position: int
    priority: int = 0
    enqueued_at: datetime | None = None
    reason: str | None = None  # the last admission pass's reason
    request: Mapping[str, Any] | None = None
    identity: Mapping[str, Any] | None = None
    state: str | None = None
    claim: str | None = None  # "node01 GPU 0-7 (3 held)"
    team: str | None = None  # the fleet team it counts for (None: no teams configured)

    def to_json(self, now: datetime, *, show_identity: bool = True) -> dict[str, Any]:
        """``show_identity`` False (a viewer who may not read the DAG): its DAG, run, task and try
        are left out (``identity`` None, ``identity_hidden`` True), as for a reservation."""
        waited = None if self.enqueued_at is None else max(0.0, (now - _aware(self.enqueued_at)).total_seconds())
        hidden = bool(self.identity) and not show_identity
        return {"job_id": self.job_id, "position": self.position, "priority": self.priority,
                "enqueued_at": iso(self.enqueued_at), "waited_s": waited, "reason": self.reason,
                "request": dict(self.request) if self.request else None,
                "identity": dict(self.identity) if self.identity and not hidden else None,
                "identity_hidden": hidden, "state": self.state, "claim": self.claim,
                **({"team": self.team} if self.team is not None else {})}


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


# --- inputs and the model -------------------------------------------------------------------------
@dataclass
class PageInputs:
    """Everything one page needs, already read. ``queue`` None: no queue to show (not kept)."""

    cluster: "Cluster | None" = None
    reservations: Sequence["Reservation"] = ()
    evictions: Sequence["Eviction"] = ()
    queue: Sequence[QueueEntry] | None = None
    preemptions: Sequence[Mapping[str, Any]] = ()  # Ledger.preemptions(): in progress and the last day's
    samples: Sequence[Any] = ()  # ledger HostSample: host, collected_at, ok, gpus
    events: Sequence[Any] = ()  # ledger GpuEvent: at, host, index, uuid, kind, reasons, job_id
    sources: Mapping[str, Any] = field(default_factory=dict)
    visible_dag_ids: set[str] | None = None  # the DAGs the viewer may read (None: all)
    now: datetime | None = None
    teams: Mapping[str, Any] | None = None  # Ledger.team_standing() (None: no team configured)
    team_samples: Sequence[Mapping[str, Any]] = ()  # Ledger.team_samples() of the chart's window
    drains: Sequence[Any] = ()  # ledger Drain: host, reason, deadline, drained_at, drained_by


@dataclass
class HostView:
    """One host: its GPUs (in index order), where it hangs in the network, why it is unreachable."""

    host: str
    error: str | None
    notes: list[str]
    gpus: list[dict[str, Any]]
    switches: list[str]  # lowest tier first (an NVLink domain, when the host is in one, first)
    wiring: Any = None  # core.topology.HostWiring
    nvlink_domain: str | None = None  # the multi-node NVLink domain (fabric cluster UUID/clique id)
    nvlink_hosts: int = 0  # hosts in that domain
    drain: str | None = None  # "drained: why (since …, by …; running jobs end in …)" when drained

    @property
    def links(self) -> list[dict[str, Any]]:
        """Every pair of the host's GPUs with its ``topo -m`` label."""
        if self.wiring is None:
            return []
        have = {g["index"] for g in self.gpus}
        w = self.wiring
        return [{"a": a, "b": b, "link": label} for (a, b), label in zip(combinations(w.indices, 2), w.labels)
                if a in have and b in have]

    @property
    def tile_states(self) -> list[str]:
        """One state per GPU for the overview tile; every GPU of an unreachable host is unreachable."""
        if self.error:
            return ["unreachable"] * len(self.gpus)
        return ["out" if g["state"] in ("evicted", "unhealthy") else g["state"] for g in self.gpus]

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "error": self.error, "notes": list(self.notes), "gpus": len(self.gpus),
                "card_types": sorted({g["name"] for g in self.gpus}), "switches": list(self.switches),
                "nvlink_domain": self.nvlink_domain, "nvlink_hosts": self.nvlink_hosts,
                "links": self.links}


@dataclass
class PageModel:
    generated_at: datetime
    sources: dict[str, Any]
    thresholds: dict[str, float] | None
    pools: list[occupancy.PoolCounts]
    gpus: list[dict[str, Any]]
    hosts: list[HostView]
    switches: list[dict[str, Any]]
    reservations: list[dict[str, Any]]
    evictions: list[dict[str, Any]]
    queue: list[dict[str, Any]] | None
    labels: dict[str, str]  # job id -> short label
    cluster: "Cluster | None" = None
    samples: Sequence[Any] = ()
    events: Sequence[Any] = ()
    teams: Mapping[str, Any] | None = None  # per team and pattern: quota, in use, borrowed, lent, waiting
    team_samples: Sequence[Mapping[str, Any]] = ()
    drained: list[dict[str, Any]] = field(default_factory=list)  # {host, reason, deadline, line} per drained host
    preemptions: list[dict[str, Any]] = field(default_factory=list)  # docs/preemption.md
    _statuses: dict[tuple[str, int], GpuStatus] | None = field(default=None, repr=False)

    @property
    def statuses(self) -> dict[tuple[str, int], GpuStatus]:
        """Every GPU's :class:`GpuStatus` (for the wiring picture), made on first use."""
        if self._statuses is None:
            reserved = {(g["host"], g["index"]): g["reserved_by"] for g in self.gpus if g["reserved_by"]}
            evicted = {(g["host"], g["index"]): g["evicted"] for g in self.gpus if g["evicted"] is not None}
            self._statuses = {} if self.cluster is None else gpu_statuses(
                self.cluster, reserved, evicted, labels=self.labels,
                drained={d["host"]: d["reason"] for d in self.drained})
        return self._statuses

    @property
    def totals(self) -> dict[str, int]:
        """The pools' counts summed: what the one-line summary says."""
        return occupancy.totals(self.pools)

    @property
    def state_counts(self) -> dict[str, int]:
        """GPUs per (exclusive) state, as coloured on the page; unreachable hosts' GPUs apart."""
        out = {s: 0 for s in TILE_STATES}
        for h in self.hosts:
            for s in h.tile_states:
                out[s] += 1
        return out

    @property
    def unreachable_hosts(self) -> list[HostView]:
        return [h for h in self.hosts if h.error]

    def host(self, name: str) -> HostView | None:
        return next((h for h in self.hosts if h.host == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "generated_at": iso(self.generated_at),
            "sources": self.sources,
            "thresholds": self.thresholds,
            "totals": self.totals if self.cluster is not None else None,
            "switches": self.switches,
            "hosts": [h.to_json() for h in self.hosts],
            "pools": [p.to_json() for p in self.pools],
            "gpus": self.gpus,
            "reservations": self.reservations,
            "evictions": self.evictions,
            "queue": self.queue,
            "preemptions": self.preemptions,
            "job_labels": self.labels,
            "drained": self.drained,
            **({"teams": dict(self.teams)} if self.teams is not None else {}),
        }


def _switch_tree(cluster: "Cluster") -> list[dict[str, Any]]:
    """Every switch with its tier, parent and the hosts directly under it (tier 1)."""
    net = cluster.net
    hosts = set(cluster.hosts)
    if net.flat:
        return [{"switch": "(all hosts)", "tier": 1, "parent": None, "hosts": sorted(hosts)}]
    out = []
    for name, tier, members in net.groups:
        parents = [p for p, t, m in net.groups if t > tier and members <= m]
        out.append({"switch": name, "tier": tier, "parent": parents[0] if parents else None,
                    "hosts": sorted(members & hosts) if tier == 1 else []})
    out.sort(key=lambda s: (-(s["tier"] or 0), s["switch"]))
    return out


def build(
    cluster: "Cluster | None",
    reservations: Iterable["Reservation"] = (),
    evictions: Iterable["Eviction"] = (),
    *,
    queue: Sequence[QueueEntry] | None = None,
    preemptions: Sequence[Mapping[str, Any]] = (),
    samples: Sequence[Any] = (),
    events: Sequence[Any] = (),
    sources: Mapping[str, Any] | None = None,
    visible_dag_ids: set[str] | None = None,
    now: datetime | None = None,
    teams: Mapping[str, Any] | None = None,
    team_samples: Sequence[Mapping[str, Any]] = (),
    drains: Sequence[Any] = (),
) -> PageModel:
    """The page's model from the inventory (``cluster``, None when there is none yet) and the ledger.

    ``visible_dag_ids``: the DAGs the viewer may read (None: all); a reservation or a queue entry
    of another DAG keeps its job id and GPUs but not its DAG, run, task and try.
    """
    now = now or datetime.now(timezone.utc)
    reservations = list(reservations)
    evictions = list(evictions)
    labels = job_labels([r.job_id for r in reservations] + [q.job_id for q in queue or ()])
    res_facts = []
    def shown(dag_id: str | None) -> bool:
        return visible_dag_ids is None or dag_id in visible_dag_ids

    for r in reservations:
        f = reservation_facts(r, show_identity=r.identity is None or shown(r.identity.dag_id))
        f["label"] = labels.get(r.job_id)
        res_facts.append(f)
    model = PageModel(
        generated_at=now, sources=dict(sources or {}), thresholds=None, pools=[], gpus=[], hosts=[],
        switches=[], reservations=res_facts, evictions=[e.to_json() for e in evictions],
        queue=None if queue is None else [q.to_json(now, show_identity=shown((q.identity or {}).get("dag_id")))
                                          for q in sorted(queue, key=lambda q: q.position)],
        labels=labels, cluster=cluster, samples=samples, events=events, teams=teams, team_samples=team_samples,
        preemptions=[dict(p) for p in preemptions],
    )
    if cluster is None:
        return model
    if teams is not None:
        model.teams = no_quota_cards(teams, sorted({p.card_type for p in cluster.pools}))
    reserved = {g.key: r.job_id for r in reservations for g in r.gpus}
    evicted = {e.key: tuple(e.reasons) for e in evictions}
    drained = {d.host: d.reason for d in drains}
    model.drained = [{"host": d.host, "reason": d.reason, "deadline": iso(d.deadline), "line": drain_line(d, now)}
                     for d in drains]
    state = occupancy.fleet_state(cluster, reserved, evicted, drained)
    model.pools = occupancy.pool_counts(cluster, state=state)
    th = cluster.config.thresholds
    model.thresholds = {"busy_utilization": th.busy_utilization, "full_utilization": th.full_utilization,
                        "max_temperature_c": th.max_temperature_c}
    pool_ids = [p.id for p in cluster.pools]
    pool_of = cluster.pool_of.tolist()
    names = occupancy.gpu_states(state).tolist()
    load = state.load.tolist()
    avail = state.available.tolist()
    outside = state.outside.tolist()
    by_host: dict[str, list[dict[str, Any]]] = {}
    for i, gpu in enumerate(cluster.gpus):
        job = reserved.get(gpu.key)  # a MIG instance is reserved by its own key (host, GPU, instance)
        ev = evicted.get((gpu.host, gpu.index))  # an instance's fault evicts its whole GPU
        row = gpu.to_json()
        row.update(pool=pool_ids[pool_of[i]], load=round(load[i], 4), state=names[i], available=avail[i],
                   unit=gpu_unit(gpu.index, gpu.instance),
                   held=list(gpu.unschedulable) + ([outside_reason(gpu)] if outside[i] else [])
                   + ([intruder_reason(gpu, job)] if job and intruders(gpu, job) else [])
                   + ([f"drained: {drained[gpu.host]}"] if gpu.host in drained and not job else []),
                   reserved_by=job, job_label=labels.get(job) if job else None,
                   evicted=list(ev) if ev is not None else None)
        model.gpus.append(row)
        by_host.setdefault(gpu.host, []).append(row)
    errors, notes, net = cluster.host_errors, cluster.host_notes, cluster.net
    drain_notes = {d.host: drain_line(d, now) for d in drains}
    for host in cluster.hosts:
        domain = net.domain_of.get(host)
        host_notes = ([drain_notes[host]] if host in drain_notes else []) + list(notes.get(host, ()))
        model.hosts.append(HostView(host, errors.get(host), host_notes, by_host.get(host, []),
                                    net.groups_of(host), cluster.wiring.get(host), domain,
                                    len(net.domains.get(domain, ())) if domain else 0,
                                    drain_notes[host].removeprefix(f"{host} ") if host in drain_notes else None))
    model.switches = _switch_tree(cluster)
    return model
