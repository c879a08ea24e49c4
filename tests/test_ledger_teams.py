"""Teams in the ledger on real SQLite and PostgreSQL (docs/teams.md): applying a teams file
(atomic, idempotent, bad files change nothing), the quota inside the admission pass of every
enqueue and release, direct reservations, the standing, and the CLI."""

from __future__ import annotations

import json

import pytest

from airflow_hetero_gpu.cli.app import main
from airflow_hetero_gpu.collect.freshness import FreshInventory
from airflow_hetero_gpu.core.admission import TeamsError, teams_from_mapping
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.ledger.errors import QuotaRefused
from ledger_clock import clock  # noqa: F401  (fixture)
from postgres_fixtures import ledger_db_url  # noqa: F401  (fixture)
from test_ledger_queue import fill

TEAMS_YAML = """\
teams:
  research: {quota: {"*": 8}, weight: 2}
  prod:     {quota: {"A100*": 8}, lending_limit: {"A100*": 4}}
  intern:   {quota: {"*": 0}, borrowing_limit: {"*": 4}}
"""


@pytest.fixture
def led(ledger_db_url, clock):  # noqa: F811
    with Ledger.from_url(ledger_db_url, clock=clock) as ledger:
        fill(ledger)  # node01, node02: 8 × A100 each
        yield ledger


def _teams(text=TEAMS_YAML):
    import yaml

    return teams_from_mapping(yaml.safe_load(text), "teams.yaml")


def _take(led, job, request, team, clock):
    entry = led.enqueue(job, request, team=team)
    if entry.admitted:
        led.take_admission(job)
    clock.tick(1)
    return entry


def test_apply_is_idempotent_and_the_pass_keeps_quota_for_the_team_within_it(led, clock):
    assert led.apply_teams(_teams()) is True
    assert led.apply_teams(_teams()) is False  # the same file again changes nothing
    assert sorted(led.teams().teams) == ["intern", "prod", "research"]
    for i in range(8):  # research fills its quota
        assert _take(led, f"r{i}", PlanRequest(1), "research", clock).admitted
    # research may borrow only what prod lends (4 of its idle 8)
    r8 = _take(led, "r8", PlanRequest(4), "research", clock)
    assert r8.admitted and led.get("r8") is not None
    r9 = led.enqueue("r9", PlanRequest(1), team="research")
    assert r9.state == "waiting" and "blocked by quota" in r9.reason
    assert "team research: 8/8 of its quota in use, 4 borrowed, may borrow without limit; borrowable now 0 " \
           "(prod lends 0 of its idle 8 (4 already lent, lending limit 4))" in r9.reason
    # prod comes back: within its quota it goes first and its job waits only for research's borrowers
    clock.tick(1)
    p = led.enqueue("p8", PlanRequest(8), team="prod")
    assert p.state == "waiting" and p.standing == "head" and "within its quota" in p.reason
    standing = led.team_standing()
    rows = {(r["team"], r["pattern"]): r for r in standing["rows"]}
    assert rows[("research", "*")]["in_use"] == 12 and rows[("research", "*")]["borrowed"] == 4
    assert rows[("prod", "A100*")]["lent"] == 4 and rows[("prod", "A100*")]["waiting"] == 8
    assert standing["teams"]["research"]["fair_share"] == pytest.approx(2.0, abs=0.01)  # 4 borrowed / weight 2
    assert led.release("r8")  # the borrowed 4 come back: prod's head takes its quota
    assert led.queue_entry("p8").admitted
    res = led.get("p8")
    assert res is not None and len(res.keys) == 8
    assert led.queue_entry("r9").state == "waiting"  # still no idle lendable quota


def test_a_team_is_never_above_quota_plus_borrowing_limit(led, clock):
    led.apply_teams(_teams())
    got = [_take(led, f"i{i}", PlanRequest(1), "intern", clock).admitted for i in range(6)]
    assert got == [True] * 4 + [False] * 2
    assert "may borrow 0" in led.queue_entry("i5").reason
    # every running job says whether it runs on borrowed quota, and on how many GPUs of it
    assert [(led.get(f"i{i}").team, led.get(f"i{i}").borrowed) for i in range(4)] == [("intern", 1)] * 4
    assert led.get("i0").to_json()["borrowed"] == 1


