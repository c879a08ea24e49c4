"""Train on demand: trigger from the Airflow UI and fill in the form.

The form is Airflow's own (Params with JSON-schema validation): a card type from a list (or any),
a GPU count, a training-task type from cluster.yaml (or any), and the number of epochs. Every
default can be submitted as it is: "any" (or an emptied field) lets the evaluation choose.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag

from _common import CHECKPOINT_ROOT, TRAIN_SCRIPT
from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator

CARD_TYPES = [
    "any",
    "A100-SXM4-80GB",
    "H200",
    "V100-SXM2-32GB",
    "RTX 4090",
]


@dag(
    dag_id="hetero_gpu_train_ui",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["hetero-gpu", "training"],
    params={
        "gpu_type": Param("any", type="string", enum=CARD_TYPES, title="Card type",
                          description="'any' lets the evaluation choose among every pool"),
        "gpu_count": Param(2, type="integer", minimum=1, maximum=64, title="GPUs"),
        # "any" rather than an empty string: Airflow's form counts an empty string as a missing
        # required value; a cleared field sends null, which also means any
        "task_type": Param("any", type=["string", "null"], title="Training-task type",
                           examples=["any", "finetune", "llm-pretrain", "cv"],
                           description="'any', or a task type of cluster.yaml's task_types"),
        "epochs": Param(5, type="integer", minimum=1, maximum=10000, title="Epochs"),
    },
    doc_md=__doc__,
)
def hetero_gpu_train_ui():
    HeteroTrainOperator(
        task_id="train",
        gpu_count="{{ params.gpu_count }}",
        gpu_type="{{ '' if params.gpu_type == 'any' else params.gpu_type }}",
        task_type="{{ '' if params.task_type in (None, '', 'any') else params.task_type }}",
        script=TRAIN_SCRIPT,
        script_args=["--epochs", "{{ params.epochs }}"],
        checkpoint_dir=CHECKPOINT_ROOT + "/{{ dag.dag_id }}/{{ run_id | replace(':', '_') | replace('+', '_') }}",
        env={"OMP_NUM_THREADS": "1"},
        wait_for_capacity=True,
        capacity_timeout=3600,
        deferrable=True,
    )


hetero_gpu_train_ui()
