"""The example DAGs import cleanly (no connection, no network, no setting at parse time), their
forms validate what a user types, and the demo runs the retraining DAG end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[1] / "dags"
EXPECTED = {"hetero_gpu_retrain", "hetero_gpu_train_ui", "hetero_gpu_health_watch"}


def test_dags_parse_with_nothing_configured(tmp_path):
    """Parse in a fresh process with no [hetero_gpu] settings, no connections, no network."""
    code = (
        "import json, sys\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(DAGS)!r})\n"
        "print(json.dumps({'errors': {k: str(v)[-300:] for k, v in bag.import_errors.items()},"
        " 'dags': sorted(bag.dag_ids)}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__HETERO_GPU", "AIRFLOW_CONN_"))}
    env.update(AIRFLOW_HOME=str(tmp_path), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               PYTHONPATH=os.pathsep.join([str(DAGS), env.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["errors"] == {}
    assert EXPECTED <= set(out["dags"])


@pytest.mark.parametrize(
    "params, ok",
    [
        ({"gpu_type": "RTX 4090", "gpu_count": 2, "task_type": "", "epochs": 3}, True),
        ({"gpu_type": "RTX 5090", "gpu_count": 2, "task_type": "", "epochs": 3}, False),  # not in the list
        ({"gpu_type": "any", "gpu_count": 0, "task_type": "", "epochs": 3}, False),  # below the minimum
        ({"gpu_type": "any", "gpu_count": "two", "task_type": "", "epochs": 3}, False),  # not an integer
    ],
)
def test_ui_form_validates_params(params, ok):
    sys.path.insert(0, str(DAGS))
    try:
        import copy

        import hetero_gpu_train_ui  # noqa: F401
        dag = hetero_gpu_train_ui.hetero_gpu_train_ui()
    finally:
        sys.path.remove(str(DAGS))
    merged = copy.deepcopy(dag.params)  # the Params with their JSON schema
    if ok:
        merged.update(params)
        assert merged.validate()["gpu_type"] == params["gpu_type"]
    else:
        with pytest.raises(Exception):
            merged.update(params)
            merged.validate()


def test_demo_runs_the_retraining_dag_end_to_end(tmp_path):
    """The demo's whole run. Its DAG-run log stays in the one directory it names first, which keeps
    nothing else; the fixed name it once copied the log to (which another user's run may own) is
    made unwritable here, a directory, and the run does not use it."""
    pytest.importorskip("torch", reason="the demo trains with torch (CPU build)")
    import shutil

    if shutil.which("sshd") is None and not Path("/usr/sbin/sshd").exists():
        pytest.skip("OpenSSH server (sshd) is not installed")
    (tmp_path / "hetero-gpu-demo-dag-run.log").mkdir()
    r = subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.demo", "--dags-folder", str(DAGS), "--epochs", "4"],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "TMPDIR": str(tmp_path)})
    out = r.stdout
    assert r.returncode == 0, (out + r.stderr)[-6000:]
    # the H200 box (7 healthy GPUs) rather than the idle DGX-1 V100: the free-blocks term keeps
    # the one host an 8-GPU job could still get whole (docs/quickstart.md)
    assert "decision: pool 'finetune+llm-pretrain@NVIDIA H200' -> hgx-h200 GPU 0,1,2,3" in out
    for pool in ("finetune+llm-pretrain@NVIDIA A100-SXM4-80GB", "cv+finetune@NVIDIA GeForce RTX 4090",
                 "finetune+llm-pretrain@NVIDIA H200"):
        assert pool in out  # every pool's stage, reason and score terms are shown
    # the health check evicted GPU5 for its Xid 48 (an event, acted on once); its ECC count keeps it
    # unhealthy in the inventory the plan reads from the ledger
    assert "unhealthy: hgx-h200 GPU5 (ecc)" in out
    losses = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines() if "] epoch " in line and " loss " in line]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert "DAG run finished: success" in out
    # one directory, named first, keeps the log and nothing else
    (named,) = [line.split(": ", 1)[1].split(" (", 1)[0] for line in out.splitlines()
                if line.startswith("demo directory: ")]
    (kept,) = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("DAG run log: ")]
    assert Path(kept) == Path(named) / "dag-run.log" and Path(named).parent == tmp_path
    assert "DagRun Finished" in Path(kept).read_text()
    assert [p.name for p in Path(named).iterdir()] == ["dag-run.log"]
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("hetero-gpu-demo") and p.is_dir())
    assert left == sorted(["hetero-gpu-demo-dag-run.log", Path(named).name])  # the old name stays unused
