"""The figures of a fleet day (:mod:`airflow_hetero_gpu.testing.fleet_day`), from what the day left:
the ledger (evictions, readmissions, replacements, the health watch's collections, leftovers), the
files the training runs wrote (execute() start, job start), the logs (admission pass lines), the
sampler (GPUs held twice) and the CPU meter. :func:`render` prints them."""

from __future__ import annotations

import math
import re
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

#: the health watch's DAG (its collections name it)
WATCH_DAG = "fleet_day_health_watch"
PASS_LINE = re.compile(r"ledger: admission pass at (\S+): (\d+) waiting, (\d+) admitted, ([\d.]+) ms")
QUEUED = "deferring until one can"


def quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def _stats(values: Sequence[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": quantile(values, 0.5), "p99": quantile(values, 0.99),
            "max": max(values) if values else None}


def _ts(value: datetime) -> float:
    return value.timestamp()


def overlaps(began: float, ran: float, windows: Sequence[tuple[float, float]]) -> bool:
    """Whether the seconds from ``began`` to ``ran`` overlap one of ``windows`` (start, end)."""
    return any(began < end and ran > start for start, end in windows)


def task_starts(day, results: Path, checks: Sequence[tuple[float, float]] = ()) -> dict[str, Any]:
    """execute() start (the run's ``.exec`` file) to the job's first process running (its
    ``.start`` file: the command's first line), per run; split by whether the run waited in the queue,
    and those placed at once by whether they overlapped one of the health watch's ``checks``
    (start, end): a check of a large fleet keeps the cores busy (docs/performance.md)."""
    starts: dict[str, list[float]] = {"all": [], "placed at once": [], "waited in the queue": [],
                                      "placed at once, during a check": [], "placed at once, between checks": []}
    missing = []
    for run_id, info in day.runs.items():
        exec_file, start_file = results / f"{run_id}.exec", results / f"{info['job']}.start"
        if not exec_file.exists() or not start_file.exists():
            missing.append(run_id)
            continue
        began = float(exec_file.read_text().split()[0])
        ran = min(float(line.split()[0]) for line in start_file.read_text().splitlines() if line.strip())
        seconds = ran - began
        starts["all"].append(seconds)
        queued = QUEUED in day.final.get("task_logs", {}).get(run_id, "")
        starts["waited in the queue" if queued else "placed at once"].append(seconds)
        if not queued:
            starts["placed at once, during a check" if overlaps(began, ran, checks)
                   else "placed at once, between checks"].append(seconds)
    return {**{k: _stats(v) for k, v in starts.items()}, "not started": missing}


def watch_checks(ledger_url: str) -> list[tuple[float, float]]:
    """(start, end) of each of the health watch's checks (its collections: start to the last
    part), as POSIX timestamps."""
    from sqlalchemy import select

    from airflow_hetero_gpu.ledger import Ledger
    from airflow_hetero_gpu.ledger.schema import collections as coll_t

    with Ledger.open_existing(ledger_url) as ledger, ledger.db.engine.connect() as conn:
        rows = conn.execute(select(coll_t.c.started_at, coll_t.c.finished_at).where(
            coll_t.c.collector.like(f"GpuHealthSensor {WATCH_DAG}/%")).order_by(coll_t.c.started_at)).all()
    return [(_ts(a), _ts(b)) for a, b in rows]


def job_end(day, job: str) -> float | None:
    """When ``job``'s command would end: its last start (the ``.start`` file's last line: a job
    restarted on a replaced GPU or after a preemption starts again) plus the seconds it sleeps."""
    run = next((info for info in day.runs.values() if info["job"] == job), None)
    try:
        lines = (day.root / "results" / f"{job}.start").read_text().split("\n")
        last = [ln for ln in lines if ln.strip()][-1]
        return float(last.split()[0]) + float(run["conf"]["seconds"]) if run else None
    except (OSError, IndexError, ValueError):
        return None


def fault_outcomes(day, ledger_url: str) -> list[dict[str, Any]]:
    """Per injected fault: when the ledger recorded it (an eviction of the GPU, every GPU of a host
    that stopped answering evicted, a readmission of the host that came back) and the replacement
    of a faulted GPU a job held."""
    from sqlalchemy import select

    from airflow_hetero_gpu.ledger import Ledger
    from airflow_hetero_gpu.ledger.schema import gpu_events as ev_t

    with Ledger.open_existing(ledger_url) as ledger, ledger.db.engine.connect() as conn:
        events = conn.execute(select(ev_t.c.at, ev_t.c.host, ev_t.c.gpu_index, ev_t.c.kind, ev_t.c.job_id)
                              .order_by(ev_t.c.at)).all()
    out = []
    for f in day.faults:
        after = [e for e in events if e.host == f.host and _ts(e.at) >= f.at - 1.0]
        seen = None
        if f.kind in ("xid79", "ecc"):
            hits = [e for e in after if e.kind == "evicted" and e.gpu_index == f.index]
            seen = _ts(hits[0].at) if hits else None
        elif f.kind == "host_down":
            hits = {e.gpu_index: _ts(e.at) for e in reversed(after) if e.kind == "evicted"}
            seen = max(hits.values()) if len(hits) == 8 else None
        elif f.kind == "host_back":
            hits = [e for e in after if e.kind == "readmitted"]
            seen = _ts(hits[0].at) if hits else None
        replaced = [e for e in after if e.kind == "replaced" and e.gpu_index == f.index] if f.job else []
        ends = job_end(day, f.job) if f.job else None
        out.append({"kind": f.kind, "host": f.host, "index": f.index, "job": f.job, "injected_at": f.at,
                    "seen_at": seen, "seconds": None if seen is None else seen - f.at,
                    "replaced": bool(replaced), "job_ends": ends,
                    # the job still ran when the eviction was recorded (a job that ended just
                    # before has nothing to replace)
                    "held_at_eviction": bool(f.job and seen is not None and ends is not None and ends > seen + 5.0)})
    return out


def admission_passes(day) -> dict[str, Any]:
    """The admission passes that ran while the day's runs were in the system (from the ledger's
    debug line per pass): how many a minute, and what one cost."""
    window = (day.times["stream_start"], day.times.get("settled", day.times["stream_start"]))
    passes = []
    for line in day.final.get("admission_lines", []):
        m = PASS_LINE.search(line)
        if m:
            passes.append((datetime.fromisoformat(m.group(1)).timestamp(), int(m.group(2)), float(m.group(4))))
    inside = [p for p in passes if window[0] <= p[0] <= window[1]]
    minutes = max((window[1] - window[0]) / 60.0, 1e-9)
    return {"passes": len(inside), "per_minute": len(inside) / minutes, "ms": _stats([p[2] for p in inside]),
            "max_waiting": max((p[1] for p in inside), default=0)}


def leftovers(ledger_url: str) -> dict[str, int]:
    """Rows left in the ledger once every run ended: reservations and queue entries (expired or not)."""
    from sqlalchemy import func, select

    from airflow_hetero_gpu.ledger import Ledger
    from airflow_hetero_gpu.ledger.schema import queue_entries, reservations

    with Ledger.open_existing(ledger_url) as ledger, ledger.db.engine.connect() as conn:
        return {name: int(conn.execute(select(func.count()).select_from(table)).scalar_one())
                for name, table in (("reservations", reservations), ("queue_entries", queue_entries))}


def teams_and_preemptions(ledger_url: str) -> dict[str, Any]:
    """What quotas and preemption did: each team's standing at the end (fair share, decayed
    borrowed GPU-seconds), the most it held and borrowed at once (the ledger's share samples,
    one per admission pass), and every preemption of the day (victim, preemptor, reason, state,
    lost GPU-seconds)."""
    from datetime import timedelta

    from airflow_hetero_gpu.ledger import Ledger

    with Ledger.open_existing(ledger_url) as ledger:
        standing = ledger.team_standing()["teams"]
        samples = ledger.team_samples()
        preemptions = ledger.preemptions(since=timedelta(days=1))
    peak: dict[str, dict[str, int]] = {}
    for s in samples:
        p = peak.setdefault(s["team"], {"in_use": 0, "borrowed": 0})
        p["in_use"], p["borrowed"] = max(p["in_use"], s["in_use"]), max(p["borrowed"], s["borrowed"])
    return {"teams": {team: {**standing.get(team, {}), "peak": peak.get(team)} for team in sorted({*standing, *peak})},
            "preemptions": preemptions}


def _failure_line(log: str) -> str:
    lines = [ln for ln in log.splitlines() if "error" in ln.lower() or "failed" in ln.lower()]
    return (lines[-1] if lines else (log.strip().splitlines() or ["(no task log)"])[-1])[-400:]


def _cpu(day) -> dict[str, Any]:
    end = day.cpu.get("total", {})
    before = day.cpu.get("before stream", {})
    stream = day.cpu.get("stream", {})

    def group(values: dict[str, float], which: str) -> float:
        if which == "provider + Airflow":
            return sum(v for k, v in values.items() if k.startswith("airflow ") or k == "hetero-gpu commands")
        return sum(v for k, v in values.items() if k == which)

    groups = ("provider + Airflow", "postgresql", "redis", "emulated fleet (servers)")
    return {"whole day": {g: group(end, g) for g in groups},
            "stream (first trigger to every run final)": {g: group(stream, g) - group(before, g) for g in groups},
            "parts": end}


def report(day, ledger_url: str, results: Path) -> dict[str, Any]:
    states: dict[str, int] = {}
    for info in day.runs.values():
        states[info.get("state", "unknown")] = states.get(info.get("state", "unknown"), 0) + 1
    failed = {r: _failure_line(day.final.get("task_logs", {}).get(r, ""))
              for r, info in day.runs.items() if info.get("state") != "success"}
    sampler = day.final["sampler"]
    faults = fault_outcomes(day, ledger_url)
    windows = watch_checks(ledger_url)
    checks = [end - start for start, end in windows]
    stream_s = day.times.get("stream_end", 0) - day.times.get("stream_start", 0)
    gpu_seconds = sum(info["conf"]["gpus"] * info["conf"]["seconds"] for info in day.runs.values())
    return {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(day.cfg).items()},
        "runs": {"triggered": len(day.runs), "states": states, "not succeeded": failed,
                 "jobs": {info["job"]: {"team": info["conf"]["team"], "gpus": info["conf"]["gpus"],
                                        "gpu_type": info["conf"].get("gpu_type"), "state": info.get("state")}
                          for info in day.runs.values()},
                 "gpus_asked": sum(i["conf"]["gpus"] for i in day.runs.values()), "gpu_seconds_asked": gpu_seconds,
                 "stream_seconds": stream_s, "settle_seconds": day.times.get("settled", 0) - day.times.get("stream_end", 0),
                 "trigger_late_max_s": day.times.get("trigger_late_max", 0.0),
                 "max_live_jobs": sampler["max_live"], "max_gpus_held": sampler["max_gpus"]},
        "task_start_s": task_starts(day, results, windows),
        "health_checks": {**_stats(checks), "first": checks[0] if checks else None,
                          "steady": _stats(checks[1:]), "watch_state": day.final.get("watch_state"),
                          "trigger_to_first_check_s": day.times.get("first_watch_check_s")},
        "faults": faults,
        "fault_to_eviction_s": _stats([f["seconds"] for f in faults
                                       if f["kind"] != "host_back" and f["seconds"] is not None]),
        "admission": admission_passes(day),
        "held_twice": {"processes": len(sampler["twice"]), "reservations": len(sampler["held_twice"]),
                       "outside_reservation": len(sampler["outside"]), "samples": sampler["samples"],
                       "examples": [str(x) for x in (sampler["twice"] + sampler["held_twice"] + sampler["outside"])[:5]],
                       "sampler_error": sampler["error"]},
        "leaked": leftovers(ledger_url),
        **teams_and_preemptions(ledger_url),
        "orphans": len(day.final.get("orphans", [])),
        "cpu_s": _cpu(day),
        "wall_s": day.times.get("ended", 0) - day.times.get("started", 0),
    }


