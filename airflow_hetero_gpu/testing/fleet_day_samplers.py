"""What a fleet day (:mod:`airflow_hetero_gpu.testing.fleet_day`) watches while it runs: the CPU of
each part's process tree (:class:`CpuMeter`), and every couple of seconds the ledger's live
reservations beside the job processes on the emulated hosts (:class:`Sampler`): a GPU used by two
jobs at once, held by two reservations, or used outside its job's reservation is recorded."""

from __future__ import annotations

import threading
from typing import Any, Callable

from airflow_hetero_gpu.testing import procs


# --- CPU of process trees -------------------------------------------------------------------------
def tree_cpu(pid: int) -> float:
    """User + system seconds of a process and every descendant (the reaped ones through their
    parents' children times)."""
    import psutil

    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in members:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class CpuMeter:
    """CPU seconds per part of the system, sampled (a process tree's time is lost when its root
    ends, so each part keeps the largest value it was seen at)."""

    def __init__(self) -> None:
        self.parts: dict[str, Callable[[], float]] = {}
        self.seen: dict[str, float] = {}
        self.extra: dict[str, float] = {}

    def add(self, name: str, read: Callable[[], float]) -> None:
        self.parts[name] = read

    def sample(self) -> dict[str, float]:
        for name, read in self.parts.items():
            try:
                value = read()
            except Exception:  # noqa: BLE001 - a part that has ended keeps its last value
                continue
            self.seen[name] = max(self.seen.get(name, 0.0), value)
        out = dict(self.seen)
        for name, value in self.extra.items():
            out[name] = out.get(name, 0.0) + value
        return out


# --- what runs on the hosts and what the ledger holds ---------------------------------------------
def gpu_processes(marker: str) -> dict[tuple[str, str], set[str]]:
    """(host, device) -> the jobs whose processes run there now (from /proc: every process a
    launch starts carries HETERO_GPU_JOB_ID, HETERO_GPU_HOST, CUDA_VISIBLE_DEVICES and the
    emulated host's marker)."""
    found: dict[tuple[str, str], set[str]] = {}
    ours = f"{marker}.".encode()
    for pid in procs.all_pids():
        try:
            raw = (procs.PROC / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        if ours not in raw or b"HETERO_GPU_JOB_ID=" not in raw:
            continue
        env = dict(e.split(b"=", 1) for e in raw.split(b"\0") if b"=" in e)
        job, host, devices = env.get(b"HETERO_GPU_JOB_ID"), env.get(b"HETERO_GPU_HOST"), env.get(b"CUDA_VISIBLE_DEVICES")
        if job and host and devices and env.get(b"HETERO_GPU_EMU_MARKER", b"").startswith(ours):
            for device in devices.decode().split(","):
                found.setdefault((host.decode(), device), set()).add(job.decode())
    return found


class Sampler(threading.Thread):
    """Every ``period`` seconds: the ledger's live reservations and the job processes on the hosts.
    A GPU in two jobs' processes at once, or a process on a GPU its job does not hold, is recorded."""

    def __init__(self, ledger_url: str, marker: str, cpu: CpuMeter, period: float = 2.0):
        super().__init__(daemon=True, name="fleet-day-sampler")
        self.ledger_url, self.marker, self.cpu, self.period = ledger_url, marker, cpu, period
        self.samples = 0
        self.twice: list[tuple[tuple[str, str], set[str]]] = []  # GPUs two jobs' processes ran on at once
        self.held_twice: list[tuple[Any, set[str]]] = []  # units two live reservations held at once
        self.outside: list[tuple[str, tuple[str, str]]] = []  # processes on GPUs their job does not hold
        self.max_live = 0
        self.max_gpus = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def held(self, ledger) -> dict[str, set[tuple[str, str]]]:
        out: dict[str, set[tuple[str, str]]] = {}
        units: dict[Any, set[str]] = {}
        for r in ledger.live_reservations():
            for g in r.gpus:
                whole = g.instance is None  # a MIG instance runs with its MIG- UUID as the device
                out.setdefault(r.job_id, set()).add((g.host, str(g.index) if whole else str(g.uuid)))
                units.setdefault((g.host, g.index), set()).add(f"{r.job_id}:{'whole' if whole else g.instance}")
        for key, jobs in units.items():  # a whole GPU and a MIG slice of it held by two jobs
            owners = {j.split(":", 1)[0] for j in jobs}
            if len(owners) > 1 and any(j.endswith(":whole") for j in jobs):
                self.held_twice.append((key, owners))
        return out

    def run(self) -> None:
        from airflow_hetero_gpu.ledger import Ledger

        try:
            with Ledger.open_existing(self.ledger_url) as ledger:
                while not self._halt.is_set():
                    before = self.held(ledger)
                    running = gpu_processes(self.marker)
                    after = self.held(ledger)
                    # a GPU the watch evicted from a running job: its processes move at the job's next look
                    evicted = {(k.host, str(k.index)) for k in ledger.evicted_map()}
                    self.samples += 1
                    self.max_live = max(self.max_live, len(after))
                    self.max_gpus = max(self.max_gpus, sum(len(v) for v in after.values()))
                    for gpu, jobs in running.items():
                        if len(jobs) > 1:
                            self.twice.append((gpu, jobs))
                        for job in jobs:
                            if gpu not in before.get(job, set()) | after.get(job, set()) and gpu not in evicted:
                                self.outside.append((job, gpu))
                    self.cpu.sample()
                    self._halt.wait(self.period)
        except BaseException as err:  # noqa: BLE001 - reported by the day
            self.error = err

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


__all__ = ["CpuMeter", "Sampler", "gpu_processes", "tree_cpu"]
