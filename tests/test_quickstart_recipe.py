"""docs/quickstart.md's recipe for a DAG author's own DAG against the emulated cluster, run exactly
as the page prints it (in a home directory of its own, with this environment's `python` and
`airflow` first on PATH, as in an activated .venv)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_hetero_gpu.testing import sshd_available

QUICKSTART = Path(__file__).resolve().parents[1] / "docs" / "quickstart.md"
MARKER = "<!-- recipe: own DAG on the emulated cluster"

pytest.importorskip("torch", reason="torch (CPU build) is needed to run the function under torchrun")


def recipe() -> str:
    text = QUICKSTART.read_text()
    after = text.split(MARKER, 1)[1]
    return after.split("```bash\n", 1)[1].split("\n```\n", 1)[0] + "\n"


def test_the_recipe_block_is_where_the_page_says():
    block = recipe()
    assert block.startswith("python -m airflow_hetero_gpu.testing start --root ~/hetero-gpu-emulated")
    assert "airflow dags test my_first_training" in block and block.rstrip().endswith("# stops every emulated host")


@pytest.mark.skipif(not sshd_available(), reason="OpenSSH's sshd is needed for the emulated hosts")
def test_the_quickstart_recipe_runs_a_first_dag_on_the_emulated_cluster(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(HOME=str(home), PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    r = subprocess.run(["bash", "-c", recipe()], cwd=home, env=env, capture_output=True, text=True, timeout=900)
    log = r.stdout + r.stderr
    emulated = (home / "hetero-gpu-emulated.log").read_text() if (home / "hetero-gpu-emulated.log").exists() else ""
    assert r.returncode == 0, (log[-6000:], emulated[-3000:])
    assert re.search(r"DagRun Finished: .*state=success", log), log[-6000:]
    assert f"ledger: sqlite:///{home}/hetero-gpu-emulated/ledger.db" in log
    # The two ranks share one host's output, so one relayed line may hold both ranks' prints
    # ("[dgx-a2 rank 0] rank 1 of 2: loss 0.79rank 0 of 2: loss 0.81"): each is looked for alone.
    ranks = re.findall(r"rank (\d) of 2: loss \d", log)
    hosts = re.findall(r"\[(dgx-a[12]) rank \d\] rank \d of 2: loss \d", log)
    assert set(ranks) == {"0", "1"} and len(set(hosts)) == 1, log[-6000:]
    assert "finetune+llm-pretrain@NVIDIA A100-SXM4-80GB" in log     # the demo fleet's task-type pools
    # the recipe wrote what it said, and stopped the hosts at the end
    env_file = (home / "hetero-gpu-emulated" / "airflow.env").read_text()
    assert "export AIRFLOW__HETERO_GPU__SSH_CONN_IDS=dgx-a1=gpu_dgx_a1," in env_file
    assert env_file.count("export AIRFLOW_CONN_GPU_") == 5 and '"host_key": "ssh-ed25519 ' in env_file
    assert (home / "hetero-gpu-emulated" / "cluster.yaml").is_file()
    assert "stopped" in emulated
