"""The operator's words: why no pool fits, which worker failed first, GPU lists."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from airflow_hetero_gpu.core.model import PlanResult


def failure_message(job_id: str, res) -> str:
    """One line: the first host that failed with the first error line its workers printed, every
    other host that failed with torchrun's root cause (the crash may have started there: a dying
    peer makes the others fail too). The hosts' output is in the task log above it."""
    from airflow_hetero_gpu.launch.remote import summarize_tail

    f = res.failure
    others = [
        f"{r.host} exited with {r.exit_code}" + (f" ({summarize_tail(r.tail)})" if summarize_tail(r.tail) else "")
        for r in res.hosts if r.host != f.host and r.exit_code not in (0, None)
    ]
    first_error = next((r.first_error for r in res.hosts if r.host == f.host and r.first_error), None) \
        or next((r.first_error for r in res.hosts if r.first_error), None)
    head = f"job {job_id}: worker on {f.host} (node rank {f.rank}) exited with {f.exit_code} first"
    if first_error:
        head += f": {first_error}"
    if f.summary:
        head += f" ({f.summary})"
    if others:
        head += "; also failed: " + "; ".join(others)
    return f"{head}. The other hosts were stopped; their output is in the task log above."


def pool_reasons(result: PlanResult) -> str:
    """Every pool's reason, on one line."""
    return "; ".join(f"{p.pool}: {p.reason}" for p in result.pools) or "no GPUs collected"


def fmt_gpus(gpus: Sequence[tuple]) -> str:
    """``host GPU 0,1; other GPU 3`` (``GPU 2 MIG 1`` for a MIG instance)."""
    by: dict[str, list[str]] = {}
    for key in gpus:
        host, index = key[0], key[1]
        instance = key[2] if len(key) > 2 else None
        by.setdefault(host, []).append(str(index) if instance is None else f"{index} MIG {instance}")
    return "; ".join(f"{h} GPU {','.join(ix)}" for h, ix in by.items())


def key_json(key: tuple) -> dict:
    """``{"host", "index"}``, with ``"instance"`` for a MIG instance."""
    instance = key[2] if len(key) > 2 else None
    return {"host": key[0], "index": key[1], **({} if instance is None else {"instance": instance})}