def _fmt(v: Any, unit: str = " s") -> str:
    return "-" if v is None else f"{v:.2f}{unit}"


def render(r: dict[str, Any]) -> str:
    c, runs = r["config"], r["runs"]
    lines = [f"fleet day: {c['hosts']} hosts x 8 GPUs, {c['minutes']:g} min of stream at {c['rate']:g} runs/min, "
             f"watch every {c['watch_interval']:g} s; wall {r['wall_s'] / 60:.1f} min",
             f"runs: {runs['triggered']} triggered, {runs['states']}; at most {runs['max_live_jobs']} jobs / "
             f"{runs['max_gpus_held']} GPUs held at once; every run final {runs['settle_seconds']:.0f} s after the "
             f"stream; triggers at most {runs['trigger_late_max_s']:.1f} s late"]
    for run_id, why in runs["not succeeded"].items():
        lines.append(f"  {run_id} not succeeded: {why}")
    ts = r["task_start_s"]
    for k in ("all", "placed at once", "placed at once, during a check", "placed at once, between checks",
              "waited in the queue"):
        lines.append(f"task start (execute() -> job running), {k}: n={ts[k]['n']} p50 {_fmt(ts[k]['p50'])} "
                     f"p99 {_fmt(ts[k]['p99'])} max {_fmt(ts[k]['max'])}")
    hc = r["health_checks"]
    lines.append(f"health checks: {hc['n']} (watch {hc['watch_state']}), first {_fmt(hc['first'])} (ended "
                 f"{_fmt(hc['trigger_to_first_check_s'])} after the watch was triggered), steady p50 "
                 f"{_fmt(hc['steady']['p50'])} max {_fmt(hc['steady']['max'])}")
    for f in r["faults"]:
        where = f"{f['host']}" + (f" GPU {f['index']}" if f["index"] is not None else "")
        what = "readmitted" if f["kind"] == "host_back" else "evicted"
        lines.append(f"fault {f['kind']:<9} {where:<16} -> {what} after {_fmt(f['seconds'])}"
                     + (f"; held by a job, replaced: {f['replaced']}" if f["job"] else ""))
    fe = r["fault_to_eviction_s"]
    lines.append(f"fault to eviction: p50 {_fmt(fe['p50'])} max {_fmt(fe['max'])} (n={fe['n']})")
    a = r["admission"]
    lines.append(f"admission passes: {a['passes']} ({a['per_minute']:.1f}/min), p50 {_fmt(a['ms']['p50'], ' ms')} "
                 f"p99 {_fmt(a['ms']['p99'], ' ms')} max {_fmt(a['ms']['max'], ' ms')}, up to {a['max_waiting']} waiting")
    for team, t in r["teams"].items():
        peak = t.get("peak") or {"in_use": 0, "borrowed": 0}
        lines.append(f"team {team}: at most {peak['in_use']} GPUs held, {peak['borrowed']} borrowed at once; "
                     f"decayed borrowed {t.get('decayed_borrowed_gpu_s', 0):g} GPU-s, fair share {t.get('fair_share', 0):g}")
    for p in r["preemptions"]:
        lines.append(f"preemption: {p['victim']} for {p['preemptor']} ({p['reason']}): {p['state']}, "
                     f"{p['lost_gpu_s'] or 0:.0f} GPU-s lost")
    h = r["held_twice"]
    lines.append(f"GPUs held twice: {h['processes']} (processes), {h['reservations']} (reservations), processes "
                 f"outside their reservation: {h['outside_reservation']} ({h['samples']} samples)")
    lines.append(f"leaked: {r['leaked']['reservations']} reservations, {r['leaked']['queue_entries']} queue entries; "
                 f"orphaned processes: {r['orphans']}")
    for period, groups in (("whole day", r["cpu_s"]["whole day"]),
                           ("stream", r["cpu_s"]["stream (first trigger to every run final)"])):
        lines.append(f"CPU, {period}: " + ", ".join(f"{k} {v:.0f} s" for k, v in groups.items()))
    return "\n".join(lines)


__all__ = ["report", "render", "fault_outcomes", "quantile"]