def test_direct_reservations_count_against_the_quota(led, clock):
    led.apply_teams(_teams())
    cluster = FreshInventory(led.inventory(), float("inf")).cluster()
    assert led.reserve("d1", cluster, PlanRequest(4), team="intern").decision is not None
    assert (led.get("d1").team, led.get("d1").borrowed) == ("intern", 4)
    with pytest.raises(QuotaRefused, match="team intern: 0/0 of its quota in use, 4 borrowed, may borrow 0"):
        led.reserve("d2", cluster, PlanRequest(1), team="intern")
    assert led.get("d2") is None


def test_readers_of_a_missing_ledger_create_nothing(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'none.db'}"
    f = tmp_path / "teams.yaml"
    f.write_text(TEAMS_YAML)
    assert main(["teams", "--ledger", url]) == 2
    assert main(["teams", "apply", str(f), "--ledger", url]) == 2
    assert capsys.readouterr().err.count("\n") == 2 and not (tmp_path / "none.db").exists()


def test_no_teams_configured_changes_nothing(led, clock):
    assert led.team_standing()["rows"] == []
    assert _take(led, "a", PlanRequest(16), None, clock).admitted


BAD = [
    ("teams:\n  prod: {quota: {'A100*': 8}, gpus: 2}\n", "team prod: unknown key 'gpus'"),
    ("teams:\n  prod: {quota: {'A100*': -8}}\n", "team prod: quota: 'A100*': expected a number >= 0, got -8"),
    ("teams:\n  prod: {quota: {'H100*': 8}}\n", "team prod: quota: pattern 'H100*' matches no card of the fleet"),
    ("teams:\n  prod: {quota: {'A100*': 8}, borrowing_limit: {'A100*': -1}}\n",
     "team prod: borrowing_limit: 'A100*': expected a number >= 0, got -1"),
    ("teams: [prod\n", "not valid YAML"),
    # every number bounded where it is read (docs/teams.md#bounds)
    ("teams:\n  prod: {quota: {'*': 100000000000000000000}}\n",
     "team prod: quota: '*': expected at most 1000000 GPUs, got 100000000000000000000"),
    ("teams:\n  prod: {quota: {'*': 8}, lending_limit: {'*': 1000001}}\n",
     "team prod: lending_limit: '*': expected at most 1000000 GPUs"),
    ("teams:\n  prod: {quota: {'*': 8}, weight: 1.0e-320}\n", "team prod: weight: expected a number > 0, from 0.001 to 1000"),
    ("teams:\n  prod: {quota: {'*': 8}, weight: .inf}\n", "team prod: weight: expected a number > 0"),
    ("teams:\n  prod: {quota: {'*': 8}}\nusage_half_life: 1.7e+308\n",
     "usage_half_life: expected a duration from 1 s to 365 days"),
    ("teams:\n  prod: {quota: {'*': 8}}\nusage_half_life: 400d\n", "usage_half_life: expected a duration from 1 s"),
    # the file itself: UTF-8, nesting and size bounded, nothing named twice
    (b"teams:\n  prod\xe9: {quota: {'*': 8}}\n", "not UTF-8 text (line 2, byte 0xe9 at offset 13)"),
    ("teams:\n  prod: " + "[" * 5000 + "]" * 5000 + "\n", "not valid YAML (line 2): nested deeper than 32 levels"),
    ("teams:\n  prod: {quota: {'*': 8}}\n  prod: {quota: {'*': 1}}\n",
     "not valid YAML (line 3): key 'prod' given twice (first on line 2)"),
    ("teams:\n  prod: {quota: {'*': 8}, quota: {'*': 1}}\n", "key 'quota' given twice"),
    ("teams:\n  prod: {quota: {'*': 8}}\nteams: {}\n", "key 'teams' given twice"),
    ("teams:\n  prod: {quota: {'A100*': 8, ' A100*': 2}}\n", "team prod: quota: pattern 'A100*' given twice"),
    ("# " + "x" * (1 << 20) + "\n", "larger than 1048576 bytes"),
]


