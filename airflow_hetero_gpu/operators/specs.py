"""The training operator's arguments as four typed specs: what to place, where, what runs, how it lives.

:class:`~airflow_hetero_gpu.operators.hetero_train.HeteroTrainOperator` takes its arguments as
keywords and keeps each as an attribute (templates render them there). Once they are rendered (in
``execute()``) it groups them, every argument in exactly one spec, each spec checking the values
it owns and refusing a mistake in one line naming the argument (an :class:`AirflowFailException`:
never retried):

- :class:`RequestSpec`, what to place: the GPUs (count, card type, task type, free memory), the
  job's priority, team and preemptibility, the evaluation's weights;
- :class:`FleetSpec`, where: the hosts' SSH connections, the cluster description, the ledger and
  how old an inventory may be;
- :class:`ProgramSpec`, what runs on the hosts and how it starts: script or command, arguments,
  environment, working directory, launcher, rendezvous, checkpoint directory and storage;
- :class:`LifecycleSpec`, how the job lives: the wait for capacity, deferral, the lease and the
  durable dead-man switch, preemption's signal and grace, host silence, restarts.

``job_id`` stays the operator's own (its default comes from the task instance). The operator's
helpers take the specs they use (and :class:`~.runtime.Runtime`, the live objects), never the
operator.
"""

from __future__ import annotations

import math
import signal as signals
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from airflow.sdk.exceptions import AirflowFailException

from airflow_hetero_gpu.errors import HeteroGpuError

if TYPE_CHECKING:
    from airflow_hetero_gpu.core.model import PlanRequest
    from airflow_hetero_gpu.launch.command import LaunchSpec
    from airflow_hetero_gpu.launch.supervisor import Supervision

ON_NO_REPLACEMENT = ("fail", "wait")
CHECKPOINT_STORAGE = ("shared", "host")
#: The longest ``unattended_timeout``: a job left alone for a month is not watched any more (and its
#: lease, the switch plus the grace, stays within the 365 days every duration is bounded by).
MAX_UNATTENDED_S = 30 * 86400.0
#: ``unattended_timeout``'s default: 15 min outlasts a Celery worker's warm shutdown and restart
#: in a deploy and a worker pod's rescheduling, so a deploy never stops a training; a task cleared
#: or marked failed while its worker is gone is stopped at most that (plus the grace) later.
DEFAULT_UNATTENDED_S = 900.0
#: The lease of a task that does not run durable and gives none (as before).
PLAIN_LEASE_S = 120.0


def fail(message: str) -> AirflowFailException:
    """A setup mistake: one line, no retries."""
    return AirflowFailException(" ".join(message.split()))


def as_int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise fail(f"{name}: expected a positive integer, got {value!r}")
    try:
        number = int(str(value).strip()) if isinstance(value, str) else value
    except ValueError:
        raise fail(f"{name}: expected a positive integer, got {value!r}") from None
    if not isinstance(number, int):
        raise fail(f"{name}: expected a positive integer, got {value!r}")
    return number


def _seconds(value: Any) -> float | None:
    """A finite number of seconds, else None."""
    if isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _float(value: Any, name: str) -> float:
    """``float(value)``, or one line naming the argument."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise fail(f"{name}: expected a number of seconds, got {value!r}") from None


def signal_name(value: Any) -> str | None:
    """``"SIGTERM"``, ``"TERM"``, ``15`` -> ``"TERM"``; None when it names no signal."""
    try:
        if isinstance(value, int) and not isinstance(value, bool):
            return signals.Signals(value).name[3:]
        if isinstance(value, str):
            name = value.strip().upper()
            return signals.Signals[name if name.startswith("SIG") else f"SIG{name}"].name[3:]
    except (KeyError, ValueError):
        return None
    return None


def _pick(arguments: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: arguments[name] for name in names}


@dataclass(frozen=True)
class RequestSpec:
    """What to place: ``plan`` (``gpu_count``, ``gpu_type``, ``task_type``, ``gpu_memory_mib``), the
    queue's ``priority``, the ``team`` named (resolved at placement: docs/teams.md), whether the
    job is ``preemptible``, and ``weights`` overriding the evaluation's."""

    ARGUMENTS: ClassVar[tuple[str, ...]] = ("gpu_count", "gpu_type", "task_type", "gpu_memory_mib", "priority",
                                            "team", "preemptible", "weights")

    plan: PlanRequest
    priority: int = 0
    team: str | None = None
    preemptible: bool = True
    weights: Mapping[str, float] | None = None

    @classmethod
    def build(cls, arguments: Mapping[str, Any]) -> RequestSpec:
        a = _pick(arguments, cls.ARGUMENTS)
        from airflow_hetero_gpu.ledger.checks import MAX_PRIORITY

        priority = a["priority"]
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise fail(f"priority: expected an integer (higher first), got {priority!r}")
        if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
            raise fail(f"priority: expected an integer from {-MAX_PRIORITY} to {MAX_PRIORITY}, got {priority}")
        weights = a["weights"]
        if weights is not None and not isinstance(weights, Mapping):
            raise fail(f"weights: expected a mapping like {{'topology': 0.6}}, got {weights!r}")
        if not isinstance(a["preemptible"], bool):
            raise fail(f"preemptible: expected True or False, got {a['preemptible']!r}")
        return cls(cls._plan(a), priority, a["team"], a["preemptible"], dict(weights) if weights else None)

    @staticmethod
    def _plan(a: Mapping[str, Any]) -> PlanRequest:
        from airflow_hetero_gpu.core.model import PlanRequest

        count = as_int(a["gpu_count"], "gpu_count")
        memory = None
        if a["gpu_memory_mib"] not in (None, ""):
            try:
                memory = float(a["gpu_memory_mib"])
            except (TypeError, ValueError):
                raise fail(f"gpu_memory_mib: expected a number of MiB, got {a['gpu_memory_mib']!r}") from None
            memory = int(memory) if memory.is_integer() else memory
        gpu_type = a["gpu_type"]
        if isinstance(gpu_type, (list, tuple)):
            gpu_type = tuple(gpu_type) if len(gpu_type) != 1 else gpu_type[0]
        if gpu_type == "":
            gpu_type = None
        try:
            return PlanRequest(count, gpu_type, a["task_type"] or None, memory)
        except HeteroGpuError as err:
            raise fail(str(err).replace("gpus:", "gpu_count:", 1)) from None


