"""Teams end to end: `airflow dags test` runs of the operator on the emulated cluster (real sshd,
one host of 8 GPUs) with quotas applied by `hetero-gpu teams apply` (docs/teams.md).

intern (quota 4) holds all 8 GPUs, 4 of them borrowed from prod's idle quota. intern's 2-GPU
task enqueues first and waits, blocked by quota; prod's 2-GPU task (its team templated) enqueues
after it, is within its quota, heads the queue and claims 2 GPUs. As intern's jobs end, prod's
task is admitted first; intern's only once intern is back within what it may borrow.
`hetero-gpu teams`, `hetero-gpu queue` and the cluster page show it. Every wait is on a log line or a ledger row."""

from __future__ import annotations

import json
import re
import threading
import time

from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing.airflow_env import airflow_env, migrate
from airflow_hetero_gpu.testing.demo import small_hosts
from cluster_fixtures import emulated_cluster  # noqa: F401
from dag_run_helpers import DAGS, airflow_home, finish, start_dag  # noqa: F401
from test_queue_e2e import WAIT_S, _cli, _until

def _page(url: str) -> str:
    from airflow_hetero_gpu.plugins import model, render, sources

    inputs = sources.read_inputs(None, sources.PageSettings(ledger_url=url))
    return render.render_page(model.build(inputs.cluster, inputs.reservations, inputs.evictions, queue=inputs.queue,
                                          now=inputs.now, teams=inputs.teams, team_samples=inputs.team_samples))


TEAMS = """\
teams:
  prod:   {quota: {"*": 4}}
  intern: {quota: {"*": 4}}
"""


def test_the_team_within_its_quota_is_admitted_first(airflow_home, emulated_cluster, tmp_path,  # noqa: F811
                                                      tmp_path_factory):
    cluster = emulated_cluster(small_hosts(1, gpus=8))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    r = _cli("collect", "--hosts", cluster.hosts_arg(), "--identity-file", str(cluster.identity_file),
             "--known-hosts", str(cluster.known_hosts_path), "--ledger", url)
    assert r.returncode == 0, r.stderr
    teams_file = tmp_path / "teams.yaml"
    teams_file.write_text(TEAMS)
    r = _cli("teams", "apply", str(teams_file), "--ledger", url)
    assert r.returncode == 0 and "teams applied: intern, prod" in r.stdout, r.stderr
    with Ledger.from_url(url) as led:  # intern holds all 8 GPUs: 4 of them borrowed from prod
        for i in range(8):
            assert led.enqueue(f"hold-{i}", PlanRequest(1), lease_seconds=3600, team="intern").admitted
            led.take_admission(f"hold-{i}")

    marks: dict[str, float] = {}
    events = {name: threading.Event() for name in ("intern_blocked", "prod_head")}

    def on_intern(line: str) -> None:
        if "job intern-2: " in line and "blocked by quota: team intern: 4/4 of its quota in use, 4 borrowed" in line:
            events["intern_blocked"].set()
        if "job intern-2: admitted from the queue" in line:
            marks.setdefault("intern_admitted", time.monotonic())

    def on_prod(line: str) -> None:
        if "job prod-2: head of the queue: claims node01 GPU" in line and "team prod: within its quota" in line:
            events["prod_head"].set()
        if "job prod-2: admitted from the queue" in line:
            marks.setdefault("prod_admitted", time.monotonic())

    common = dict(gpu_count=2, ledger_url=url, wait_for_capacity=True, deferrable=False, capacity_poll_interval=1,
                  capacity_timeout=900)
    intern, pump_intern, lines_intern, _, _ = start_dag(
        airflow_home, cluster, tmp_path, "intern", on_intern, command=["sh", "-c", "echo intern-done"],
        job_id="intern-2", team="intern", **common)
    prod = pump_prod = None
    try:
        assert events["intern_blocked"].wait(WAIT_S), "".join(lines_intern)[-4000:]
        home_b = tmp_path_factory.mktemp("airflow-prod")
        migrate(airflow_env(home_b, DAGS))
        prod, pump_prod, lines_prod, _, _ = start_dag(
            home_b, cluster, tmp_path, "prod", on_prod, command=["sh", "-c", "echo prod-done"], job_id="prod-2",
            team="{{ 'pr' ~ 'od' }}", **common)  # templated
        assert events["prod_head"].wait(WAIT_S), "".join(lines_prod)[-4000:]

        r = _cli("teams", "--ledger", url, "--json")
        assert r.returncode == 0, r.stderr
        rows = {row["team"]: row for row in json.loads(r.stdout)["rows"]}
        assert (rows["intern"]["in_use"], rows["intern"]["borrowed"], rows["intern"]["waiting"]) == (8, 4, 2)
        assert (rows["prod"]["in_use"], rows["prod"]["lent"], rows["prod"]["waiting"]) == (0, 4, 2)
        r = _cli("queue", "--ledger", url)
        line = next(x for x in r.stdout.splitlines() if " prod-2 " in x)
        assert line.split()[:4] == ["1", "prod-2", "prod", "head"], r.stdout
        html = _page(url)  # the cluster page's Teams section: prod lends 4 and waits for 2
        assert re.search(r"<td>prod</td><td class=\"hg-wrap\">\*</td><td class=\"hg-n\">4</td><td class=\"hg-n\">0</td>\s*"
                         r"<td class=\"hg-n\">0</td><td class=\"hg-n\">4</td><td class=\"hg-n\">2</td>", html), html

        with Ledger.from_url(url) as led:
            claimed = set(led.queue_entry("prod-2").claimed_gpus)
            holders = {job for k, job in led.reserved_map().items() if k in claimed}
            for job in sorted(holders):  # the jobs on prod's claim end: prod is admitted at once
                assert led.release(job)
            assert led.queue_entry("prod-2").admitted or led.get("prod-2") is not None
            # intern is still above what it may borrow (prod's quota is back in use)
            assert led.queue_entry("intern-2").state == "waiting"
        _until("prod's task to be admitted", lambda: "prod_admitted" in marks)
        assert "intern_admitted" not in marks
        with Ledger.from_url(url) as led:
            for job in sorted(set(led.reserved_map().values())):
                if job.startswith("hold-"):
                    led.release(job)
        finish(prod, pump_prod)
        finish(intern, pump_intern)
    finally:
        for proc in (intern, prod):
            if proc is not None and proc.poll() is None:
                proc.kill()
    log_intern, log_prod = "".join(lines_intern), "".join(lines_prod)
    assert intern.returncode == 0, log_intern[-4000:]
    assert prod.returncode == 0, log_prod[-4000:]
    assert "intern-done" in log_intern and "prod-done" in log_prod
    assert marks["prod_admitted"] < marks["intern_admitted"]
    with Ledger.open_existing(url) as led:
        assert led.queue() == [] and led.live_reservations() == []
        samples = led.team_samples()
    assert {s["team"] for s in samples} >= {"intern", "prod"}
    assert any(s["team"] == "prod" and s["in_use"] == 2 for s in samples)
