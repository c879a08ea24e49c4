"""An Airflow in multi-team mode for the tests (docs/teams.md#with-airflows-multi-team-mode): one
DAG bundle per team, each with its own DAG folder holding one DAG ``hg_<bundle>`` (a training
task whose arguments come from ``HG_TEST_CONFIG_<BUNDLE>``, else ``HG_TEST_CONFIG``), and the
teams made by ``airflow teams create``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from airflow_hetero_gpu.testing.airflow_env import airflow_command, airflow_env, migrate

BUNDLES = {"a_dags": "team_a", "b_dags": "team_b", "cv_dags": "research_cv", "nlp_dags": "research_nlp",
           "shared_dags": None}

TEAMS = """\
teams:
  team_a:   {quota: {"*": 2}, lending_limit: {"*": 0}}
  team_b:   {quota: {"*": 0}}
  research: {quota: {"*": 2}, airflow_teams: [research_cv, research_nlp]}
"""

DAG = '''\
"""A DAG of the bundle {bundle}: one training task, its arguments from HG_TEST_CONFIG_{upper}
(else HG_TEST_CONFIG)."""
import json
import os

import pendulum
from airflow.sdk import dag

from airflow_hetero_gpu.operators.hetero_train import HeteroTrainOperator


@dag(dag_id="hg_{bundle}", schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False)
def build():
    cfg = json.loads(os.environ.get("HG_TEST_CONFIG_{upper}") or os.environ.get("HG_TEST_CONFIG", "{{}}"))
    HeteroTrainOperator(task_id="train", gpu_count=cfg.get("gpu_count", 1), command=cfg.get("command"),
                        ssh_conn_ids=cfg.get("ssh_conn_ids", []), ledger_url=cfg.get("ledger_url"),
                        workdir=cfg.get("workdir"), job_id=cfg.get("job_id"),
                        lease_seconds=cfg.get("lease_seconds", 30),
                        durable=cfg.get("durable", False), unattended_timeout=cfg.get("unattended_timeout", 900),
                        preemption_grace=cfg.get("preemption_grace", 300),
                        wait_for_capacity=cfg.get("wait_for_capacity", False),
                        deferrable=cfg.get("deferrable", False), capacity_poll_interval=1, capacity_timeout=600,
                        retries=0, **({{"team": cfg["team"]}} if "team" in cfg else {{}}))


build()
'''


def bundle_settings(root: Path) -> dict[str, str]:
    """The DAG folders under ``root`` and the Airflow settings of multi-team mode naming them."""
    bundles = []
    for bundle, team in BUNDLES.items():
        folder = root / bundle
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"hg_{bundle}.py").write_text(DAG.format(bundle=bundle, upper=bundle.upper()))
        bundles.append({"name": bundle, "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                        "kwargs": {"path": str(folder)}, **({"team_name": team} if team else {})})
    return {"AIRFLOW__CORE__MULTI_TEAM": "True", "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles)}


def create_teams(env: dict[str, str]) -> None:
    """``airflow teams create`` for every team of :data:`BUNDLES` (the database migrated)."""
    for team in sorted(t for t in BUNDLES.values() if t):
        r = subprocess.run([*airflow_command(), "teams", "create", team], env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]


def multi_team_home(root: Path) -> dict[str, str]:
    """An AIRFLOW_HOME in multi-team mode (SQLite), migrated, the teams created; its environment."""
    env = airflow_env(root / "home", root / "shared_dags", bundle_settings(root))
    migrate(env)
    create_teams(env)
    return env