@dataclass(frozen=True)
class FleetSpec:
    """Where: the hosts' ``ssh`` connections, ``captures_dir``, ``cluster_config``,
    ``topology_conf``, the ledger (``ledger_conn_id`` or ``ledger_url``; the ``[hetero_gpu]``
    settings where left out: the hooks read them), and ``inventory_max_age`` in seconds (the
    argument, else ``[hetero_gpu] inventory_max_age``, else 300)."""

    ARGUMENTS: ClassVar[tuple[str, ...]] = ("ssh_conn_ids", "captures_dir", "cluster_config", "topology_conf",
                                            "ledger_conn_id", "ledger_url", "inventory_max_age")

    ssh_conn_ids: Any = None  # a list of connection ids, or a mapping host -> connection id
    captures_dir: str | None = None
    cluster_config: Any = None  # a cluster.yaml path or mapping
    topology_conf: str | None = None
    ledger_conn_id: str | None = None
    ledger_url: str | None = None
    inventory_max_age: float = 300.0

    @classmethod
    def build(cls, arguments: Mapping[str, Any]) -> FleetSpec:
        a = _pick(arguments, cls.ARGUMENTS)
        if a["ledger_conn_id"] and a["ledger_url"]:
            raise fail("give ledger_conn_id or ledger_url, not both")
        config = a["cluster_config"]
        return cls(a["ssh_conn_ids"], a["captures_dir"], dict(config) if isinstance(config, Mapping) else config,
                   a["topology_conf"], a["ledger_conn_id"], a["ledger_url"], cls._max_age(a["inventory_max_age"]))

    @staticmethod
    def _max_age(value: Any) -> float:
        from airflow_hetero_gpu.collect.freshness import DEFAULT_MAX_AGE_S
        from airflow_hetero_gpu.settings import setting

        value = value if value is not None else setting("inventory_max_age")
        if value is None:
            return DEFAULT_MAX_AGE_S
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = -1.0
        if isinstance(value, bool) or not seconds >= 0:
            raise fail(f"inventory_max_age: expected seconds >= 0, got {value!r}")
        return seconds


