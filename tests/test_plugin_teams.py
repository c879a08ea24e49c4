"""The cluster page's Teams section, read from a real SQLite ledger with quotas applied
(docs/teams.md): per team and pattern quota, in use, borrowed, lent, waiting, fair share, and
the chart of GPUs in use per team from the ledger's samples."""

from __future__ import annotations

import re

from airflow_hetero_gpu.core.admission import teams_from_mapping
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.plugins import model, render, sources
from test_ledger_queue import fill


def _page(url: str):
    inputs = sources.read_inputs(None, sources.PageSettings(ledger_url=url))
    m = model.build(inputs.cluster, inputs.reservations, inputs.evictions, queue=inputs.queue, now=inputs.now,
                    teams=inputs.teams, team_samples=inputs.team_samples)
    return m, render.render_page(m)


def test_the_teams_section_shows_quota_use_lending_and_the_chart(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger.from_url(url) as led:
        fill(led)
        assert "Teams" not in _page(url)[1]  # no team configured: no section
        led.apply_teams(teams_from_mapping({"teams": {"prod": {"quota": {"A100*": 12}},
                                                      "intern": {"quota": {"*": 4}, "borrowing_limit": {"*": 4},
                                                                 "airflow_teams": ["intern_cv", "intern_nlp"]}}}))
        for i in range(3):
            assert led.enqueue(f"i{i}", PlanRequest(2), team="intern", lease_seconds=3600).admitted
            led.take_admission(f"i{i}")
        led.enqueue("i3", PlanRequest(4), team="intern", lease_seconds=3600)  # above quota + limit: waits
    m, html = _page(url)
    body = html.split('class="hg-teams"')[1].split("</table>")[0]
    cells = lambda team: re.findall(r"<td[^>]*>([^<]*)</td>", body.split(f"<td>{team}</td>")[1].split("</tr>")[0])
    # intern: quota 4, 6 in use, 2 borrowed, 4 waiting, may borrow 4; prod lends 2 of its idle 12
    assert cells("intern")[:7] == ["*", "4", "6", "2", "0", "4", "4"]
    assert cells("prod")[:5] == ["A100*", "12", "0", "0", "2"]
    assert m.to_json()["teams"]["teams"]["intern"]["fair_share"] > 0
    chart = html.split('id="hg-teams-use"')[1] if 'id="hg-teams-use"' in html else html
    assert "GPUs in use per team" in html and "intern" in chart
    assert 'href="#teams"' in html
    # each team's Airflow teams (the teams file's mapping; default: its own name), on its first row
    assert "<th class=\"hg-wrap\">Airflow teams</th>" in body
    assert re.findall(r'<td class="hg-wrap hg-airflow-teams">([^<]*)</td>', body) == ["intern_cv, intern_nlp", "prod"]
    assert m.to_json()["teams"]["airflow_teams"] == {"intern": ["intern_cv", "intern_nlp"], "prod": ["prod"]}
    # the reservations and the queue entries show the (fleet) team they count for
    reservations = html.split('class="hg-reservations"')[1].split("</table>")[0]
    assert "<th>Team</th>" in reservations and reservations.count("<td>intern</td>") == 3
    queue = html.split('class="hg-queue"')[1].split("</table>")[0]
    assert "<th>Team</th>" in queue and queue.count("<td>intern</td>") == 1
    assert [e["team"] for e in m.to_json()["queue"]] == ["intern"]


def test_the_chart_fits_its_axis_to_the_history_and_leaves_out_teams_nobody_configured(tmp_path):
    """Ten minutes of samples fill the chart (not a line at the right edge of a 24-hour axis); a
    job run without a team is counted while it holds GPUs (its ``(no quota)`` row names the card
    types), and once it ended its team, ``default``, is not listed: nobody configured it."""
    from datetime import datetime, timedelta, timezone

    from ledger_clock import Clock

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=10)
    clock = Clock(start)
    with Ledger.from_url(url, clock=clock) as led:
        fill(led)
        led.apply_teams(teams_from_mapping({"teams": {"prod": {"quota": {"A100*": 12}},
                                                      "intern": {"quota": {"*": 4}}}}))
        assert led.enqueue("d0", PlanRequest(2), lease_seconds=7200).admitted  # no team: "default"
        led.take_admission("d0")
        clock.tick(180)
        assert led.enqueue("i0", PlanRequest(2), team="intern", lease_seconds=7200).admitted
        led.take_admission("i0")
        m, html = _page(url)
        rows = {(r["team"], r["pattern"]): r for r in m.to_json()["teams"]["rows"]}
        assert rows[("default", None)]["in_use"] == 2
        assert rows[("default", None)]["cards"] == ["NVIDIA A100-SXM4-80GB"]
        assert re.search(r"<td>default</td><td[^>]*>\(no quota\): <span title=\"NVIDIA A100-SXM4-80GB\">"
                         r"A100-SXM4-80GB</span></td>", html)
        clock.tick(180)
        assert led.release("d0")
    m, html = _page(url)
    teams = m.to_json()["teams"]
    assert teams["configured"] == ["intern", "prod"]
    assert {r["team"] for r in teams["rows"]} == {"intern", "prod"}
    chart = html.split('id="hg-teams-use"')[0].rsplit('<div class="hg-series-legend">', 1)[1] + \
        html.split('id="hg-teams-use"')[1].split("</svg>")[0]
    assert re.findall(r'data-series="([^"]+)"', chart) == ["intern", "prod"]  # no "default"
    assert "default" not in chart
    since = datetime.fromisoformat(re.search(r'data-since="([^"]+)"', chart).group(1))
    assert since == start  # the axis starts at the first sample, ten minutes ago, not 24 h ago
    assert "the last 10m" in chart
    x0 = float(re.search(r'data-x0="([^"]+)"', chart).group(1))
    x1 = float(re.search(r'data-x1="([^"]+)"', chart).group(1))
    paths = {name: d for d, name in re.findall(r'<path class="hg-s-gpu[^"]*" d="([^"]+)" data-series="([^"]+)"', chart)}
    assert all(d.startswith(f"M{x0:g} ") for d in paths.values())  # both from the axis' start (their 0 samples)
    # intern's first GPUs three minutes in: 30 % of the way, not squeezed against the right edge
    steps = [float(x) for x in re.findall(r"L([\d.]+) ", paths["intern"])]
    assert steps and abs((steps[0] - x0) / (x1 - x0) - 0.3) < 0.02, (paths, x0, x1)


def test_no_quota_rows_name_the_card_types_no_pattern_of_their_team_matches():
    from airflow_hetero_gpu.plugins.team_chart import no_quota_cards

    cards = ["NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-32GB"]
    standing = {"rows": [{"team": "prod", "pattern": "A100*", "quota": 8},
                         {"team": "prod", "pattern": None, "quota": 0},
                         {"team": "default", "pattern": None, "quota": 0}], "teams": {}}
    rows = no_quota_cards(standing, cards)["rows"]
    assert rows[1]["cards"] == ["NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-32GB"]
    assert rows[2]["cards"] == cards and "cards" not in rows[0]
