"""Airflow's multi-team mode end to end (docs/teams.md#with-airflows-multi-team-mode): a real
Airflow 3.3 with ``[core] multi_team = True``, teams made by ``airflow teams create`` and one DAG
bundle per team, each with its own DAG folder (``team_name`` in ``dag_bundle_config_list``);
``airflow dags test`` runs the operator on the emulated cluster (real sshd, one host of 4 GPUs).

* a DAG in team_a's bundle that names no team reserves under team_a (the ledger's row says so);
  the same DAG with ``team="team_b"`` fails at once naming both teams: nothing collected, queued
  or reserved;
* the fleet team ``research`` serving the Airflow teams ``research_cv`` and ``research_nlp``:
  both bundles' tasks draw on its one quota, and ``hetero-gpu teams`` shows the mapping;
* ``hetero-gpu teams apply`` refuses an Airflow team that Airflow's database does not have, and
  warns (applying the file) when that database cannot be read.

Every wait is on a ledger row or a log line."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing.airflow_env import airflow_command, connection_env
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from ledger_files import new_ledger
from multi_team_fixtures import TEAMS, multi_team_home
from otlp_metrics import otlp  # noqa: F401
from test_queue_e2e import WAIT_S, _until


def _cli(env: dict[str, str] | None, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_hetero_gpu.cli", *argv], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.fixture
def fleet(emulated_cluster, tmp_path):  # noqa: F811
    """(cluster, ledger URL) with one host of 4 GPUs collected and the teams applied."""
    cluster = emulated_cluster(small_hosts(1, gpus=4))
    url = new_ledger(tmp_path / "ledger.db")
    r = _cli(None, "collect", "--hosts", cluster.hosts_arg(), "--identity-file", str(cluster.identity_file),
             "--known-hosts", str(cluster.known_hosts_path), "--ledger", url)
    assert r.returncode == 0, r.stderr
    return cluster, url


def _apply(env, tmp_path: Path, url: str, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "teams.yaml"
    path.write_text(text)
    return _cli(env, "teams", "apply", str(path), "--ledger", url)


class Run:
    """``airflow dags test hg_<bundle>`` in the background, its output lines kept."""

    def __init__(self, env: dict[str, str], cluster, tmp_path: Path, url: str, bundle: str, **config):
        conns, ids = connection_env(cluster)
        cfg = {"ssh_conn_ids": ids, "ledger_url": url, "workdir": str(tmp_path), **config}
        self.lines: list[str] = []
        self.proc = subprocess.Popen([*airflow_command(), "dags", "test", f"hg_{bundle}"],
                                     env={**env, **conns, "HG_TEST_CONFIG": json.dumps(cfg)},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.pump = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.pump.start()

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def finish(self, timeout: float = WAIT_S) -> int:
        try:
            self.proc.wait(timeout=timeout)
            self.pump.join(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return self.proc.returncode


def _blocking(tmp_path: Path, name: str) -> tuple[list[str], Path]:
    """A command that says it started and runs until the test creates its go file."""
    go = tmp_path / f"go-{name}"
    return ["sh", "-c", f"echo {name}-started; while [ ! -e {go} ]; do sleep 0.2; done; echo {name}-done"], go


def test_a_dag_runs_on_its_bundles_team_and_may_not_name_another(fleet, tmp_path):
    cluster, url = fleet
    env = multi_team_home(tmp_path / "airflow")
    r = _apply(env, tmp_path, url, TEAMS)
    assert r.returncode == 0 and "teams applied: research, team_a, team_b" in r.stdout, r.stderr

    # team="team_b" in team_a's bundle: one line naming both, before anything is collected or reserved
    wrong = Run(env, cluster, tmp_path, url, "a_dags", command=["sh", "-c", "echo should-not-run"], job_id="a-wrong",
                team="team_b", wait_for_capacity=True)
    assert wrong.finish() != 0, wrong.log[-4000:]
    assert ("team: this DAG's bundle belongs to team 'team_a', and team='team_b' names another team; in Airflow's "
            "multi-team mode a task draws on its bundle's team: leave team out") in wrong.log, wrong.log[-4000:]
    assert "should-not-run" not in wrong.log and "placement for job" not in wrong.log
    with Ledger.open_existing(url) as led:
        assert led.queue() == [] and led.live_reservations() == [] and led.job_hosts("a-wrong") == []

    # no team: the bundle's, and the ledger's reservation says so
    command, go = _blocking(tmp_path, "a")
    run = Run(env, cluster, tmp_path, url, "a_dags", command=command, job_id="a-right", gpu_count=2)
    try:
        res = _until("team_a's reservation", lambda: _reservation(url, "a-right"))
        assert res.team == "team_a" and len(res.gpus) == 2
        go.touch()
        assert run.finish() == 0, run.log[-4000:]
    finally:
        go.touch()
        run.finish()
    assert "a-done" in run.log and "is not in the teams file" not in run.log


def _reservation(url: str, job_id: str):
    with Ledger.open_existing(url) as led:
        return led.get(job_id)


def test_two_airflow_teams_draw_on_one_fleet_teams_quota(fleet, tmp_path, tmp_path_factory, otlp):  # noqa: F811
    """research (quota 2) serves research_cv and research_nlp; team_a lends nothing. research_cv's
    2-GPU job fills research's quota; research_nlp's 1-GPU job then waits, blocked by research's
    quota although 2 GPUs are free, and runs once research_cv's job ends. Both tasks' metrics, sent by
    Airflow's OpenTelemetry exporter to a collector on loopback, carry their Airflow team as
    ``team_name`` (as Airflow's own do) and ``research`` as ``fleet_team``."""
    cluster, url = fleet
    env = multi_team_home(tmp_path / "airflow")
    r = _apply(env, tmp_path, url, TEAMS)
    assert r.returncode == 0, r.stderr
    r = _cli(env, "teams", "--ledger", url)
    assert r.returncode == 0, r.stderr
    mapping = r.stdout.split("\n\n", 1)[1].splitlines()
    assert mapping[0].split() == ["TEAM", "AIRFLOW", "TEAMS"]
    assert [line.split(None, 1) for line in mapping[2:]] == [
        ["research", "research_cv, research_nlp"], ["team_a", "team_a"], ["team_b", "team_b"]]

    env_nlp = multi_team_home(tmp_path_factory.mktemp("airflow-nlp"))  # a second Airflow database: runs side by side
    cv_command, cv_go = _blocking(tmp_path, "cv")
    nlp_command, nlp_go = _blocking(tmp_path, "nlp")
    nlp_go.touch()  # research_nlp's job ends as soon as it starts
    # both durable, their metrics sent by Airflow's OpenTelemetry exporter to a collector on loopback
    durable = {"durable": True, "unattended_timeout": 30, "preemption_grace": 5, "lease_seconds": 80}
    cv = Run({**env, **otlp.airflow_env}, cluster, tmp_path, url, "cv_dags", command=cv_command, job_id="cv-job",
             gpu_count=2, **durable)
    nlp = None
    try:
        try:
            res = _until("research_cv's reservation", lambda: _reservation(url, "cv-job") or cv.proc.poll() is not None)
        except AssertionError as err:
            raise AssertionError(f"{err}:\n{cv.log[-6000:]}") from None
        assert res is not True, f"research_cv's DAG run ended before it reserved:\n{cv.log[-6000:]}"
        assert res.team == "research"
        nlp = Run({**env_nlp, **otlp.airflow_env}, cluster, tmp_path, url, "nlp_dags", command=nlp_command,
                  job_id="nlp-job", gpu_count=1, wait_for_capacity=True, **durable)
        entry = _until("research_nlp's queue entry", lambda: _waiting(url, "nlp-job"))
        assert entry.team == "research"
        assert "team research: 2/2 of its quota in use" in entry.reason, entry.reason
        with Ledger.open_existing(url) as led:
            assert len(led.reserved_map()) == 2  # 2 of the 4 GPUs free: the quota stops it, not the fleet
        cv_go.touch()
        assert cv.finish() == 0, cv.log[-4000:]
        assert nlp.finish() == 0, nlp.log[-4000:]
    finally:
        cv_go.touch()
        cv.finish()
        if nlp is not None:
            nlp.finish()
    # the provider's metrics carry the Airflow team as Airflow's own do, and the fleet team beside it
    fresh = otlp.named("airflow.resumable_job.fresh_submit")
    assert {"operator": "HeteroTrainOperator", "team_name": "research_cv", "fleet_team": "research"} in fresh, fresh
    assert {"operator": "HeteroTrainOperator", "team_name": "research_nlp", "fleet_team": "research"} in fresh, fresh
    assert any(p.get("team_name") == "research_cv" for p in otlp.named("airflow.ti.finish"))  # Airflow's own
    assert "Airflow team research_cv draws on the quota of team research" in cv.log
    assert "Airflow team research_nlp draws on the quota of team research" in nlp.log
    assert "job nlp-job: admitted from the queue" in nlp.log and "nlp-done" in nlp.log
    with Ledger.open_existing(url) as led:
        assert led.queue() == [] and led.live_reservations() == []
        teams = {s["team"] for s in led.team_samples()}
    assert "research" in teams and not teams & {"research_cv", "research_nlp"}


def _waiting(url: str, job_id: str):
    with Ledger.open_existing(url) as led:
        entry = led.queue_entry(job_id)
    return entry if entry is not None and entry.state == "waiting" and entry.reason else None


def test_apply_refuses_an_airflow_team_airflow_does_not_have(fleet, tmp_path):
    _, url = fleet
    env = multi_team_home(tmp_path / "airflow")
    r = _apply(env, tmp_path, url, TEAMS.replace("research_nlp]", "research_nlp, research_rl]"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"hetero-gpu teams: error: {tmp_path / 'teams.yaml'}: team research: airflow_teams: Airflow team "
        f"'research_rl' does not exist (Airflow's teams: research_cv, research_nlp, team_a, team_b; "
        f"`airflow teams create research_rl`)")
    with Ledger.open_existing(url) as led:
        assert led.teams() is None  # nothing applied
    # Airflow's database out of reach: applied, with a warning that the names were not checked
    away = {**env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'missing' / 'airflow.db'}"}
    r = _apply(away, tmp_path, url, TEAMS.replace("research_nlp]", "research_nlp, research_rl]"))
    assert r.returncode == 0, r.stderr
    assert "hetero-gpu teams: warning: " in r.stderr and "the Airflow teams of airflow_teams were not checked" \
        in r.stderr, r.stderr
    with Ledger.open_existing(url) as led:
        assert led.teams().mapping()["research"] == ["research_cv", "research_nlp", "research_rl"]
