"""PNG plots of a simulation report (matplotlib, Agg backend: no display needed).

* ``sim-allocation.png``: share of GPUs allocated and jobs waiting over time, per policy
* ``sim-cdf.png``: distribution of queueing delays and of d(S) of multi-GPU jobs, per policy
* ``sim-pareto.png``: mean d(S) against unallocated share while jobs wait (policies, sweep)
* ``sim-sweep.png``: the seed's weight sweep as heat maps over (w1, w3)
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.sim.experiment import RunOutcome

COLORS = {"seed": "#d62728", "random": "#7f7f7f", "first-fit": "#1f77b4", "best-fit": "#2ca02c",
          "topology-only": "#9467bd", "fgd": "#ff7f0e"}


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise HeteroGpuError("plots need matplotlib (pip install matplotlib), or run without --out") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(name: str) -> str | None:
    return COLORS.get(name.split(" ")[0])


def plot_allocation(report: Mapping, path: Path) -> None:
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for p in report["policies"]:
        s = p["series"]
        t = np.array(s["t"]) / 3600.0
        ax1.step(t, 100 * np.array(s["allocation"]), where="post", label=p["policy"], color=_color(p["policy"]), lw=1.2)
        ax2.step(t, s["queued"], where="post", color=_color(p["policy"]), lw=1.2)
    ax1.set_ylabel("GPUs allocated (%)")
    ax1.set_ylim(0, 102)
    ax1.legend(loc="lower right", fontsize=8, ncol=2)
    ax2.set_ylabel("jobs waiting")
    ax2.set_xlabel("hours since the first arrival (compressed trace time)")
    fig.suptitle("Allocation and queue over time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_cdfs(runs: Sequence[RunOutcome], path: Path) -> None:
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for r in runs:
        for ax, values in ((ax1, r.waits), (ax2, r.distances)):
            v = np.sort(np.asarray(values, dtype=float))
            if len(v):
                ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=r.spec.name,
                        color=_color(r.spec.name), lw=1.2)
    ax1.set_xscale("symlog", linthresh=1.0)
    ax1.set_xlabel("queueing delay (s)")
    ax1.set_ylabel("share of jobs")
    ax1.set_title("Queueing delay")
    ax2.set_xlabel("d(S), mean GPU distance (SPEC §5)")
    ax2.set_title("Distance of multi-GPU jobs")
    ax2.set_xscale("log")
    ax2.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_pareto(report: Mapping, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 5))
    for row in report.get("sweep", []):
        m = row["metrics"]
        ax.scatter(m["distance_mean"], 100 * m["unallocated_while_waiting"], s=14, color="#bbbbbb", zorder=1)
    if report.get("sweep"):
        ax.scatter([], [], s=14, color="#bbbbbb", label="seed, other weights (sweep)")
    for p in report["policies"]:
        m = p["metrics"]
        ax.scatter(m["distance_mean"], 100 * m["unallocated_while_waiting"], s=60, color=_color(p["policy"]),
                   label=p["policy"], zorder=3, edgecolor="black", lw=0.5)
    ax.set_xlabel("mean d(S) of multi-GPU jobs (lower is better)")
    ax.set_ylabel("GPUs unallocated while a job waits (%, lower is better)")
    ax.set_title("Distance against stranded capacity")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(report: Mapping, path: Path) -> bool:
    """Heat maps over w1 and w4 (w3 when w4 does not vary), the other weights held at the
    default's value (else their most common one); False when there is no sweep."""
    rows = report.get("sweep") or []
    if not rows:
        return False
    plt = _plt()
    from airflow_hetero_gpu.core.config import Weights

    default = Weights().model_dump()
    x_name = "free_blocks" if len({r["weights"]["free_blocks"] for r in rows}) > 1 else "topology"
    held = {}
    for name in ("fragmentation", "topology", "free_blocks"):
        if name == x_name:
            continue
        values = [r["weights"][name] for r in rows]
        held[name] = default[name] if default[name] in values else max(set(values), key=values.count)
        rows = [r for r in rows if r["weights"][name] == held[name]]
    w1 = sorted({r["weights"]["load_balance"] for r in rows})
    w3 = sorted({r["weights"][x_name] for r in rows})
    panels = (("distance_mean", "mean d(S), multi-GPU"), ("wait_mean_s", "mean queueing delay (s)"),
              ("spanning_jobs", "jobs spanning hosts"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    for ax, (metric, title) in zip(axes, panels):
        grid = np.full((len(w1), len(w3)), np.nan)
        for r in rows:
            v = r["metrics"].get(metric)
            if v is not None:
                grid[w1.index(r["weights"]["load_balance"]), w3.index(r["weights"][x_name])] = v
        im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis_r")
        lo, hi = np.nanmin(grid), np.nanmax(grid)
        for i in range(len(w1)):
            for j in range(len(w3)):
                if not np.isnan(grid[i, j]):
                    dark = hi > lo and (grid[i, j] - lo) / (hi - lo) > 0.5  # dark end of viridis_r
                    ax.text(j, i, f"{grid[i, j]:.3g}", ha="center", va="center", fontsize=7,
                            color="white" if dark else "black")
        ax.set_xticks(range(len(w3)), [f"{v:g}" for v in w3])
        ax.set_yticks(range(len(w1)), [f"{v:g}" for v in w1])
        ax.set_xlabel("w4 (free blocks)" if x_name == "free_blocks" else "w3 (topology)")
        ax.set_ylabel("w1 (load balance)")
        ax.set_title(title, fontsize=10)
        fig.colorbar(im, ax=ax, shrink=0.8)
    short = {"fragmentation": "w2", "topology": "w3", "free_blocks": "w4"}
    fixed = ", ".join(f"{short[n]} = {v:g}" for n, v in held.items())
    fig.suptitle(f"seed weight sweep ({fixed}; lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_plots(report: Mapping, runs: Sequence[RunOutcome], out: Path, prefix: str = "sim-") -> list[Path]:
    """Write every plot into ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / f"{prefix}allocation.png", out / f"{prefix}cdf.png", out / f"{prefix}pareto.png"]
    plot_allocation(report, files[0])
    plot_cdfs(runs, files[1])
    plot_pareto(report, files[2])
    sweep = out / f"{prefix}sweep.png"
    if plot_sweep(report, sweep):
        files.append(sweep)
    return files
