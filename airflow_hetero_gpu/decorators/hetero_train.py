"""``@task.hetero_train``: a TaskFlow function run on every rank of a torchrun job, on the GPUs
the planner chose, by :class:`~airflow_hetero_gpu.operators.hetero_train.HeteroTrainOperator`.

::

    @task.hetero_train(gpu_count=8, gpu_type="A100*", checkpoint_dir="/shared/ckpt/{{ run_id }}")
    def train(lr: float, epochs: int):
        import torch.distributed as dist
        ...
        return {"loss": loss}        # rank 0's return value goes to XCom

The operator underneath does everything it does for a script (collection, plan, reservation,
leftover sweep, launch, lease, replacement and restart, logs, cleanup, the ``decision`` XCom);
only what runs differs: torchrun starts the job's payload
(:mod:`~airflow_hetero_gpu.decorators.payload`: the host runner, the function's source and its
pickled arguments), sent to every host on the SSH channel. Rank 0's return value comes back as
marked lines of its output (:mod:`~airflow_hetero_gpu.decorators.rank_output`), which are not
logged, and is the task's return value (``return_value``); the operator's run facts go to the
XCom key ``run``. A rank whose function raises fails the task with its host, rank and the
traceback's last line.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence

from airflow.sdk.bases.decorator import DecoratedOperator, TaskDecorator, task_decorator_factory
from airflow.sdk.definitions.context import KNOWN_CONTEXT_KEYS
from airflow.sdk.exceptions import AirflowException

from airflow_hetero_gpu.decorators.payload import PayloadError, build_payload, new_nonce
from airflow_hetero_gpu.decorators.rank_output import RankOutput, ResultMissing
from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

#: the operator's arguments that say what to run: the decorated function takes their place
_NOT_FOR_A_FUNCTION = ("script", "script_args", "command")


class HeteroTrainDecoratedOperator(DecoratedOperator, HeteroTrainOperator):
    """The operator behind ``@task.hetero_train``: :class:`HeteroTrainOperator` running the
    decorated function on every rank. Takes every argument of the operator except ``script``,
    ``script_args`` and ``command``; ``op_args`` / ``op_kwargs`` (the function's arguments, which
    may be XComArgs of upstream tasks) are templated like the operator's templated arguments."""

    custom_operator_name = "@task.hetero_train"
    template_fields: Sequence[str] = (
        *DecoratedOperator.template_fields,
        *(f for f in HeteroTrainOperator.template_fields if f not in _NOT_FOR_A_FUNCTION),
    )
    template_fields_renderers = {
        **DecoratedOperator.template_fields_renderers,
        **{k: v for k, v in HeteroTrainOperator.template_fields_renderers.items() if k not in _NOT_FOR_A_FUNCTION},
    }

    def __init__(self, *, python_callable: Callable, op_args: Collection[Any] | None = None,
                 op_kwargs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        given = [name for name in _NOT_FOR_A_FUNCTION if name in kwargs]
        if given:
            raise TypeError(f"@task.hetero_train runs the decorated function under torchrun; it takes no "
                            f"{', '.join(given)} argument")
        if inspect.iscoroutinefunction(inspect.unwrap(python_callable)):
            raise TypeError(f"@task.hetero_train: {python_callable.__name__!r} is async; give a plain def function")
        # the function's return value travels in lines marked with a nonce of the try that
        # launched it: a retry could not read a reattached job's, so the function runs as before
        kwargs.setdefault("durable", False)
        super().__init__(python_callable=python_callable, op_args=op_args, op_kwargs=op_kwargs,
                         script=f"@task.hetero_train function {python_callable.__name__}", **kwargs)
        self._payload: bytes | None = None
        self._output: RankOutput | None = None

    # --- what runs ----------------------------------------------------------------------------
    def _function_arguments(self, context: Context) -> tuple[list[Any], dict[str, Any]]:
        """The function's arguments as the task runs (rendered, XComArgs resolved): op_args,
        op_kwargs, the task context values its signature names (``run_id``, ``params``, ...:
        they must pickle) and ``checkpoint_dir`` (the rendered argument) when it names one."""
        parameters = inspect.signature(self.python_callable).parameters
        positional = [n for n, p in parameters.items()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:len(self.op_args)]
        kwargs = dict(self.op_kwargs)
        for name, parameter in parameters.items():
            if name in kwargs or name in positional or parameter.kind in (parameter.VAR_POSITIONAL,
                                                                          parameter.VAR_KEYWORD):
                continue
            if name == "checkpoint_dir":
                kwargs[name] = self.checkpoint_dir
            elif name in KNOWN_CONTEXT_KEYS and name in context:
                value = context[name]
                # a mapping of Airflow's own (params) travels as a plain dict
                kwargs[name] = dict(value) if isinstance(value, Mapping) and not isinstance(value, dict) else value
        return list(self.op_args), kwargs

    def _prepare(self, context: Context) -> None:
        args, kwargs = self._function_arguments(context)
        nonce = new_nonce()
        try:
            self._payload = build_payload(self.python_callable, args, kwargs, nonce)
        except PayloadError as err:
            raise self._fail(f"@task.hetero_train: {err}") from None
        self._output = RankOutput(nonce)
        self.log.info("function %s: %.1f KiB (the runner, its source and arguments) go to every host",
                      self.python_callable.__name__, len(self._payload) / 1024)

    def _launch_spec(self, job_id: str):
        from airflow_hetero_gpu.launch.command import PAYLOAD_SCRIPT

        return self.specs.program.launch_spec(job_id, script=PAYLOAD_SCRIPT, payload=self._payload)

    # --- what comes back ----------------------------------------------------------------------
    def _on_line(self, host: str, rank: int, stream: str, line: str) -> None:
        output = self._output
        if output is None:
            super()._on_line(host, rank, stream, line)
            return
        rest, error = output.take(host, line)
        if rest is not None:
            super()._on_line(host, rank, stream, rest)
        if error is not None:
            self.log.warning("[%s rank %d] function %s failed on %s: %s", host, rank,
                             self.python_callable.__name__, error.place(), error.error)

    def _set_job(self, job) -> None:
        super()._set_job(job)
        if self._output is not None:  # a launch (or a restart on a new GPU set) begins
            self._output.new_run()

    def _place_and_run(self, context: Context, waiting_since: float | None = None, admitted: bool = False,
                       resume: bool = False) -> Any:
        self._prepare(context)
        try:
            facts = super()._place_and_run(context, waiting_since, admitted, resume)
        except AirflowException:
            assert self._output is not None
            message = self._output.failure_message(self.python_callable.__name__, self._job_id(context))
            if message is None:
                raise
            raise AirflowException(message) from None  # one line: the ranks' tracebacks are in the log
        try:
            value = self._output.result()
        except ResultMissing as err:
            raise AirflowException(f"job {facts['job_id']}: {err}") from None
        context["ti"].xcom_push(key="run", value=facts)
        return value

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        return self._handle_output(super().execute_complete(context, event))


def hetero_train_task(python_callable: Callable | None = None, multiple_outputs: bool | None = None,
                      **kwargs: Any) -> TaskDecorator:
    """``@task.hetero_train(...)``: wrap a function into a :class:`HeteroTrainDecoratedOperator`;
    the keyword arguments are the operator's."""
    return task_decorator_factory(python_callable=python_callable, multiple_outputs=multiple_outputs,
                                  decorated_operator_class=HeteroTrainDecoratedOperator, **kwargs)


__all__ = ["HeteroTrainDecoratedOperator", "hetero_train_task"]
