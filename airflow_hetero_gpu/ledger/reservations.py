"""Reservations with leases, and replacements of a job's GPU (SPEC §8, §9): the reservations' repository.

``reserve`` is planning and claiming in one transaction under the ledger lock (see
:mod:`airflow_hetero_gpu.ledger.db`): expire stale leases, read the live reservations and the
evictions, run :func:`airflow_hetero_gpu.core.planner.plan` with them, insert the reservation and
its k GPU rows, commit. Nobody else can plan in between, and the GPU rows' primary key
(host, gpu_index, mig_instance) makes a double claim impossible even if this logic were wrong.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection

from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.config import ClusterConfig
from airflow_hetero_gpu.core.model import Decision, Gpu, GpuKey, PlanRequest, PlanResult, Score
from airflow_hetero_gpu.core.planner import plan as core_plan
from airflow_hetero_gpu.core.planner import replacement as core_replacement
from airflow_hetero_gpu.ledger.checks import check_job_id, check_priority, check_team, check_key, check_lease, check_reasons, instance_column, instance_of
from airflow_hetero_gpu.ledger.errors import LedgerError, NoLiveReservation, ReservationConflict
from airflow_hetero_gpu.ledger.preemption import LEASE_EXPIRED, RELEASED
from airflow_hetero_gpu.ledger.records import Reservation, ReservedGpu, TaskIdentity
from airflow_hetero_gpu.ledger.schema import job_hosts as job_hosts_t
from airflow_hetero_gpu.ledger.schema import reservation_gpus as gpu_t
from airflow_hetero_gpu.ledger.schema import reservations as res_t

if TYPE_CHECKING:
    from airflow_hetero_gpu.ledger.base import LedgerDatabase
    from airflow_hetero_gpu.ledger.unit_of_work import UnitOfWork

DEFAULT_LEASE_SECONDS = 600.0


class Reservations:
    """Reservations, leases, replacements and the hosts each job ran on.

    The operations (``reserve``, ``renew``, ...) each run one unit of work of ``db``; the methods
    taking a ``uow`` work inside the caller's.
    """

    def __init__(self, db: LedgerDatabase):
        self.db = db

    def reserve(
        self,
        job_id: str,
        cluster: Cluster,
        request: PlanRequest,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        identity: TaskIdentity | Mapping[str, Any] | None = None,
        config: ClusterConfig | None = None,
        team: str | None = None,
        priority: int = 0,
        preemptible: bool = False,
    ) -> PlanResult:
        """Plan ``request`` on ``cluster`` against the ledger's live state and claim the decision.

        All k GPUs or none: when no pool can host the job, nothing is written and the result's
        ``decision`` is None (the CLI exits 3). Reserving a job id that already holds a live
        reservation for the same request returns that reservation (its lease renewed, its
        identity updated), so a retried task gets its GPUs back; for a different request it
        raises :class:`ReservationConflict`. With teams configured (docs/teams.md) the job
        counts for ``team`` (None: the default team) and a decision its quota does not allow now
        (beyond quota + borrowing limit, or no idle lendable quota to borrow) raises
        :class:`QuotaRefused` with the quota's standing; nothing is written.
        ``priority`` and ``preemptible`` are what preemption
        sees of the running job (docs/preemption.md; a holder that cannot stop on request keeps
        the default ``preemptible=False``).
        """
        job_id = check_job_id(job_id)
        team = check_team(team)
        priority = check_priority(priority, job_id)
        lease = check_lease(lease_seconds)
        ident = TaskIdentity.coerce(identity)
        with self.db.write(f"reserve job {job_id!r}") as uow:
            conn, now = uow.conn, uow.now
            uow.expire()
            existing = self.load(uow, job_id)
            if existing:
                res = existing[0]
                if res.request is not None and res.request != request.to_json():
                    raise ReservationConflict(
                        f"job {job_id!r} already holds a reservation for a different request "
                        f"({res.request}); release it first"
                    )
                values: dict[str, Any] = {"renewed_at": now, "expires_at": now + lease}
                if ident is not None:
                    values.update(ident.to_json())
                conn.execute(update(res_t).where(res_t.c.job_id == job_id).values(**values))
                return existing_result(res, cluster, request)
            # GPUs claimed for the queue's heads are not given out past the queue
            reserved = {**uow.queue.claimed(uow, but=job_id), **self.held(uow)}
            reserved.update(self.held_by_uuid(uow, cluster, reserved))
            result = core_plan(cluster, request, reserved=reserved, evicted=uow.evictions.evicted(uow), config=config,
                               drained=uow.drains.drained(uow))
            if result.decision is None:
                return result
            borrowed = _quota_check(uow, cluster, reserved, result, team)
            self.insert(uow, job_id, result.decision, request, lease, ident,
                         {"priority": int(priority), "preemptible": bool(preemptible), "enqueued_at": now})
            if team is not None or borrowed is not None:
                conn.execute(update(res_t).where(res_t.c.job_id == job_id).values(team=team, borrowed=borrowed))
            uow.hook("reserve", job_id)
        return result

    def insert(self, uow: UnitOfWork, job_id: str, decision: Decision, request: PlanRequest,
               lease: timedelta, ident: TaskIdentity | None, extra: Mapping[str, Any] | None = None) -> None:
        """Write the reservation of ``decision`` for ``job_id`` with its GPU rows."""
        conn, now = uow.conn, uow.now
        ident_values = {**(ident.to_json() if ident else {}), **(extra or {})}
        conn.execute(insert(res_t).values(
            job_id=job_id, pool=decision.pool, gpu_count=len(decision.gpus), score=decision.score.to_json(),
            created_at=now, renewed_at=now, expires_at=now + lease, request=request.to_json(),
            mean_distance=float(decision.mean_distance), **ident_values,
        ))
        conn.execute(insert(gpu_t), [
            {"host": g.host, "gpu_index": g.index, "mig_instance": instance_column(g.instance), "job_id": job_id,
             "slot": slot, "uuid": g.uuid or None}
            for slot, g in enumerate(decision.gpus)
        ])

    def renew(self, job_id: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> Reservation:
        """Extend the job's lease to now + ``lease_seconds``.

        Raises :class:`NoLiveReservation` when the job was released or its lease already expired:
        the holder has lost its GPUs and must stop using them.
        """
        job_id = check_job_id(job_id)
        lease = check_lease(lease_seconds)
        with self.db.write(f"renew job {job_id!r}") as uow:
            conn, now = uow.conn, uow.now
            uow.expire()
            done = conn.execute(
                update(res_t).where(res_t.c.job_id == job_id).values(renewed_at=now, expires_at=now + lease)
            ).rowcount
            found = self.load(uow, job_id) if done else []
        if not found:
            raise NoLiveReservation(job_id, "renew")
        return found[0]

    def release(self, job_id: str) -> bool:
        """Free the job's GPUs. Idempotent: returns whether a live reservation was freed."""
        job_id = check_job_id(job_id)
        with self.db.write(f"release job {job_id!r}", warm=True) as uow:
            uow.expire(admit=False)
            freed = self.drop(uow, [job_id], RELEASED) > 0
            uow.admit_before_commit()  # the freed GPUs go to the queue in the same transaction
        return freed

    def expire(self) -> list[str]:
        """Free every reservation whose lease has passed; returns their job ids.

        Every write does this first, so a dead holder's GPUs come back at the next reserve.
        """
        with self.db.write("expire leases") as uow:
            return uow.expire()

    def expire_due(self, uow: UnitOfWork) -> list[str]:
        """Drop the reservations whose lease passed, and end the jobs of drained hosts past their
        deadline; returns the job ids of both."""
        conn, now = uow.conn, uow.now
        ids = list(conn.execute(select(res_t.c.job_id).where(res_t.c.expires_at <= now)).scalars())
        self.drop(uow, ids, LEASE_EXPIRED)
        return sorted(set(ids) | set(uow.drains.end_past_deadline(uow)))  # drained hosts past their deadline

    def drop(self, uow: UnitOfWork, job_ids: Sequence[str], outcome: str) -> int:
        """Delete the reservations of ``job_ids`` with their GPU rows and close their open
        preemption records as ``outcome``. Every removal of a reservation goes through here
        (release, leaving the queue, a lease expiry, a drain's deadline, a finished preemption),
        so no victim's record stays "in progress" once its GPUs are gone. Returns the number of
        reservations deleted."""
        ids = list(job_ids)
        if not ids:
            return 0
        uow.conn.execute(delete(gpu_t).where(gpu_t.c.job_id.in_(ids)))
        gone = uow.conn.execute(delete(res_t).where(res_t.c.job_id.in_(ids))).rowcount
        uow.preemptions.close_records(uow, ids, outcome)
        return gone

    def get(self, job_id: str) -> Reservation | None:
        """The job's live reservation, or None."""
        with self.db.read("read a reservation") as uow:
            found = self.load(uow, check_job_id(job_id))
        return found[0] if found else None

    def live_reservations(self) -> list[Reservation]:
        """Every reservation whose lease has not expired, by job id."""
        with self.db.read("list reservations") as uow:
            return self.load(uow)

    def reserved_map(self) -> dict[GpuKey, str]:
        """GPU -> job id for every GPU held by a live reservation."""
        with self.db.read("read reserved GPUs") as uow:
            return self.held(uow)

    def plan(self, cluster: Cluster, request: PlanRequest, *, config: ClusterConfig | None = None) -> PlanResult:
        """Plan against the ledger's live reservations, evictions and drains without reserving anything."""
        with self.db.read("read the ledger state") as uow:
            reserved, evicted, drained = self.held(uow), uow.evictions.evicted(uow), uow.drains.drained(uow)
        return core_plan(cluster, request, reserved=reserved, evicted=evicted, config=config, drained=drained)

    def load(self, uow: UnitOfWork, job_id: str | None = None) -> list[Reservation]:
        """The live reservations (of ``job_id`` only, when given), by job id."""
        conn, now = uow.conn, uow.now
        stmt = (
            select(res_t, gpu_t.c.host, gpu_t.c.gpu_index, gpu_t.c.mig_instance, gpu_t.c.uuid, gpu_t.c.slot)
            .select_from(res_t.outerjoin(gpu_t, gpu_t.c.job_id == res_t.c.job_id))
            .where(res_t.c.expires_at > now)
            .order_by(res_t.c.job_id, gpu_t.c.slot)
        )
        if job_id is not None:
            stmt = stmt.where(res_t.c.job_id == job_id)
        rows: dict[str, list] = {}
        for row in conn.execute(stmt):
            rows.setdefault(row.job_id, []).append(row)
        return [_reservation(group) for group in rows.values()]

    def held(self, uow: UnitOfWork) -> dict[GpuKey, str]:
        """GPU -> job id for every GPU held by a live reservation."""
        conn, now = uow.conn, uow.now
        stmt = (
            select(gpu_t.c.host, gpu_t.c.gpu_index, gpu_t.c.mig_instance, gpu_t.c.job_id)
            .join(res_t, res_t.c.job_id == gpu_t.c.job_id)
            .where(res_t.c.expires_at > now)
        )
        return {GpuKey(host, index, instance_of(instance)): job
                for host, index, instance, job in conn.execute(stmt)}

    def held_by_uuid(self, uow: UnitOfWork, cluster: Cluster, reserved: Mapping[GpuKey, str]) -> dict[GpuKey, str]:
        """GPUs of ``cluster`` a live reservation holds under another host name (one machine
        listed twice: the same UUID): they count as held, so no GPU is ever reserved twice."""
        conn, now = uow.conn, uow.now
        stmt = (select(gpu_t.c.uuid, gpu_t.c.job_id).join(res_t, res_t.c.job_id == gpu_t.c.job_id)
                .where(res_t.c.expires_at > now, gpu_t.c.uuid.is_not(None)))
        by_uuid = {uuid: job for uuid, job in conn.execute(stmt) if uuid}
        if not by_uuid:
            return {}
        return {g.key: by_uuid[g.uuid] for g in cluster.gpus if g.uuid in by_uuid and g.key not in reserved}

    # --- replacement (S12) ----------------------------------------------------------------------
    def replace(
        self,
        job_id: str,
        bad: tuple[str, int],
        cluster: Cluster,
        *,
        reasons: Iterable[str] | str = (),
        uuid: str | None = None,
        config: ClusterConfig | None = None,
    ) -> GpuKey | None:
        """Swap the job's abnormal GPU ``bad`` for the best available GPU of its pool (SPEC §8).

        In one locked transaction: choose g' with :func:`core.planner.replacement` against the
        live state, move the job's GPU row from ``bad`` to g' (same slot), and record ``bad`` as
        evicted (``reasons``, default ``abnormal``, added to any it already has). Returns g', or
        None when no GPU can replace it, in which case nothing changes.
        """
        job_id = check_job_id(job_id)
        bad = check_key(bad)
        if bad not in cluster.position:
            raise LedgerError(f"replace: GPU {bad} is not in the cluster inventory, so its pool is unknown")
        why = check_reasons(reasons)
        with self.db.write(f"replace GPU {bad} of job {job_id!r}", warm=True) as uow:
            conn = uow.conn
            uow.expire()
            found = self.load(uow, job_id)
            if not found:
                raise NoLiveReservation(job_id, "replace a GPU of")
            res = found[0]
            if bad not in res.keys:
                held = ", ".join(str(k) for k in res.keys)
                raise LedgerError(f"replace: GPU {bad} is not held by job {job_id!r} (it holds {held})")
            evicted = uow.evictions.evicted(uow)
            evicted.setdefault(bad.gpu, why)  # not a sibling instance of a faulty GPU either
            reserved = self.held(uow)
            reserved.update(self.held_by_uuid(uow, cluster, reserved))
            new = core_replacement(
                cluster, res.keys, bad, reserved=reserved, evicted=evicted, config=config,
                gpu_memory_mib=(res.request or {}).get("gpu_memory_mib"), drained=uow.drains.drained(uow),
            )
            if new is None:
                return None
            old = next(g for g in res.gpus if g.key == bad)
            conn.execute(
                update(gpu_t)
                .where(gpu_t.c.job_id == job_id, gpu_t.c.host == bad.host, gpu_t.c.gpu_index == bad.index,
                       gpu_t.c.mig_instance == instance_column(bad.instance))
                .values(host=new.host, gpu_index=new.index, mig_instance=instance_column(new.instance),
                        uuid=cluster.gpu(new).uuid or None)
            )
            # health is a GPU's: a MIG instance's fault evicts its GPU (and with it every instance)
            gpu_uuid = uuid or (old.uuid if bad.instance is None else cluster.gpu(bad).gpu_uuid)
            uow.evictions.record(uow, bad.gpu, gpu_uuid, why)
            replacement = {"host": new.host, "index": new.index}
            if new.instance is not None:
                replacement["instance"] = new.instance
            uow.history.record_event(uow, "replaced", bad.gpu, gpu_uuid, why, job_id, {"replacement": replacement})
            self.note_hosts(uow, job_id, [new.host])
            uow.admit()  # the evicted GPU may have been claimed for a head
            uow.hook("replace", job_id)
        return new

    # --- the hosts a job ran on -----------------------------------------------------------------
    def add_job_hosts(self, job_id: str, hosts: Iterable[str]) -> None:
        """Remember that ``job_id`` runs (or ran) on ``hosts``: a retry of the job sweeps its
        leftovers exactly there, not on the whole fleet."""
        job_id = check_job_id(job_id)
        with self.db.write(f"record the hosts of job {job_id!r}") as uow:
            self.note_hosts(uow, job_id, hosts)

    def job_hosts(self, job_id: str) -> list[str]:
        """Every host an earlier try of ``job_id`` ran on (or was placed on)."""
        job_id = check_job_id(job_id)
        with self.db.read(f"read the hosts of job {job_id!r}") as uow:
            return sorted(uow.conn.execute(select(job_hosts_t.c.host).where(job_hosts_t.c.job_id == job_id)).scalars())

    def forget_job_hosts(self, job_id: str) -> None:
        """The job ended cleanly everywhere: nothing is left to sweep."""
        job_id = check_job_id(job_id)
        with self.db.write(f"forget the hosts of job {job_id!r}") as uow:
            uow.conn.execute(delete(job_hosts_t).where(job_hosts_t.c.job_id == job_id))

    def note_hosts(self, uow: UnitOfWork, job_id: str, hosts: Iterable[str]) -> None:
        """Add ``hosts`` to those ``job_id`` ran on (:meth:`add_job_hosts` in the caller's write)."""
        add_job_hosts(uow.conn, uow.now, job_id, hosts)


