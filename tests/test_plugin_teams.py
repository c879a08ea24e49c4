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
                                                      "intern": {"quota": {"*": 4}, "borrowing_limit": {"*": 4}}}}))
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
