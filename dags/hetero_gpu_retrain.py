"""Scheduled retraining: wait for a healthy pool, train on it, evaluate the run.

gate (GpuHealthSensor, gate mode) -> train (HeteroTrainOperator) -> evaluate (reads the run's XCom)
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, task

from _common import CHECKPOINT_ROOT, TRAIN_SCRIPT
from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator
from airflow_hetero_gpu.sensors.gpu_health import GpuHealthSensor


@dag(
    dag_id="hetero_gpu_retrain",
    schedule="@weekly",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["hetero-gpu", "training"],
    params={
        "gpu_count": Param(4, type="integer", minimum=1, maximum=64, description="GPUs for the job"),
        "epochs": Param(8, type="integer", minimum=1, maximum=10000),
    },
    doc_md=__doc__,
)
def hetero_gpu_retrain():
    gate = GpuHealthSensor(
        task_id="wait_for_healthy_pool",
        mode_kind="gate",
        min_healthy="{{ params.gpu_count }}",
        poke_interval=60,
        timeout=6 * 3600,
        mode="reschedule",
    )
    train = HeteroTrainOperator(
        task_id="train",
        gpu_count="{{ params.gpu_count }}",
        script=TRAIN_SCRIPT,
        script_args=["--epochs", "{{ params.epochs }}", "--sleep", "0.1"],
        checkpoint_dir=CHECKPOINT_ROOT + "/{{ dag.dag_id }}/{{ run_id | replace(':', '_') | replace('+', '_') }}",
        env={"OMP_NUM_THREADS": "1"},
        wait_for_capacity=True,
        capacity_timeout=4 * 3600,
        deferrable=True,
        on_no_replacement="wait",
    )

    @task
    def evaluate(run: dict) -> dict:
        """Summarise where the job ran and how: what a model-evaluation step would start from."""
        score = run["score"]
        summary = {
            "job_id": run["job_id"],
            "pool": run["pool"],
            "hosts": run["hosts"],
            "gpus": len(run["run"]["gpus"]),
            "evaluation": score["total"],
            "duration_s": run["run"]["duration_s"],
            "restarts": run["run"]["restarts"],
        }
        print(f"evaluation: job {summary['job_id']} trained on {summary['gpus']} GPU(s) of pool "
              f"{summary['pool']!r} on {', '.join(summary['hosts'])} in {summary['duration_s']:.1f} s "
              f"(E = {summary['evaluation']:.4f}, restarts {summary['restarts']})")
        return summary

    gate >> train
    evaluate(train.output)


hetero_gpu_retrain()