@pytest.mark.parametrize("text, message", BAD, ids=[m[:40] for _, m in BAD])
def test_a_bad_teams_file_is_one_line_and_changes_nothing(led, tmp_path, capsys, text, message, ledger_db_url):  # noqa: F811
    good = tmp_path / "good.yaml"
    good.write_text(TEAMS_YAML)
    assert main(["teams", "apply", str(good), "--ledger", ledger_db_url]) == 0
    before = led.teams().to_json()
    capsys.readouterr()
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert main(["teams", "apply", str(bad), "--ledger", ledger_db_url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(bad) in err and "Traceback" not in err
    assert led.teams().to_json() == before


def test_cli_shows_the_teams_and_the_queue_shows_the_team(tmp_path, capsys, ledger_db_url):  # noqa: F811
    with Ledger.from_url(ledger_db_url) as led:  # the wall clock, as the CLI reads it
        fill(led)
        _cli_story(led, tmp_path, capsys, ledger_db_url)


def _cli_story(led, tmp_path, capsys, ledger_db_url):  # noqa: F811
    f = tmp_path / "teams.yaml"
    f.write_text(TEAMS_YAML)
    assert main(["teams", "apply", str(f), "--ledger", ledger_db_url]) == 0
    assert "teams applied: intern, prod, research" in capsys.readouterr().out
    assert main(["teams", "apply", str(f), "--ledger", ledger_db_url]) == 0
    assert "unchanged" in capsys.readouterr().out
    for i in range(5):
        if led.enqueue(f"i{i}", PlanRequest(1), team="intern", lease_seconds=600).admitted:
            led.take_admission(f"i{i}")
    assert main(["teams", "--ledger", ledger_db_url]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("intern"))
    assert line.split()[:7] == ["intern", "*", "0", "4", "4", "0", "1"]
    assert next(x for x in out.splitlines() if x.startswith("TEAM")).split()[-1] == "JOBS" and line.split()[-1] == "4"  # its 4 running jobs, no cap
    assert main(["teams", "--ledger", ledger_db_url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {r["team"] for r in data["rows"]} == {"intern", "prod", "research"}
    assert main(["queue", "--ledger", ledger_db_url]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["POS", "JOB", "TEAM"] and "intern" in out


def test_teams_file_errors_in_the_core_name_the_source():
    with pytest.raises(TeamsError, match="^teams.yaml: team x: weight"):
        _teams("teams:\n  x: {quota: {'*': 1}, weight: 0}\n")


def test_team_samples_are_pruned_with_the_history(led, clock):
    from airflow_hetero_gpu.ledger.inventory import HostRecord
    from airflow_hetero_gpu.testing.captures import host_files
    from airflow_hetero_gpu.testing.demo import small_hosts

    led.apply_teams(_teams())
    _take(led, "r0", PlanRequest(1), "research", clock)
    assert any(s["team"] == "research" and s["in_use"] == 1 for s in led.team_samples())
    clock.tick(3600)
    led.release("r0")
    led.store_collection([HostRecord(s.name, True, host_files(s)) for s in small_hosts(2, gpus=8)],
                         collector="test", history_retention=1800)  # keeps only the last half hour
    samples = led.team_samples()
    assert samples and all(s["in_use"] == 0 for s in samples if s["team"] == "research")


@pytest.mark.parametrize("stored", [float("nan"), float("inf"), -5.0])
def test_a_non_finite_fair_share_history_is_never_stored_and_never_kept(led, clock, stored):
    """An older release left NaN (PostgreSQL) or infinity in team_usage: the next pass clamps it
    (a warning names the team and the value) and the standing is finite again."""
    import math

    from sqlalchemy import select, update

    from airflow_hetero_gpu.ledger.schema import team_usage

    led.apply_teams(_teams())
    _take(led, "i0", PlanRequest(1), "intern", clock)  # borrows 1: a team_usage row per team
    if stored != stored and led.dialect == "sqlite":
        stored = float("inf")  # SQLite binds NaN as NULL, refused by NOT NULL: its case is infinity
    with led._write("old release") as (conn, _):
        conn.execute(update(team_usage).where(team_usage.c.team == "intern").values(decayed_borrowed_gpu_s=stored))
    clock.tick(60)
    led.apply_teams(_teams("teams:\n  intern: {quota: {'*': 0}}\n  research: {quota: {'*': 8}}\n"))  # a sane file
    assert _take(led, "r0", PlanRequest(1), "research", clock).admitted  # the pass runs
    share = led.team_standing()["teams"]["intern"]
    assert math.isfinite(share["fair_share"]) and math.isfinite(share["decayed_borrowed_gpu_s"])
    with led._read("check") as (conn, _):
        values = [r.decayed_borrowed_gpu_s for r in conn.execute(select(team_usage))]
    assert values and all(math.isfinite(v) and v >= 0 for v in values), values
    from airflow_hetero_gpu.ledger.teams import MAX_DECAYED_GPU_S, finite_usage

    assert finite_usage("t", float("nan")) == 0.0 and finite_usage("t", -1.0) == 0.0
    assert finite_usage("t", float("inf")) == MAX_DECAYED_GPU_S == finite_usage("t", 1e300)


@pytest.mark.parametrize("bad", [dict(weight=float("nan")), dict(weight=float("inf")), dict(half=float("inf")),
                                 dict(half=float("nan")), dict(quota=10 ** 20), dict(name="a\n")])
def test_teams_built_in_code_meet_the_files_bounds(led, bad):
    from airflow_hetero_gpu.core.admission.teams import TeamQuota, Teams

    led.apply_teams(_teams())
    before = led.teams().to_json()
    name = bad.get("name", "prod")
    team = TeamQuota(name, {"*": bad.get("quota", 8)}, weight=bad.get("weight", 1.0))
    with pytest.raises(TeamsError, match="^api: (team|usage_half_life|invalid team)"):
        led.apply_teams(Teams({name: team}, bad.get("half", 3600.0)), "api")
    assert led.teams().to_json() == before


HOSTILE_TEAMS = ["<script>", "a" * 300, "a\n", "", " ", "research team", "-x"]


@pytest.mark.parametrize("team", HOSTILE_TEAMS)
def test_one_name_rule_in_the_ledgers_public_methods(led, team):
    """reserve and enqueue take the teams file's rule (fullmatch: "a\\n" is not "a"), and job ids
    the operator's: one line, nothing stored, on SQLite and PostgreSQL alike."""
    from airflow_hetero_gpu.ledger.errors import LedgerError

    led.apply_teams(_teams())
    cluster = FreshInventory(led.inventory(), float("inf")).cluster()
    for call in (lambda: led.reserve("j", cluster, PlanRequest(1), team=team),
                 lambda: led.enqueue("j", PlanRequest(1), team=team)):
        with pytest.raises(LedgerError, match=r"^invalid team .*: use 1-64 letters") as err:
            call()
        assert "\n" not in str(err.value)
    for job in ("bad id!", "a\n", "x" * 129, "..", "<script>"):
        with pytest.raises(LedgerError, match=r"^invalid job id .*: use 1-128 letters"):
            led.reserve(job, cluster, PlanRequest(1))
        with pytest.raises(LedgerError, match=r"^invalid job id"):
            led.enqueue(job, PlanRequest(1))
    assert led.live_reservations() == [] and led.queue() == []


def test_the_name_rule_is_one_function():
    from airflow_hetero_gpu.core.admission.teams import valid_team_name
    from airflow_hetero_gpu.core.names import JOB_ID, TEAM, InvalidName, check_name, valid_name
    from airflow_hetero_gpu.launch.command import validate_job_id

    assert valid_name("a") and not valid_name("a\n") and not valid_team_name("a\n")
    assert check_name("ml-research@site.eu", TEAM) == "ml-research@site.eu"
    assert check_name("dag.task.0123abcd", JOB_ID) == validate_job_id("dag.task.0123abcd")
    for value, kind in [("a\n", TEAM), ("a" * 65, TEAM), ("a@b", JOB_ID), ("a\n", JOB_ID), (None, TEAM)]:
        with pytest.raises(InvalidName):
            check_name(value, kind)
        with pytest.raises(ValueError):
            check_name(value, kind)
    with pytest.raises(TeamsError, match=r"^f.yaml: invalid team 'a\\n'"):
        teams_from_mapping({"teams": {"a\n": {"quota": {"*": 1}}}}, "f.yaml")


@pytest.mark.parametrize("flag, value, message", [
    ("--team", "<script>", "argument --team: invalid team '<script>': use 1-64 letters"),
    ("--team", "a\n", "argument --team: invalid team 'a\\n'"),
    ("--team", "t" * 300, "argument --team: invalid team 'tttt"),
    ("--job-id", "bad id!", "argument --job-id: invalid job id 'bad id!': use 1-128 letters"),
])
def test_plan_reserve_takes_the_one_name_rule(tmp_path, capsys, flag, value, message):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger.from_url(url) as led:
        fill(led)
    argv = ["plan", "--ledger", url, "--gpus", "1", "--reserve", "--job-id", "ok", "--team", "research", flag, value]
    try:
        code = main(argv)
    except SystemExit as done:
        code = int(done.code)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    with Ledger.open_existing(url) as led:
        assert led.live_reservations() == []


def test_plan_reserve_refuses_a_team_the_file_does_not_name(tmp_path, capsys):
    from sqlalchemy import select

    from airflow_hetero_gpu.ledger.schema import team_usage

    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger.from_url(url) as led:
        fill(led)
        argv = ["plan", "--ledger", url, "--gpus", "1", "--reserve", "--job-id", "j1", "--team", "nobody"]
        assert main(argv) == 0  # no teams configured: any team is taken (quotas are off)
        led.release("j1")
        led.apply_teams(_teams())
        capsys.readouterr()
        with led._read("rows") as (conn, _):
            before = sorted(r.team for r in conn.execute(select(team_usage)))
        assert main([*argv[:-1], "reserch"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--team: team 'reserch' is not in the teams file (its teams: intern, prod, " \
            "research); did you mean 'research'?" in err and "nothing reserved" in err, err
        assert led.get("j1") is None
        with led._read("rows") as (conn, _):
            assert sorted(r.team for r in conn.execute(select(team_usage))) == before and "reserch" not in before
        assert main([*argv[:-1], "research"]) == 0


def test_unknown_team_is_one_reusable_check():
    from airflow_hetero_gpu.core.admission.teams import unknown_team

    assert unknown_team("visoin", []) is None and unknown_team("vision", ["vision"]) is None
    line = unknown_team("x", [f"t{i:02d}" for i in range(25)])
    assert "(its teams: t00, t01" in line and "t19, ... (5 more))" in line and "did you mean" not in line


def test_teams_apply_help_has_the_format_and_an_example_that_applies(capsys):
    import textwrap

    with pytest.raises(SystemExit):
        main(["teams", "apply", "--help"])
    out = capsys.readouterr().out
    assert "Replace every team's GPU quota" in out and "The file (YAML" in out and "borrowing_limit:" in out
    example = out.split("Example (teams.yaml):\n", 1)[1].split("\n\n", 1)[0]
    teams = teams_from_mapping(__import__("yaml").safe_load(textwrap.dedent(example)), "help")
    assert sorted(teams.teams) == ["intern", "prod", "research"] and teams.usage_half_life_s == 86400


# --- "borrowed" is computed from what each team holds now (docs/teams.md, "Borrowed") -------------
RESEARCH_PROD = """\
teams:
  research: {quota: {"*": 8}}
  prod:     {quota: {"*": 8}}
  intern:   {quota: {"*": 0}}
"""


def _research_borrows_then_returns(led, clock=None):
    """research (quota 8 of 16) runs r-a (8) and r-b (4, borrowing prod's idle quota); r-a ends."""
    led.apply_teams(_teams(RESEARCH_PROD))
    for job, gpus in (("r-a", 8), ("r-b", 4)):
        entry = led.enqueue(job, PlanRequest(gpus), team="research", lease_seconds=600)
        assert entry.admitted
        led.take_admission(job)
        if clock is not None:
            clock.tick(1)
    assert led.get("r-b").borrowed == 4  # it borrowed when it started
    led.release("r-a")


def test_a_team_back_within_its_quota_accrues_no_history(tmp_path, capsys, ledger_db_url):  # noqa: F811
    import time

    with Ledger.from_url(ledger_db_url) as led:  # the wall clock, as the CLI reads it
        fill(led)
        _research_borrows_then_returns(led)
        seen = []
        for _ in range(2):
            capsys.readouterr()
            assert main(["teams", "--ledger", ledger_db_url, "--json"]) == 0
            data = json.loads(capsys.readouterr().out)
            seen.append(data["teams"]["research"])
            rows = {(r["team"], r["pattern"]): r for r in data["rows"]}
            assert (rows[("research", "*")]["in_use"], rows[("research", "*")]["borrowed"]) == (4, 0)
            time.sleep(1.5)  # at 4 borrowed GPUs the history would grow by 6 GPU-seconds
        assert seen[1]["decayed_borrowed_gpu_s"] <= seen[0]["decayed_borrowed_gpu_s"]
        assert seen[1]["fair_share"] <= seen[0]["fair_share"]
        samples = [s for s in led.team_samples() if s["team"] == "research"]
        assert samples[-1]["in_use"] == 4 and samples[-1]["borrowed"] == 0


def test_a_job_of_a_team_back_within_its_quota_is_no_reclaim_candidate(led, clock):
    from airflow_hetero_gpu.core.admission import PreemptionRules

    led.preemption = PreemptionRules(min_runtime_s=0, delay_s=0)
    _research_borrows_then_returns(led, clock)
    for job, team in (("r-c", "research"), ("i-1", "intern")):  # research at its quota; intern borrows 4
        entry = led.enqueue(job, PlanRequest(4), team=team, lease_seconds=600)
        assert entry.admitted, entry.reason
        led.take_admission(job)
    clock.tick(60)
    led.note_checkpoint("r-b")  # r-b would lose the least work: the first victim, were it a candidate
    p = led.enqueue("p-8", PlanRequest(8), team="prod", lease_seconds=600)  # within prod's quota, 4 GPUs free
    assert not p.admitted
    [record] = led.preemptions()
    assert record["victim"] == "i-1" and record["preemptor"] == "p-8"  # the borrower now, not r-b
    assert "reclaim of prod's quota" in record["reason"]
    assert led.get("r-b").preempting is None


def test_the_renewal_of_a_job_within_its_quota_reclaims_from_borrowers_of_equal_priority(led, clock):
    """A fleet full of long jobs frees nothing: the reclaim must come from the waiting entry's
    own renewal once it waited the delay, not from an unrelated write (every job here is of
    priority 0, so no lower-priority job is there to preempt)."""
    from airflow_hetero_gpu.core.admission import PreemptionRules

    led.preemption = PreemptionRules(min_runtime_s=30, delay_s=15)
    led.apply_teams(_teams(RESEARCH_PROD))
    for job in ("r-a", "r-b"):  # research holds all 16 GPUs, 8 of them on prod's idle quota
        assert _take(led, job, PlanRequest(8), "research", clock).admitted
    p = led.enqueue("p-4", PlanRequest(4), team="prod", lease_seconds=600)
    assert not p.admitted and led.preemptions() == []  # research's jobs ran 1-2 s: too young
    clock.tick(10)
    led.renew_queue_entry("p-4")  # waited 10 s of the 15: nothing yet
    assert led.preemptions() == []
    clock.tick(30)  # waited 40 s, research's jobs ran over 30 s
    led.renew_queue_entry("p-4")  # nothing else happens in the ledger: the renewal decides
    [record] = led.preemptions()
    assert record["preemptor"] == "p-4" and record["victim"] in ("r-a", "r-b")
    assert record["reason"] == "team prod, priority 0 = 0; reclaim of prod's quota"


def test_max_jobs_caps_a_teams_running_jobs_in_the_queue_and_direct_reservations(led, clock):
    led.apply_teams(_teams('teams:\n  intern: {quota: {"*": 16}, max_jobs: 2}\n  prod: {quota: {"*": 0}}\n'))
    for job in ("i-1", "i-2"):
        assert _take(led, job, PlanRequest(1), "intern", clock).admitted
    third = led.enqueue("i-3", PlanRequest(1), team="intern")
    assert not third.admitted and third.standing == "waiting" and third.claim is None
    assert third.reason == "head of the queue, waits: team intern runs its 2 of max_jobs 2"
    with pytest.raises(QuotaRefused, match="not reserved: team intern runs its 2 of max_jobs 2"):
        led.reserve("i-direct", FreshInventory(led.inventory(), float("inf")).cluster(), PlanRequest(1), team="intern")
    standing = led.team_standing()
    assert (standing["teams"]["intern"]["jobs"], standing["teams"]["intern"]["max_jobs"]) == (2, 2)
    led.release("i-1")  # one ends: the waiting one starts in the same write
    assert led.queue_entry("i-3").admitted
