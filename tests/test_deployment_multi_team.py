"""Team-scoped triggerers (docs/teams.md#triggerers-per-team): a real Airflow 3.3 deployment in
multi-team mode (api-server, scheduler, dag-processor as separate processes; two bundles of their
own, team_a's and team_b's) with a global triggerer and one started with ``--team-name team_a``.

Each team has a quota of 2 of the host's 4 GPUs and lends nothing; a job of each team's (started
outside Airflow) holds its team's quota, so both DAGs' tasks defer in the ledger's queue. Airflow
gives each trigger its DAG's team: team_a's triggerer runs team_a's queue trigger, and neither it
nor the global triggerer takes team_b's (in multi-team mode a triggerer without ``--team-name``
runs only the triggers of DAGs without a team). Once team_a's holder ends, team_a's task resumes
and succeeds; team_b's still waits behind team_b's quota (2 GPUs free: its quota, not the fleet,
stops it), unwatched. A triggerer started with ``--team-name team_b`` then runs its trigger, and
once team_b's holder ends team_b's task succeeds too."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing.airflow_env import AirflowDeployment, connection_env, migrate
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from ledger_files import new_ledger
from multi_team_fixtures import bundle_settings, create_teams

WAIT_S = 300


@pytest.fixture
def fleet(emulated_cluster):  # noqa: F811
    return emulated_cluster(small_hosts(1, gpus=4))


def _triggers(airflow) -> dict[str, str | None]:
    """team name -> the triggerer running its trigger (None: no triggerer took it)."""
    return {team: owner for team, owner in airflow.query("select team_name, triggerer_id from trigger")}


TEAMS = """\
teams:
  team_a: {quota: {"*": 2}, lending_limit: {"*": 0}}
  team_b: {quota: {"*": 2}, lending_limit: {"*": 0}}
"""


def test_a_team_scoped_triggerer_runs_its_teams_queue_waits_only(fleet, tmp_path):
    url = new_ledger(tmp_path / "ledger.db")
    r = subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", "collect", "--hosts", fleet.hosts_arg(),
                        "--identity-file", str(fleet.identity_file), "--known-hosts", str(fleet.known_hosts_path),
                        "--ledger", url], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (tmp_path / "teams.yaml").write_text(TEAMS)
    r = subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", "teams", "apply", str(tmp_path / "teams.yaml"),
                        "--ledger", url], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with Ledger.from_url(url) as led:  # each team's quota held by a job of its own
        for team in ("team_a", "team_b"):
            assert led.enqueue(f"holder-{team}", PlanRequest(2), team=team, lease_seconds=3600).admitted
            led.take_admission(f"holder-{team}")
    conns, ids = connection_env(fleet)
    base = {"ssh_conn_ids": ids, "ledger_url": url, "workdir": str(tmp_path), "gpu_count": 2,
            "wait_for_capacity": True, "deferrable": True}
    configs = {f"HG_TEST_CONFIG_{bundle.upper()}": json.dumps({**base, "job_id": f"{team}-job",
                                                               "command": ["sh", "-c", f"echo {team}-done"]})
               for bundle, team in (("a_dags", "team_a"), ("b_dags", "team_b"))}
    airflow = AirflowDeployment(tmp_path / "airflow", tmp_path / "dags" / "shared_dags",
                                {**conns, **configs, **bundle_settings(tmp_path / "dags")})
    airflow.add_component("triggerer-a", ["triggerer", "--team-name", "team_a"])
    migrate(airflow.env)
    create_teams(airflow.env)
    with airflow:
        run_a = airflow.trigger("hg_a_dags")
        airflow.wait_for_state("hg_a_dags", run_a, "train", {"deferred"}, timeout=WAIT_S)
        run_b = airflow.trigger("hg_b_dags")  # after team_a's: team_a's job heads the queue
        airflow.wait_for_state("hg_b_dags", run_b, "train", {"deferred"}, timeout=WAIT_S)
        with Ledger.open_existing(url) as led:
            assert [(e.job_id, e.team) for e in led.queue()] == [("team_a-job", "team_a"), ("team_b-job", "team_b")]
        airflow.wait_for(lambda: _triggers(airflow).get("team_a"), WAIT_S, "team_a's trigger taken by a triggerer")
        assert _triggers(airflow)["team_b"] is None

        with Ledger.from_url(url) as led:
            assert led.release("holder-team_a")
        state = airflow.wait_for_state("hg_a_dags", run_a, None, {"success", "failed"}, timeout=WAIT_S)
        log_a = airflow.task_log("hg_a_dags", run_a, "train")
        assert state == "success", airflow.failure_context("hg_a_dags", run_a, "train", "scheduler", "triggerer-a")
        assert "deferring until one can" in log_a and "team_a-done" in log_a
        # team_a's trigger ran, fired and its task finished on team_a's triggerer; neither that
        # triggerer nor the global one took team_b's
        assert _triggers(airflow) == {"team_b": None}
        assert airflow.task_state("hg_b_dags", run_b, "train") == "deferred"
        with Ledger.open_existing(url) as led:  # 2 GPUs free, and team_b's job waits on its team's quota
            [entry] = led.queue()
            assert (entry.job_id, entry.team, entry.admitted) == ("team_b-job", "team_b", False)
            assert "team team_b: 2/2 of its quota in use" in entry.reason, entry.reason
            assert sorted(led.reserved_map().values()) == ["holder-team_b"] * 2

        airflow.add_component("triggerer-b", ["triggerer", "--team-name", "team_b"])
        airflow.start_component("triggerer-b")
        airflow.wait_for(lambda: _triggers(airflow).get("team_b"), WAIT_S, "team_b's trigger taken by triggerer-b")
        with Ledger.from_url(url) as led:
            assert led.release("holder-team_b")
        state = airflow.wait_for_state("hg_b_dags", run_b, None, {"success", "failed"}, timeout=WAIT_S)
        log_b = airflow.task_log("hg_b_dags", run_b, "train")
        assert state == "success", airflow.failure_context("hg_b_dags", run_b, "train", "scheduler", "triggerer-b")
        assert "team_b-done" in log_b
    with Ledger.open_existing(url) as led:
        assert led.queue() == [] and led.live_reservations() == []