def add_job_hosts(conn: Connection, now: datetime, job_id: str, hosts: Iterable[str]) -> None:
    known = set(conn.execute(select(job_hosts_t.c.host).where(job_hosts_t.c.job_id == job_id)).scalars())
    new = sorted(set(hosts) - known)
    if new:
        conn.execute(insert(job_hosts_t), [{"job_id": job_id, "host": h, "first_at": now, "last_at": now}
                                           for h in new])
    if known & set(hosts):
        conn.execute(update(job_hosts_t).where(job_hosts_t.c.job_id == job_id,
                                               job_hosts_t.c.host.in_(sorted(known & set(hosts))))
                     .values(last_at=now))


def _reservation(rows: Sequence[Any]) -> Reservation:
    first = rows[0]
    gpus = tuple(ReservedGpu(r.host, r.gpu_index, r.uuid, r.slot, instance_of(r.mig_instance))
                 for r in rows if r.host is not None)
    fields = ("dag_id", "run_id", "task_id", "try_number", "map_index")
    has_identity = any(getattr(first, f) is not None for f in fields)
    return Reservation(
        job_id=first.job_id, pool=first.pool, gpus=gpus, score=dict(first.score), created_at=first.created_at,
        renewed_at=first.renewed_at, expires_at=first.expires_at, gpu_count=first.gpu_count,
        request=first.request, mean_distance=first.mean_distance,
        identity=TaskIdentity(*(getattr(first, f) for f in fields)) if has_identity else None,
        team=first.team, borrowed=first.borrowed,
        preemption={"priority": first.priority or 0, "preemptible": bool(first.preemptible),
                    "checkpoint_at": first.checkpoint_at, "preempting": first.preempting,
                    "enqueued_at": first.enqueued_at},
    )


