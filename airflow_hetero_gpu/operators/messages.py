"""The operator's words: why no pool fits, which worker failed first, GPU lists."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

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


def as_int(value: Any, name: str) -> int:
    """A positive-integer argument (``gpu_count``), or a one-line task failure naming it."""
    from airflow.sdk.exceptions import AirflowFailException

    if isinstance(value, bool):
        raise AirflowFailException(f"{name}: expected a positive integer, got {value!r}")
    try:
        number = int(str(value).strip()) if isinstance(value, str) else value
    except ValueError:
        raise AirflowFailException(f"{name}: expected a positive integer, got {value!r}") from None
    if not isinstance(number, int):
        raise AirflowFailException(f"{name}: expected a positive integer, got {value!r}")
    return number
