"""A drained host and a hidden queue entry on the cluster page, in Chromium inside Airflow's frame.

One api-server for the module (``browser_fixtures.ApiServer``) reads a SQLite ledger holding the
inventory of 24 emulated hosts (``page_fleet``: 8 GPUs each, racks of 16, two hosts whose
collection failed, every seventh host half busy), six jobs filling the A100 hosts, one more A100
job waiting in the queue (its DAG ``secret_pipeline``), and one idle H200 host drained with a
reason and a deadline. The auth manager is the simple one with a third user, ``outsider``, who may
view the page but read no DAG (``dag_scoped_auth``). A teams file is applied: ``research``, whose
quota the Airflow teams ``research_cv`` and ``research_nlp`` draw on, holds the jobs and the wait;
``infra`` holds nothing.

At 1440 × 900 and 1024 × 768: the drained host's cells in their own colour (not busy's), their
count in the summary and the legend, the line naming the host, why and its deadline inside the
first screen, the reason and the deadline on the tile's tooltip; the Teams section's Airflow
teams, and the Team of the reservations and of the queue entry, inside the page's width;
``/api/cluster`` gives the
outsider no DAG, run, task or try of the waiting job (nor of the reservations), and the viewer
all of them.

``HETERO_GPU_SCREENSHOTS=DIR`` keeps the screenshots (docs/img holds the ones in docs/ui.md).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import urlparse

import pytest

from browser_fixtures import PASSWORDS, USERS, ApiServer, browser, login  # noqa: F401  (browser: a fixture)
from page_fleet import down_hosts, fleet_hosts, fleet_records, topology_conf

pytestmark = pytest.mark.slow

HOSTS = 24
DRAINED = "gpu-r000-n07"  # an idle H200 host
REASON = "driver upgrade to 580"
SECRET_DAG = "secret_pipeline"
SIZES = [(1440, 900), (1024, 768)]
TESTS = Path(__file__).resolve().parent
TO_RGB = """c => { const x = document.createElement('canvas').getContext('2d'); x.fillStyle = c; x.fillRect(0, 0, 1, 1);
                   return Array.from(x.getImageData(0, 0, 1, 1).data.slice(0, 3)); }"""


def _fill_ledger(url: str) -> dict:
    from airflow_hetero_gpu.collect.freshness import FreshInventory
    from airflow_hetero_gpu.core.admission import teams_from_mapping
    from airflow_hetero_gpu.core.model import PlanRequest
    from airflow_hetero_gpu.ledger import Ledger

    specs = fleet_hosts(HOSTS)
    a100 = specs[0].gpus[0].name
    with Ledger.from_url(url) as led:
        led.store_collection(fleet_records(specs, down_hosts(specs)), collector="fleet test",
                             fleet_files={"topology.conf": topology_conf(HOSTS)})
        cluster = FreshInventory(led.inventory(), float("inf")).cluster()
        led.apply_teams(teams_from_mapping({"teams": {
            "research": {"quota": {"*": 8 * HOSTS}, "airflow_teams": ["research_cv", "research_nlp"]},
            "infra": {"quota": {"*": 0}}}}))
        a100_hosts = sum(1 for s in specs if s.gpus[0].name == a100 and s.name not in down_hosts(specs))
        for n in range(a100_hosts):
            ident = {"dag_id": "hetero_gpu_retrain", "run_id": f"scheduled__2026-12-01T{n:02d}:00:00+00:00",
                     "task_id": "train", "try_number": 1}
            assert led.reserve(f"retrain-{n}", cluster, PlanRequest(8, a100), lease_seconds=4 * 3600,
                               identity=ident, team="research").decision
        waiting = led.enqueue("secret-job", PlanRequest(8, a100), lease_seconds=4 * 3600, team="research",
                              identity={"dag_id": SECRET_DAG, "run_id": "manual__2026-12-05T09:00:00+00:00",
                                        "task_id": "hidden_task", "try_number": 2})
        assert not waiting.admitted
        led.drain([DRAINED], REASON, deadline_s=2 * 3600, by="ops")
    return {"gpus_drained": len(specs[7].gpus)}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    home = tmp_path_factory.mktemp("drained_home")
    url = f"sqlite:///{home / 'ledger.db'}"
    facts = _fill_ledger(url)
    srv = ApiServer(home, env={"AIRFLOW__HETERO_GPU__LEDGER_URL": url, "AIRFLOW__HETERO_GPU__REFRESH_SECONDS": "0",
                               "AIRFLOW__CORE__AUTH_MANAGER": "dag_scoped_auth.DagScopedAuthManager",
                               "HETERO_GPU_TEST_NO_DAG_USERS": "outsider"},
                    users={**USERS, "outsider": "viewer"}, passwords={**PASSWORDS, "outsider": "outsider-pw-for-tests"})
    srv.env["PYTHONPATH"] = os.pathsep.join([str(TESTS), srv.env["PYTHONPATH"]])
    with srv:
        yield srv, facts


def _shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("HETERO_GPU_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _open(context, server, size):
    page = context.new_page()
    page.set_viewport_size({"width": size[0], "height": size[1]})
    page.goto(server.url("/plugin/hetero-gpu"))
    page.frame_locator("iframe").locator("h1").wait_for()
    frame = next(f for f in page.frames if f.parent_frame is not None and urlparse(f.url).path.startswith("/hetero-gpu/"))
    frame.wait_for_load_state()
    return page, frame


def _bottom_in_window(page, frame, selector: str) -> float:
    """Where ``selector``'s bottom edge is in the browser window (the frame's offset added)."""
    top = page.locator("iframe").evaluate("f => f.getBoundingClientRect().top")
    return top + frame.locator(selector).first.evaluate("e => e.getBoundingClientRect().bottom")


def _column(frame, table: str, name: str) -> dict:
    """Where the column ``name`` of ``table``, its first cell and its table end, the cell's text, and the
    page's width."""
    return frame.evaluate(
        """([table, name]) => {
            const th = [...document.querySelectorAll(`table.${table} thead th`)]
                .find(t => t.innerText.trim().replace(/[\\u25b2\\u25bc]$/, '') === name);
            const td = th.closest('table').querySelector(
                `tbody tr td:nth-child(${[...th.parentNode.children].indexOf(th) + 1})`);
            return {right: th.getBoundingClientRect().right, cell_right: td.getBoundingClientRect().right,
                    table_right: th.closest('table').getBoundingClientRect().right, cell: td.innerText.trim(),
                    shown: getComputedStyle(th).display !== 'none', vw: document.documentElement.clientWidth};
        }""", [table, name])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_drained_host_has_its_colour_count_and_reason_on_the_first_screen(fleet, browser, size, tmp_path):  # noqa: F811
    server, facts = fleet
    n = facts["gpus_drained"]
    page, frame = _open(login(browser, server, "viewer").context, server, size)
    try:
        with server.client("viewer") as client:
            totals = client.get("/hetero-gpu/api/cluster").json()["totals"]
        assert totals["drained"] == n and totals["busy"] > 0  # the half-busy hosts stay busy, apart
        summary = frame.locator("p.hg-summary").inner_text()
        assert f"{totals['busy']} busy, {n} drained, " in summary, summary
        line = frame.locator("p.hg-drained-line")
        text = line.inner_text()
        assert "1 host drained" in text and f"{DRAINED}: {REASON} (since " in text, text
        # the deadline is 2 h after the drain: what has passed and what is left make 2 h (the
        # second size may run minutes after the first on a loaded machine)
        found = re.search(r"\(since (?:(\d+)m)?(\d+)s, by ops; running jobs end in (\d+)h(\d\d)m\)", text)
        assert found, text
        since = int(found.group(1) or 0) * 60 + int(found.group(2))
        left = int(found.group(3)) * 3600 + int(found.group(4)) * 60
        assert 7200 - 60 <= since + left <= 7200 + 60, text
        legend = frame.locator(".hg-legend").first.inner_text()
        assert f"drained (no new jobs): {n} GPUs" in legend, legend
        # above the fold: the summary, the drained line and the legend inside the first screen
        for selector in ("p.hg-summary", "p.hg-drained-line", ".hg-legend"):
            assert _bottom_in_window(page, frame, selector) <= size[1], selector
        cells = frame.locator(f'#fleet a.hg-tile[data-host="{DRAINED}"] .hg-cells i')
        assert cells.count() == n and set(cells.evaluate_all("cs => cs.map(c => c.dataset.state)")) == {"drained"}
        colour = lambda sel: frame.evaluate(TO_RGB, frame.locator(sel).first.evaluate(
            "e => getComputedStyle(e).backgroundColor"))
        drained, busy = colour(f'#fleet a.hg-tile[data-host="{DRAINED}"] .hg-cells i'), colour('#fleet i[data-state="busy"]')
        swatch = colour("p.hg-drained-line .hg-swatch")
        assert drained == swatch and max(abs(a - b) for a, b in zip(drained, busy)) > 60, (drained, busy)
        tile = frame.locator(f'#fleet a.hg-tile[data-host="{DRAINED}"]')
        title = tile.get_attribute("title")
        assert f"drained: {REASON} (since " in title and "by ops; running jobs end in " in title, title
        # the Teams section: each team's Airflow teams; the reservations' and the queue entry's team
        mapped = frame.locator("table.hg-teams td.hg-airflow-teams")
        assert [t.strip() for t in mapped.all_inner_texts() if t.strip()] == ["infra", "research_cv, research_nlp"]
        for table, column in (("hg-teams", "Airflow teams"), ("hg-reservations", "Team"), ("hg-queue", "Team")):
            col = _column(frame, table, column)
            assert col["shown"] and col["cell"] and col["right"] <= col["vw"] and col["cell_right"] <= col["vw"], \
                (table, column, col)
            assert col["table_right"] <= col["vw"], f"{table} is wider than the page at {size}: {col}"
        assert _column(frame, "hg-queue", "Team")["cell"] == "research"
        assert _column(frame, "hg-reservations", "Team")["cell"] == "research"
        tile.hover()  # the browser shows the title as the tile's tooltip
        page.screenshot(path=str(_shots(tmp_path) / f"cluster-drained-{size[0]}.png"))
    finally:
        page.context.close()


def test_a_viewer_without_access_to_the_dag_sees_no_queue_identity(fleet):
    server, _ = fleet
    with server.client("outsider") as client:
        r = client.get("/hetero-gpu/api/cluster")
        assert r.status_code == 200
        facts = r.json()
        html = client.get("/hetero-gpu/").text
    (entry,) = [q for q in facts["queue"] if q["job_id"] == "secret-job"]
    assert entry["identity"] is None and entry["identity_hidden"] is True
    assert entry["position"] == 1 and entry["request"]["gpus"] == 8
    assert all(res["identity"] is None and res["identity_hidden"] for res in facts["reservations"])
    for secret in (SECRET_DAG, "hidden_task", "manual__2026-12-05T09:00:00", "hetero_gpu_retrain"):
        assert secret not in r.text and secret not in html, secret
    assert "secret-job" in html  # its place in the queue stays
    with server.client("viewer") as client:
        facts = client.get("/hetero-gpu/api/cluster").json()
    (entry,) = [q for q in facts["queue"] if q["job_id"] == "secret-job"]
    assert entry["identity"]["dag_id"] == SECRET_DAG and entry["identity"]["try_number"] == 2
    assert not entry["identity_hidden"]
    assert json.dumps(facts).count(SECRET_DAG) == 1
