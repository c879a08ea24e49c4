"""The ledger: reservations with leases, evictions, replacements; each write one locked transaction.

``reserve`` is planning and claiming in one transaction under the ledger lock (see
:mod:`airflow_hetero_gpu.ledger.db`): expire stale leases, read the live reservations and the
evictions, run :func:`airflow_hetero_gpu.core.planner.plan` with them, insert the reservation and
its k GPU rows, commit. Nobody else can plan in between, and the GPU rows' primary key
(host, gpu_index, mig_instance) makes a double claim impossible even if this logic were wrong.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from sqlalchemy import and_, delete, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from airflow_hetero_gpu.core.cluster import Cluster
from airflow_hetero_gpu.core.config import ClusterConfig
from airflow_hetero_gpu.core.model import Decision, Gpu, GpuKey, PlanRequest, PlanResult, Score
from airflow_hetero_gpu.core.planner import plan as core_plan
from airflow_hetero_gpu.core.planner import replacement as core_replacement
from airflow_hetero_gpu.core.watch import Observation, Step, WatchPolicy, XidMarker
from airflow_hetero_gpu.ledger import schema, watch
from airflow_hetero_gpu.ledger.db import db_now, make_engine, read_transaction, write_transaction
from airflow_hetero_gpu.ledger.errors import LedgerError, NoLiveReservation, ReservationConflict
from airflow_hetero_gpu.ledger.records import Eviction, Reservation, ReservedGpu, TaskIdentity
from airflow_hetero_gpu.ledger.schema import evictions as ev_t
from airflow_hetero_gpu.ledger.schema import reservation_gpus as gpu_t
from airflow_hetero_gpu.ledger.schema import reservations as res_t
from airflow_hetero_gpu.ledger.url import mask, parse_url

DEFAULT_LEASE_SECONDS = 600.0
DEFAULT_EVICTION_REASON = "abnormal"

Clock = Callable[[], datetime]
CommitHook = Callable[[str, str], None]


class Ledger:
    """GPU reservations, leases and evictions in their own SQL database (SPEC §8, §9).

    Open with :meth:`from_url` (``None`` for the default SQLite file) and :meth:`close` when done,
    or use it as a context manager. The schema is created or upgraded on open.

    ``clock`` replaces the lease clock (tests); ``before_commit(action, job_id)`` runs inside the
    reserve and replace transactions just before they commit (tests use it to die mid-way).
    """

    def __init__(self, url: str | None = None, *, clock: Clock | None = None,
                 before_commit: CommitHook | None = None):
        self.url = parse_url(url)
        self._engine = make_engine(self.url)
        self._clock = clock
        self._before_commit = before_commit
        try:
            self._ensure_schema()
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_url(cls, url: str | None = None, **kwargs: Any) -> "Ledger":
        """Open the ledger at ``url`` (SQLite path or URL, PostgreSQL URL; None: the default file)."""
        return cls(url, **kwargs)

    @property
    def display_url(self) -> str:
        return mask(self.url)

    @property
    def dialect(self) -> str:
        return self._engine.dialect.name

    def close(self) -> None:
        """Close every pooled connection."""
        self._engine.dispose()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({self.display_url!r})"

    # --- transactions ---------------------------------------------------------------------------
    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except IntegrityError as err:
            raise LedgerError(f"ledger {self.display_url}: {action} refused by the database: {_first_line(err)}") from err
        except DBAPIError as err:
            raise LedgerError(f"ledger {self.display_url}: {action} failed: {_first_line(err)}") from err

    @contextmanager
    def _write(self, action: str) -> Iterator[tuple[Connection, datetime]]:
        with self._errors(action), write_transaction(self._engine) as conn:
            yield conn, self._now(conn)

    @contextmanager
    def _read(self, action: str) -> Iterator[tuple[Connection, datetime]]:
        with self._errors(action), read_transaction(self._engine) as conn:
            yield conn, self._now(conn)

    def _now(self, conn: Connection) -> datetime:
        return self._clock() if self._clock else db_now(conn)

    def _hook(self, action: str, job_id: str) -> None:
        if self._before_commit is not None:
            self._before_commit(action, job_id)

    # --- schema -----------------------------------------------------------------------------------
    def schema_version(self) -> int:
        with self._read("read the schema version") as (conn, _):
            return schema.current_version(conn)

    def _ensure_schema(self) -> None:
        if self.schema_version() == schema.LATEST:
            return
        with self._write("create or upgrade the schema") as (conn, now):
            version = schema.current_version(conn)  # again, now under the lock
            if version > schema.LATEST:
                raise LedgerError(
                    f"ledger {self.display_url} has schema version {version}, newer than this airflow-hetero-gpu "
                    f"supports ({schema.LATEST}); upgrade the package"
                )
            schema.upgrade(conn, now)

    # --- reservations -------------------------------------------------------------------------
    def reserve(
        self,
        job_id: str,
        cluster: Cluster,
        request: PlanRequest,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        identity: TaskIdentity | Mapping[str, Any] | None = None,
        config: ClusterConfig | None = None,
    ) -> PlanResult:
        """Plan ``request`` on ``cluster`` against the ledger's live state and claim the decision.

        All k GPUs or none: when no pool can host the job, nothing is written and the result's
        ``decision`` is None (the CLI exits 3). Reserving a job id that already holds a live
        reservation for the same request returns that reservation (its lease renewed, its
        identity updated), so a retried task gets its GPUs back; for a different request it
        raises :class:`ReservationConflict`.
        """
        job_id = _check_job_id(job_id)
        lease = _check_lease(lease_seconds)
        ident = TaskIdentity.coerce(identity)
        with self._write(f"reserve job {job_id!r}") as (conn, now):
            self._expire(conn, now)
            existing = self._load(conn, now, job_id)
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
                return _existing_result(res, cluster, request)
            result = core_plan(cluster, request, reserved=self._reserved_map(conn, now),
                               evicted=self._evicted_map(conn), config=config)
            if result.decision is None:
                return result
            self._insert(conn, now, job_id, result.decision, request, lease, ident)
            self._hook("reserve", job_id)
        return result

    def _insert(self, conn: Connection, now: datetime, job_id: str, decision: Decision, request: PlanRequest,
                lease: timedelta, ident: TaskIdentity | None) -> None:
        ident_values = ident.to_json() if ident else {}
        conn.execute(insert(res_t).values(
            job_id=job_id, pool=decision.pool, gpu_count=len(decision.gpus), score=decision.score.to_json(),
            created_at=now, renewed_at=now, expires_at=now + lease, request=request.to_json(),
            mean_distance=float(decision.mean_distance), **ident_values,
        ))
        conn.execute(insert(gpu_t), [
            {"host": g.host, "gpu_index": g.index, "mig_instance": _instance_column(g.instance), "job_id": job_id,
             "slot": slot, "uuid": g.uuid or None}
            for slot, g in enumerate(decision.gpus)
        ])

    def renew(self, job_id: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> Reservation:
        """Extend the job's lease to now + ``lease_seconds``.

        Raises :class:`NoLiveReservation` when the job was released or its lease already expired:
        the holder has lost its GPUs and must stop using them.
        """
        job_id = _check_job_id(job_id)
        lease = _check_lease(lease_seconds)
        with self._write(f"renew job {job_id!r}") as (conn, now):
            self._expire(conn, now)
            done = conn.execute(
                update(res_t).where(res_t.c.job_id == job_id).values(renewed_at=now, expires_at=now + lease)
            ).rowcount
            found = self._load(conn, now, job_id) if done else []
        if not found:
            raise NoLiveReservation(job_id, "renew")
        return found[0]

    def release(self, job_id: str) -> bool:
        """Free the job's GPUs. Idempotent: returns whether a live reservation was freed."""
        job_id = _check_job_id(job_id)
        with self._write(f"release job {job_id!r}") as (conn, now):
            self._expire(conn, now)
            conn.execute(delete(gpu_t).where(gpu_t.c.job_id == job_id))
            return conn.execute(delete(res_t).where(res_t.c.job_id == job_id)).rowcount > 0

    def expire(self) -> list[str]:
        """Free every reservation whose lease has passed; returns their job ids.

        Every write does this first, so a dead holder's GPUs come back at the next reserve.
        """
        with self._write("expire leases") as (conn, now):
            return self._expire(conn, now)

    def _expire(self, conn: Connection, now: datetime) -> list[str]:
        ids = list(conn.execute(select(res_t.c.job_id).where(res_t.c.expires_at <= now)).scalars())
        if ids:
            conn.execute(delete(gpu_t).where(gpu_t.c.job_id.in_(ids)))
            conn.execute(delete(res_t).where(res_t.c.job_id.in_(ids)))
        return sorted(ids)

    def get(self, job_id: str) -> Reservation | None:
        """The job's live reservation, or None."""
        with self._read("read a reservation") as (conn, now):
            found = self._load(conn, now, _check_job_id(job_id))
        return found[0] if found else None

    def live_reservations(self) -> list[Reservation]:
        """Every reservation whose lease has not expired, by job id."""
        with self._read("list reservations") as (conn, now):
            return self._load(conn, now)

    def reserved_map(self) -> dict[GpuKey, str]:
        """GPU -> job id for every GPU held by a live reservation."""
        with self._read("read reserved GPUs") as (conn, now):
            return self._reserved_map(conn, now)

    def plan(self, cluster: Cluster, request: PlanRequest, *, config: ClusterConfig | None = None) -> PlanResult:
        """Plan against the ledger's live reservations and evictions without reserving anything."""
        with self._read("read the ledger state") as (conn, now):
            reserved, evicted = self._reserved_map(conn, now), self._evicted_map(conn)
        return core_plan(cluster, request, reserved=reserved, evicted=evicted, config=config)

    def _load(self, conn: Connection, now: datetime, job_id: str | None = None) -> list[Reservation]:
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

    def _reserved_map(self, conn: Connection, now: datetime) -> dict[GpuKey, str]:
        stmt = (
            select(gpu_t.c.host, gpu_t.c.gpu_index, gpu_t.c.mig_instance, gpu_t.c.job_id)
            .join(res_t, res_t.c.job_id == gpu_t.c.job_id)
            .where(res_t.c.expires_at > now)
        )
        return {GpuKey(r.host, r.gpu_index, _instance(r.mig_instance)): r.job_id for r in conn.execute(stmt)}

    # --- evictions (S11) ------------------------------------------------------------------------
    def evict(self, key: tuple[str, int], uuid: str | None = None, reasons: Iterable[str] | str = ()) -> Eviction:
        """Record ``key`` as abnormal: it leaves every pool until readmitted.

        Evicting an evicted GPU adds the new reasons and restarts its healthy-check count. Health
        is a GPU's: a MIG instance's key evicts its GPU, and so every instance of it.
        """
        key = _check_key(key).gpu
        with self._write(f"evict GPU {key}") as (conn, now):
            return self._evict(conn, now, key, uuid, _check_reasons(reasons))

    def _evict(self, conn: Connection, now: datetime, key: GpuKey, uuid: str | None,
               reasons: tuple[str, ...]) -> Eviction:
        where = and_(ev_t.c.host == key.host, ev_t.c.gpu_index == key.index)
        row = conn.execute(select(ev_t).where(where)).first()
        if row is None:
            conn.execute(insert(ev_t).values(host=key.host, gpu_index=key.index, uuid=uuid, reasons=list(reasons),
                                             evicted_at=now, checked_at=now, healthy_checks=0))
        else:
            merged = list(dict.fromkeys([*row.reasons, *reasons]))
            conn.execute(update(ev_t).where(where).values(reasons=merged, checked_at=now, healthy_checks=0,
                                                          uuid=uuid or row.uuid))
        return _eviction(conn.execute(select(ev_t).where(where)).one())

    def record_check(
        self,
        key: tuple[str, int],
        healthy: bool,
        readmit_after: int = 3,
        *,
        reasons: Iterable[str] | str = (),
        uuid: str | None = None,
    ) -> Eviction | None:
        """Feed one health check of ``key``; returns its eviction afterwards, or None when it is in.

        An unhealthy check evicts the GPU (with ``reasons``) or resets its count of consecutive
        healthy checks; a healthy check of an evicted GPU counts one, and the ``readmit_after``-th
        in a row readmits it (``ClusterConfig.thresholds.readmit_after_healthy_checks``). A healthy
        check of a GPU that is not evicted changes nothing.
        """
        key = _check_key(key).gpu
        if isinstance(readmit_after, bool) or not isinstance(readmit_after, int) or readmit_after < 1:
            raise LedgerError(f"readmit_after: expected a positive integer, got {readmit_after!r}")
        where = and_(ev_t.c.host == key.host, ev_t.c.gpu_index == key.index)
        with self._write(f"record a check of GPU {key}") as (conn, now):
            row = conn.execute(select(ev_t).where(where)).first()
            if not healthy:
                return self._evict(conn, now, key, uuid, _check_reasons(reasons))
            if row is None:
                return None
            count = row.healthy_checks + 1
            if count >= readmit_after:
                conn.execute(delete(ev_t).where(where))
                return None
            conn.execute(update(ev_t).where(where).values(healthy_checks=count, checked_at=now))
            return _eviction(conn.execute(select(ev_t).where(where)).one())

    def uncordon(self, host: str, index: int | None = None) -> list[GpuKey]:
        """Readmit one evicted GPU, or every evicted GPU of ``host`` (index None) at once.

        The health watch's soft-fault counts of those GPUs start again. Returns the GPUs
        readmitted (empty when none was evicted).
        """
        if not isinstance(host, str) or not host:
            raise LedgerError(f"uncordon: expected a host name, got {host!r}")
        where = ev_t.c.host == host
        if index is not None:
            where = and_(where, ev_t.c.gpu_index == _check_key((host, index)).index)
        with self._write(f"uncordon {host}" + ("" if index is None else f":{index}")) as (conn, _now):
            keys = [GpuKey(r.host, r.gpu_index) for r in conn.execute(select(ev_t.c.host, ev_t.c.gpu_index).where(where))]
            if keys:
                conn.execute(delete(ev_t).where(where))
            watch.forget_streaks(conn, host, index)
        return sorted(keys)

    # --- the health watch (docs/health.md) --------------------------------------------------------
    def xid_markers(self) -> dict[GpuKey, XidMarker]:
        """GPU -> the last kernel-log Xid line the health watch has acted on."""
        with self._read("read Xid markers") as (conn, _now):
            return watch.read_markers(conn)

    def watch_streaks(self) -> dict[GpuKey, dict[str, int]]:
        """GPU -> consecutive bad checks per soft fault (temperature, hw-slowdown, unreachable)."""
        with self._read("read soft-fault streaks") as (conn, _now):
            return watch.read_streaks(conn)

    def apply_watch_check(self, observations: Sequence[Observation], policy: WatchPolicy) -> list[Step]:
        """Record one health check of every observed GPU in one locked transaction.

        Per GPU, :func:`airflow_hetero_gpu.core.watch.step` decides from its observation, its
        eviction and its soft-fault streaks: evict (hard faults at once, soft ones after their
        count of bad checks in a row), count a healthy check, readmit, or nothing. Returns the
        steps, in the order of ``observations``.
        """
        with self._write(f"record a health check of {len(observations)} GPU(s)") as (conn, now):
            return watch.apply_check(conn, now, observations, policy, self._evict)

    def evicted_map(self) -> dict[GpuKey, tuple[str, ...]]:
        """GPU -> reasons for every evicted GPU."""
        with self._read("read evictions") as (conn, _now):
            return self._evicted_map(conn)

    def evictions(self) -> list[Eviction]:
        """Every evicted GPU, by (host, index)."""
        with self._read("list evictions") as (conn, _now):
            return [_eviction(r) for r in conn.execute(select(ev_t).order_by(ev_t.c.host, ev_t.c.gpu_index))]

    def _evicted_map(self, conn: Connection) -> dict[GpuKey, tuple[str, ...]]:
        rows = conn.execute(select(ev_t.c.host, ev_t.c.gpu_index, ev_t.c.reasons))
        return {GpuKey(r.host, r.gpu_index): tuple(r.reasons) for r in rows}

    # --- replacement (S12) ------------------------------------------------------------------------
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
        job_id = _check_job_id(job_id)
        bad = _check_key(bad)
        if bad not in cluster.position:
            raise LedgerError(f"replace: GPU {bad} is not in the cluster inventory, so its pool is unknown")
        why = _check_reasons(reasons)
        with self._write(f"replace GPU {bad} of job {job_id!r}") as (conn, now):
            self._expire(conn, now)
            found = self._load(conn, now, job_id)
            if not found:
                raise NoLiveReservation(job_id, "replace a GPU of")
            res = found[0]
            if bad not in res.keys:
                held = ", ".join(str(k) for k in res.keys)
                raise LedgerError(f"replace: GPU {bad} is not held by job {job_id!r} (it holds {held})")
            evicted = self._evicted_map(conn)
            evicted.setdefault(bad.gpu, why)  # not a sibling instance of a faulty GPU either
            new = core_replacement(
                cluster, res.keys, bad, reserved=self._reserved_map(conn, now), evicted=evicted, config=config,
                gpu_memory_mib=(res.request or {}).get("gpu_memory_mib"),
            )
            if new is None:
                return None
            old = next(g for g in res.gpus if g.key == bad)
            conn.execute(
                update(gpu_t)
                .where(gpu_t.c.job_id == job_id, gpu_t.c.host == bad.host, gpu_t.c.gpu_index == bad.index,
                       gpu_t.c.mig_instance == _instance_column(bad.instance))
                .values(host=new.host, gpu_index=new.index, mig_instance=_instance_column(new.instance),
                        uuid=cluster.gpu(new).uuid or None)
            )
            # health is a GPU's: a MIG instance's fault evicts its GPU (and with it every instance)
            self._evict(conn, now, bad.gpu, uuid or (old.uuid if bad.instance is None else cluster.gpu(bad).gpu_uuid), why)
            self._hook("replace", job_id)
        return new