@dataclass(frozen=True)
class ProgramSpec:
    """What runs on the hosts and how it starts: ``script`` under torchrun (``launcher``) with
    ``script_args``, or ``command``; ``env``, ``workdir``, the rendezvous (``rdzv_port``,
    ``rdzv_host``), ``checkpoint_dir`` (passed as ``--checkpoint-dir``) and ``checkpoint_storage``."""

    ARGUMENTS: ClassVar[tuple[str, ...]] = ("script", "script_args", "command", "env", "workdir", "launcher",
                                            "rdzv_port", "rdzv_host", "checkpoint_dir", "checkpoint_storage")

    script: str | None = None
    script_args: tuple[str, ...] = ()
    command: tuple[str, ...] | None = None
    env: Mapping[str, str] | None = None
    workdir: str | None = None
    launcher: tuple[str, ...] = ("torchrun",)
    rdzv_port: int | str = "probe"
    rdzv_host: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_storage: str = "shared"

    @classmethod
    def build(cls, arguments: Mapping[str, Any]) -> ProgramSpec:
        a = _pick(arguments, cls.ARGUMENTS)
        if bool(a["script"]) == bool(a["command"]):
            raise fail("give either script (run under torchrun) or command (a full argv), not both or neither")
        for name in ("script_args", "command"):
            value = a[name]
            if value is not None and (isinstance(value, str) or not all(isinstance(v, str) for v in value)):
                raise fail(f"{name}: expected a list of strings, got {value!r}")
        if a["env"] is not None and not isinstance(a["env"], Mapping):
            raise fail(f"env: expected a mapping of names to strings, got {a['env']!r}")
        if a["checkpoint_storage"] not in CHECKPOINT_STORAGE:
            raise fail(f"checkpoint_storage: expected 'shared' or 'host', got {a['checkpoint_storage']!r}")
        if a["checkpoint_storage"] == "host" and not a["checkpoint_dir"]:
            raise fail("checkpoint_storage='host' needs checkpoint_dir (the directory to carry between hosts)")
        return cls(a["script"] or None, tuple(a["script_args"] or ()),
                   tuple(a["command"]) if a["command"] else None, dict(a["env"]) if a["env"] is not None else None,
                   a["workdir"], tuple(a["launcher"]), a["rdzv_port"], a["rdzv_host"], a["checkpoint_dir"] or None,
                   a["checkpoint_storage"])

    def launch_spec(self, job_id: str, *, script: str | None = None, payload: bytes | None = None) -> LaunchSpec:
        """The job's :class:`~airflow_hetero_gpu.launch.command.LaunchSpec` (``script``: run this
        one under torchrun instead, e.g. a payload's runner)."""
        from airflow_hetero_gpu.launch.command import Command, LaunchSpec, Torchrun

        args = list(self.script_args)
        if self.checkpoint_dir:
            args += ["--checkpoint-dir", self.checkpoint_dir]
        if script or self.script:
            program = Torchrun(script or self.script, tuple(args), max_restarts=0, launcher=self.launcher)
        else:
            program = Command(tuple(self.command or ()))
        try:
            return LaunchSpec(job_id, program, env=dict(self.env or {}), workdir=self.workdir, payload=payload)
        except ValueError as err:
            raise fail(str(err)) from None

    def carried_checkpoint_dir(self) -> str | None:
        """The directory to carry to new hosts (``checkpoint_storage="host"``; relative to
        ``workdir``), or None when the storage is shared."""
        import posixpath

        if self.checkpoint_storage != "host" or not self.checkpoint_dir:
            return None
        if not posixpath.isabs(self.checkpoint_dir) and self.workdir:
            return posixpath.join(self.workdir, self.checkpoint_dir)
        return self.checkpoint_dir