def existing_result(res: Reservation, cluster: Cluster, request: PlanRequest) -> PlanResult:
    """A PlanResult whose decision is an existing reservation (no planning happened: no pool reports):
    a retried task's reservation, or one the queue admitted."""
    pool = cluster.pool_by_id.get(res.pool)

    def gpu(g: ReservedGpu) -> Gpu:
        if g.key in cluster.position:
            return cluster.gpu(g.key)
        return Gpu(g.host, g.index, g.uuid or "", pool.card_type if pool else res.pool, instance=g.instance)

    terms = {k: float(v) for k, v in res.score.items() if k != "total"}
    score = Score(terms, float(res.score.get("total", 0.0)))
    distance = res.mean_distance if res.mean_distance is not None else float("nan")
    return PlanResult(request, Decision(res.pool, [gpu(g) for g in res.gpus], score, distance), [])


def _quota_check(uow: UnitOfWork, cluster: Cluster, reserved: Mapping[GpuKey, str],
                 result: PlanResult, team: str | None) -> int | None:
    """How many GPUs of a direct reservation's decision are borrowed (None: no teams configured);
    :class:`QuotaRefused` when its team's quota does not allow it now."""
    from airflow_hetero_gpu.core.admission.quota import QuotaBook
    from airflow_hetero_gpu.core.admission.rules.max_jobs import max_jobs_rule
    from airflow_hetero_gpu.ledger.errors import QuotaRefused
    quotas = uow.teams.quota_input(uow)
    if quotas is None:
        return None
    card_of = {pool.id: pool.card_type for pool in cluster.pools}
    uow.teams.remember_cards(uow, card_of)  # the writes after this one count holdings without a cluster
    fleet: dict[str, int] = {}
    for pool in cluster.pools:
        fleet[pool.card_type] = fleet.get(pool.card_type, 0) + len(pool.positions)
    usage: dict[tuple[str, str], int] = {}
    for key, job in reserved.items():
        pos = cluster.position.get(GpuKey(*key))
        if pos is None or str(job).startswith("claimed for "):
            continue
        k = (quotas.team_of.get(job, quotas.default_team), cluster.pools[int(cluster.pool_of[pos])].card_type)
        usage[k] = usage.get(k, 0) + 1
    name = team or quotas.default_team
    rule = max_jobs_rule(quotas.teams, quotas.team_of)
    why = rule.refusal(name) if rule is not None else None
    if why is not None:
        raise QuotaRefused(f"not reserved: {why.text}")
    book = QuotaBook(quotas.teams, fleet, usage, quotas.history)
    decision = result.decision
    check = book.check(name, card_of.get(decision.pool, decision.pool), len(decision.gpus))
    if not check.allowed:
        raise QuotaRefused(f"not reserved: the quota does not allow it now: {check.why}")
    return check.borrow