# --- helpers ---------------------------------------------------------------------------------------
def _first_line(err: DBAPIError) -> str:
    text = str(err.orig) if err.orig is not None else str(err)
    return (text.strip().splitlines() or [type(err).__name__])[0]


def _check_job_id(job_id: object) -> str:
    if not isinstance(job_id, str) or not job_id.strip():
        raise LedgerError(f"job id: expected a non-empty string, got {job_id!r}")
    if len(job_id) > schema.NAME:
        raise LedgerError(f"job id {job_id[:40]!r}...: longer than {schema.NAME} characters")
    return job_id


def _check_lease(seconds: object) -> timedelta:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        raise LedgerError(f"lease_seconds: expected a positive number of seconds, got {seconds!r}")
    return timedelta(seconds=float(seconds))


def _check_key(key: object) -> GpuKey:
    """A GPU as (host, index), or a MIG instance as (host, index, instance)."""
    if isinstance(key, (str, bytes)):
        raise LedgerError(f"GPU: expected (host, index), got {key!r}")
    try:
        host, index, *rest = key  # type: ignore[misc]
    except (TypeError, ValueError):
        raise LedgerError(f"GPU: expected (host, index), got {key!r}") from None
    instance = rest[0] if rest else None
    if (not isinstance(host, str) or not host or isinstance(index, bool) or not isinstance(index, int) or index < 0
            or len(rest) > 1 or (instance is not None and (isinstance(instance, bool) or not isinstance(instance, int)
                                                           or instance < 0))):
        raise LedgerError(f"GPU: expected (host, index >= 0[, MIG instance >= 0]), got {key!r}")
    return GpuKey(host, index, instance)


