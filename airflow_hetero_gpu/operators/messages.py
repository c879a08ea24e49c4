"""The operator's words: why no pool fits, which worker failed first, GPU lists."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from airflow_hetero_gpu.core.model import PlanResult


def failure_message(job_id: str, res) -> str:
    """The first host that failed, every other host that failed with torchrun's root cause (the
    crash may have started there: a dying peer makes the others fail too), and the first's tail."""
    from airflow_hetero_gpu.launch.remote import summarize_tail

    f = res.failure
    others = [
        f"{r.host} exited with {r.exit_code}" + (f" ({summarize_tail(r.tail)})" if summarize_tail(r.tail) else "")
        for r in res.hosts if r.host != f.host and r.exit_code not in (0, None)
    ]
    head = f"job {job_id}: worker on {f.host} (node rank {f.rank}) exited with {f.exit_code} first"
    if f.summary:
        head += f" ({f.summary})"
    if others:
        head += "; also failed: " + "; ".join(others)
    tail = "\n".join(f.tail[-20:])
    return f"{head}. The other hosts were stopped. Last lines from {f.host}:\n{tail}"


def pool_reasons(result: PlanResult) -> str:
    """Every pool's reason, on one line."""
    return "; ".join(f"{p.pool}: {p.reason}" for p in result.pools) or "no GPUs collected"


def fmt_gpus(gpus: Sequence[tuple[str, int]]) -> str:
    """``host GPU 0,1; other GPU 3``."""
    by: dict[str, list[str]] = {}
    for h, i in gpus:
        by.setdefault(h, []).append(str(i))
    return "; ".join(f"{h} GPU {','.join(ix)}" for h, ix in by.items())