@dataclass(frozen=True)
class LifecycleSpec:
    """How the job lives: the wait for capacity (``wait_for_capacity``, ``capacity_timeout``,
    ``capacity_poll_interval``, ``deferrable``), the lease (``lease_seconds``, resolved: see
    :meth:`build`), durability (``durable``, ``unattended_timeout``), preemption
    (``preemption_signal``, a name such as ``"TERM"``, and ``preemption_grace``), a silent host
    (``host_timeout``) and a replaced GPU (``on_no_replacement``, ``max_restarts``)."""

    ARGUMENTS: ClassVar[tuple[str, ...]] = (
        "wait_for_capacity", "capacity_timeout", "capacity_poll_interval", "deferrable", "on_no_replacement",
        "max_restarts", "host_timeout", "lease_seconds", "durable", "unattended_timeout", "preemption_signal",
        "preemption_grace")

    wait_for_capacity: bool = False
    capacity_timeout: float = 3600.0
    capacity_poll_interval: float = 30.0
    deferrable: bool = False
    on_no_replacement: str = "fail"
    max_restarts: int = 3
    host_timeout: float = 60.0
    lease_seconds: float = PLAIN_LEASE_S
    durable: bool = True
    unattended_timeout: float = DEFAULT_UNATTENDED_S
    preemption_signal: str = "TERM"
    preemption_grace: float = 300.0

    @classmethod
    def build(cls, arguments: Mapping[str, Any]) -> LifecycleSpec:
        """Checked in one line each; ``lease_seconds=None`` becomes the lease that fits (durable:
        ``unattended_timeout`` + ``preemption_grace`` + the supervisor's margin; else 120 s), and a
        durable job's lease must outlive its hosts' dead-man switch."""
        from airflow_hetero_gpu.durations import MAX_DURATION_S
        from airflow_hetero_gpu.launch.supervisor import LEASE_MARGIN_S

        a = _pick(arguments, cls.ARGUMENTS)
        lease = a["lease_seconds"]
        unattended, grace = _seconds(a["unattended_timeout"]), _seconds(a["preemption_grace"])
        if lease is None:
            lease = (unattended + grace + LEASE_MARGIN_S if a["durable"] and unattended is not None
                     and grace is not None and 1 <= unattended <= MAX_UNATTENDED_S and grace >= 0 else PLAIN_LEASE_S)
        if a["on_no_replacement"] not in ON_NO_REPLACEMENT:
            raise fail(f"on_no_replacement: expected 'fail' or 'wait', got {a['on_no_replacement']!r}")
        restarts = a["max_restarts"]
        if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
            raise fail(f"max_restarts: expected a non-negative integer, got {restarts!r}")
        for name, value, least in (("lease_seconds", lease, 3.0), ("host_timeout", a["host_timeout"], 2.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= least:
                raise fail(f"{name}: expected a number of seconds >= {least:g}, got {value!r}")
            if not value <= MAX_DURATION_S:
                raise fail(f"{name}: expected at most {MAX_DURATION_S:.0f} seconds (365 days), got {value!r}")
        sig = signal_name(a["preemption_signal"])
        if sig in (None, "KILL", "STOP"):
            raise fail(f"preemption_signal: expected a signal the job can catch, such as 'SIGTERM' or "
                       f"'SIGUSR1', got {a['preemption_signal']!r}")
        grace = a["preemption_grace"]
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not grace >= 0:
            raise fail(f"preemption_grace: expected a number of seconds >= 0, got {grace!r}")
        if not grace <= 86400:  # a victim that may take longer than a day to stop holds its preemptor for ever
            raise fail(f"preemption_grace: expected at most 86400 seconds (a day), got {grace!r}")
        if not isinstance(a["durable"], bool):
            raise fail(f"durable: expected True or False, got {a['durable']!r}")
        if unattended is None or unattended < 1:
            raise fail(f"unattended_timeout: expected a number of seconds >= 1, got {a['unattended_timeout']!r}")
        if unattended > MAX_UNATTENDED_S:
            raise fail(f"unattended_timeout: expected at most {MAX_UNATTENDED_S:.0f} seconds (30 days), "
                       f"got {a['unattended_timeout']!r}")
        need = unattended + float(grace) + LEASE_MARGIN_S
        if a["durable"] and float(lease) < need:
            raise AirflowFailException(
                f"lease_seconds {float(lease):g} is shorter than unattended_timeout {unattended:g} + "
                f"preemption_grace {float(grace):g} + {LEASE_MARGIN_S:g} s = {need:g} s: a job whose watcher is gone "
                f"runs until its hosts' dead-man switch stops it, and its lease must not free the GPUs before; raise "
                f"lease_seconds (or leave it unset) or lower unattended_timeout")
        return cls(bool(a["wait_for_capacity"]), _float(a["capacity_timeout"], "capacity_timeout"),
                   _float(a["capacity_poll_interval"], "capacity_poll_interval"), bool(a["deferrable"]),
                   a["on_no_replacement"], restarts, float(a["host_timeout"]), float(lease), a["durable"], unattended,
                   sig, float(grace))

    @property
    def renew_every(self) -> float:
        """How often a supervised job's lease is renewed: every half of ``unattended_timeout``."""
        return self.unattended_timeout / 2

    @property
    def queue_poll_interval(self) -> float:
        """Seconds between two looks at the job's queue entry (within a third of the lease)."""
        return min(self.capacity_poll_interval, self.lease_seconds / 3)

    def supervision(self, launch: str) -> Supervision:
        """How each host's supervisor guards ``launch`` (the dead-man switch and the stop)."""
        from airflow_hetero_gpu.launch.supervisor import Supervision

        return Supervision(self.unattended_timeout, self.preemption_signal, self.preemption_grace, launch)


@dataclass(frozen=True)
class Specs:
    """The operator's arguments, grouped and checked (:meth:`build`)."""

    request: RequestSpec
    fleet: FleetSpec
    program: ProgramSpec
    lifecycle: LifecycleSpec

    #: every argument the specs take (``task_type`` is the operator's ``training_task_type``)
    ARGUMENTS: ClassVar[tuple[str, ...]] = (*RequestSpec.ARGUMENTS, *FleetSpec.ARGUMENTS, *ProgramSpec.ARGUMENTS,
                                            *LifecycleSpec.ARGUMENTS)

    @classmethod
    def build(cls, arguments: Mapping[str, Any]) -> Specs:
        """The specs of ``arguments`` (argument name -> value, rendered): the first mistake fails
        in one line naming its argument."""
        lifecycle = LifecycleSpec.build(arguments)
        program = ProgramSpec.build(arguments)
        request = RequestSpec.build(arguments)
        return cls(request, FleetSpec.build(arguments), program, lifecycle)