def _instance_column(instance: int | None) -> int:
    return schema.WHOLE_GPU if instance is None else instance


def _instance(column: int | None) -> int | None:
    return None if column is None or column == schema.WHOLE_GPU else column


def _check_reasons(reasons: Iterable[str] | str) -> tuple[str, ...]:
    if isinstance(reasons, str):
        reasons = (reasons,)
    out = tuple(dict.fromkeys(str(r) for r in reasons if str(r).strip()))
    return out or (DEFAULT_EVICTION_REASON,)


def _reservation(rows: Sequence[Any]) -> Reservation:
    first = rows[0]
    gpus = tuple(ReservedGpu(r.host, r.gpu_index, r.uuid, r.slot, _instance(r.mig_instance))
                 for r in rows if r.host is not None)
    fields = ("dag_id", "run_id", "task_id", "try_number", "map_index")
    has_identity = any(getattr(first, f) is not None for f in fields)
    return Reservation(
        job_id=first.job_id, pool=first.pool, gpus=gpus, score=dict(first.score), created_at=first.created_at,
        renewed_at=first.renewed_at, expires_at=first.expires_at, gpu_count=first.gpu_count,
        request=first.request, mean_distance=first.mean_distance,
        identity=TaskIdentity(*(getattr(first, f) for f in fields)) if has_identity else None,
    )


def _eviction(row: Any) -> Eviction:
    return Eviction(row.host, row.gpu_index, row.uuid, tuple(row.reasons), row.evicted_at, row.checked_at,
                    row.healthy_checks)


def _existing_result(res: Reservation, cluster: Cluster, request: PlanRequest) -> PlanResult:
    """A PlanResult whose decision is an existing reservation (no planning happened: no pool reports)."""
    pool = cluster.pool_by_id.get(res.pool)

    def gpu(g: ReservedGpu) -> Gpu:
        if g.key in cluster.position:
            return cluster.gpu(g.key)
        return Gpu(g.host, g.index, g.uuid or "", pool.card_type if pool else res.pool, instance=g.instance)

    terms = {k: float(v) for k, v in res.score.items() if k != "total"}
    score = Score(terms, float(res.score.get("total", 0.0)))
    distance = res.mean_distance if res.mean_distance is not None else float("nan")
    return PlanResult(request, Decision(res.pool, [gpu(g) for g in res.gpus], score, distance), [])
