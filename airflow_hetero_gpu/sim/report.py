"""The simulation report: every policy's metrics, where ``seed`` stands against each baseline,
the weight sweep, as one JSON document and as readable tables."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from airflow_hetero_gpu.sim.experiment import WEIGHT_NAMES, RunOutcome, weights_label

# metric -> (better: "min" | "max", absolute tolerance under which two values tie, heading)
COMPARED: dict[str, tuple[str, float, str]] = {
    "wait_mean_s": ("min", 1.0, "wait mean s"),
    "wait_p95_s": ("min", 1.0, "wait p95 s"),
    "makespan_s": ("min", 1.0, "makespan s"),
    "unallocated_while_waiting": ("min", 0.001, "unalloc wait"),
    "distance_mean": ("min", 0.01, "d(S) multi"),
    "one_host_share": ("max", 0.001, "one host"),
    "run_time_overhead": ("min", 0.001, "run-time +"),
    "decision_ms_mean": ("min", 0.0, "decide ms"),
}
GOAL_METRICS = ("distance_mean", "unallocated_while_waiting", "wait_mean_s")
PARETO_METRICS = ("distance_mean", "unallocated_while_waiting")
GOAL_SLACK = 0.05


def _better(metric: str, a: float, b: float) -> int:
    """1 if ``a`` is better than ``b`` beyond the metric's tolerance, -1 if worse, 0 if tied."""
    better, tol, _ = COMPARED[metric]
    diff = (b - a) if better == "min" else (a - b)
    if abs(diff) <= tol:
        return 0
    return 1 if diff > 0 else -1


def compare(metrics: Mapping[str, Mapping[str, Any]], subject: str = "seed") -> dict[str, Any]:
    """Where ``subject`` stands on each metric against each other policy, and the goal check:

    * Pareto: no other policy is at least as good on both :data:`PARETO_METRICS` and better on
      one (beyond the tolerances of :data:`COMPARED`);
    * within 5 %: on each of :data:`GOAL_METRICS` the subject is at most 5 % worse than the best
      policy, or within the metric's absolute tolerance of it.
    """
    if subject not in metrics:
        return {}
    me = metrics[subject]
    others = [p for p in metrics if p != subject]
    per_metric: dict[str, Any] = {}
    for m, (better, tol, _) in COMPARED.items():
        values = {p: metrics[p].get(m) for p in metrics if metrics[p].get(m) is not None}
        if me.get(m) is None or not values:
            continue
        best_policy = (min if better == "min" else max)(values, key=values.get)
        best = values[best_policy]
        gap = (me[m] - best) if better == "min" else (best - me[m])  # >= 0: how much worse
        per_metric[m] = {
            "better": better,
            "seed": me[m],
            "best": best,
            "best_policy": best_policy,
            "gap": gap,
            "gap_relative": gap / abs(best) if best else (0.0 if gap == 0 else None),
            "vs": {p: {1: "better", 0: "tie", -1: "worse"}[_better(m, me[m], values[p])]
                   for p in others if p in values},
        }
    dominated_by = [
        p for p in others
        if all(metrics[p].get(m) is not None and me.get(m) is not None for m in PARETO_METRICS)
        and all(_better(m, metrics[p][m], me[m]) >= 0 for m in PARETO_METRICS)
        and any(_better(m, metrics[p][m], me[m]) > 0 for m in PARETO_METRICS)
    ]
    within = {}
    for m in GOAL_METRICS:
        if m in per_metric:
            c = per_metric[m]
            within[m] = bool(c["gap"] <= COMPARED[m][1] or (c["gap_relative"] is not None and c["gap_relative"] <= GOAL_SLACK))
    return {
        "subject": subject,
        "metrics": per_metric,
        "pareto": {"metrics": list(PARETO_METRICS), "dominated_by": dominated_by, "holds": not dominated_by},
        "within_5_percent": {"metrics": within, "holds": all(within.values()) if within else False},
        "goal_holds": not dominated_by and bool(within) and all(within.values()),
    }


def build_report(*, command: str, trace: Mapping[str, Any], cluster: Mapping[str, Any],
                 settings: Mapping[str, Any], runs: Sequence[RunOutcome],
                 sweep: Sequence[tuple[Mapping[str, float], RunOutcome]] = (), runtime_s: float | None = None) -> dict:
    """The JSON report (``report.json``)."""
    metrics = {r.spec.name: r.metrics for r in runs}
    # the policy measured against the others: seed, else the first seed variant listed
    subject = "seed" if "seed" in metrics else next((p for p in metrics if p.startswith("seed")), None)
    report: dict[str, Any] = {
        "command": command,
        "trace": dict(trace),
        "cluster": dict(cluster),
        "settings": dict(settings),
        "policies": [
            {"policy": r.spec.name, "weights": dict(r.spec.weights) if r.spec.weights else None,
             "metrics": r.metrics, "rejected": len(r.rejected), "series": r.series}
            for r in runs
        ],
        "comparison": compare(metrics, subject) if subject else None,
    }
    if sweep:
        rows = []
        for w, r in sweep:
            cmp = compare({**{k: v for k, v in metrics.items() if not k.startswith("seed")}, "seed": r.metrics})
            rows.append({"weights": {n: w[n] for n in WEIGHT_NAMES}, "metrics": r.metrics,
                         "goal_holds": cmp.get("goal_holds"), "dominated_by": cmp.get("pareto", {}).get("dominated_by")})
        report["sweep"] = rows
    if runtime_s is not None:
        report["runtime_s"] = round(runtime_s, 1)
    return report


def _cell(v: Any, metric: str) -> str:
    if v is None:
        return "-"
    if metric in ("allocation_mean", "unallocated_while_waiting", "one_host_share", "run_time_overhead"):
        return f"{100 * v:.2f} %"
    if metric == "makespan_s":
        return f"{v:,.0f}"
    if metric == "decision_ms_mean":
        return f"{v:.3f}"
    if metric == "distance_mean":
        return f"{v:.3f}"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


TABLE_METRICS = ("wait_mean_s", "wait_p95_s", "wait_max_s", "makespan_s", "allocation_mean", "unallocated_while_waiting",
                 "distance_mean", "one_host_share", "spanning_jobs", "run_time_overhead", "decision_ms_mean")
# shown, not ranked: a policy whose placements run slower holds GPUs longer, so a higher
# allocation rate is not by itself better
HEADINGS = {**{m: h for m, (_, _, h) in COMPARED.items()}, "spanning_jobs": "spanning", "allocation_mean": "alloc mean",
            "wait_max_s": "wait max s"}


def policy_rows(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    headers = ["policy", *(HEADINGS[m] for m in TABLE_METRICS)]
    rows = [[p["policy"], *(_cell(p["metrics"].get(m), m) for m in TABLE_METRICS)] for p in report["policies"]]
    return headers, rows


def sweep_rows(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    cols = ("wait_mean_s", "wait_p95_s", "unallocated_while_waiting", "distance_mean", "one_host_share", "spanning_jobs")
    headers = ["w1 LB", "w2 FR", "w3 TS", "w4 FB", *(HEADINGS[m] for m in cols), "goal"]
    rows = []
    for row in report.get("sweep", []):
        w = row["weights"]
        rows.append([*(f"{w[n]:g}" for n in WEIGHT_NAMES),
                     *(_cell(row["metrics"].get(m), m) for m in cols), "yes" if row["goal_holds"] else "no"])
    return headers, rows


def comparison_lines(report: Mapping[str, Any]) -> list[str]:
    cmp = report.get("comparison")
    if not cmp:
        return []
    lines = []
    me = cmp["subject"]
    for m, c in cmp["metrics"].items():
        worse = [p for p, v in c["vs"].items() if v == "worse"]
        better = [p for p, v in c["vs"].items() if v == "better"]
        rel = c["gap_relative"]
        if c["gap"] <= COMPARED[m][1]:
            where = "best"
        elif rel is None:
            where = f"behind {c['best_policy']}"
        elif rel >= 1:
            where = f"{1 + rel:.0f}x {c['best_policy']}'s"
        else:
            where = f"{100 * rel:.1f} % behind {c['best_policy']}"
        lines.append(f"{HEADINGS[m]:>13}: {me} {_cell(c['seed'], m)} ({where}); beats {', '.join(better) or 'none'}; "
                     f"loses to {', '.join(worse) or 'none'}")
    p, w = cmp["pareto"], cmp["within_5_percent"]
    lines.append(f"Pareto ({' and '.join(p['metrics'])}): {'holds' if p['holds'] else 'fails, dominated by ' + ', '.join(p['dominated_by'])}")
    lines.append("within 5 % of the best: " + ", ".join(f"{m} {'yes' if ok else 'no'}" for m, ok in w["metrics"].items()))
    return lines


def queue_label(settings: Mapping[str, Any]) -> str:
    """``admission queue (aging 3600 s)``, ``fifo queue, backfill 16``, ``greedy queue``."""
    q = settings.get("queue", "fifo")
    if q == "admission":
        aging = settings.get("aging_interval_s")
        return f"admission queue ({f'aging {aging:g} s' if aging else 'no aging'})"
    if q == "fifo":
        return f"fifo queue, backfill {settings.get('backfill', 0)}"
    return f"{q} queue"


def wait_rows(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Queueing delay by job size: one row per policy, mean / p95 / max seconds per size."""
    sizes = sorted({int(k) for p in report["policies"] for k in p["metrics"].get("wait_by_gpus", {})})
    headers = ["policy", *(f"{k} GPU{'s' if k > 1 else ''} mean/p95/max s" for k in sizes)]
    rows = []
    for p in report["policies"]:
        by = p["metrics"].get("wait_by_gpus", {})
        rows.append([p["policy"], *(
            "{:.1f} / {:.1f} / {:.1f}".format(by[str(k)]["mean_s"], by[str(k)]["p95_s"], by[str(k)]["max_s"])
            if str(k) in by else "-" for k in sizes)])
    return headers, rows


def render_text(report: Mapping[str, Any]) -> str:
    """The report as plain text tables."""
    from airflow_hetero_gpu.text import table

    t = report["trace"]
    s = report["settings"]
    out = [
        f"trace: {t['source']} - {t['jobs']} jobs ({t.get('multi_gpu_jobs', '?')} multi-GPU), "
        f"arrivals compressed {t['time_scale']:.4g}x (offered load {t['offered_load']:.2f})",
        f"cluster: {report['cluster']['hosts']} hosts, {report['cluster']['gpus']} GPUs; {queue_label(s)}, "
        f"comm cost {s['comm_cost']}, spanning {s['span']}, seed {s['seed']}",
        "",
        table(*policy_rows(report)),
    ]
    if any(p["metrics"].get("wait_by_gpus") for p in report["policies"]):
        out += ["", "queueing delay by job size:", table(*wait_rows(report))]
    lines = comparison_lines(report)
    if lines:
        out += ["", f"{report['comparison']['subject']} against the other policies:", *lines]
    if report.get("sweep"):
        out += ["", "weight sweep of seed (w2 has no effect: FR is 0 with whole-GPU jobs):", table(*sweep_rows(report))]
    if report.get("runtime_s") is not None:
        out += ["", f"simulated in {report['runtime_s']:.1f} s"]
    return "\n".join(out)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


__all__ = ["COMPARED", "build_report", "compare", "render_text", "markdown_table", "weights_label", "queue_label",
           "wait_rows"]
