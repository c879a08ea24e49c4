"""The cluster page for a 1,000-host fleet in a real browser, inside the real Airflow UI.

One api-server for the module (``browser_fixtures.ApiServer``) reads a SQLite ledger holding
the inventory of 1,000 emulated hosts (``page_fleet``: 8 GPUs each, racks of 16 under leaves
under spines, two hosts whose collection failed), seven live reservations, an eviction, and the
history of one host over nine health checks five minutes apart in which its GPU 3 reports an
uncorrectable ECC error twice (evicted at the first, readmitted at the third healthy check).
Headless Chromium opens the page from Airflow's navigation, in Airflow's own frame.

Set ``HETERO_GPU_SCREENSHOTS=DIR`` to keep the screenshots (docs/img holds the ones in docs/ui.md).
"""

from __future__ import annotations

import copy
import json
import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlparse

import pytest

from browser_fixtures import ApiServer, browser, login, table_rows  # noqa: F401  (browser: a fixture)
from page_fleet import down_hosts, fleet_hosts, fleet_records, topology_conf
from ledger_clock import Clock

pytestmark = pytest.mark.slow

HOSTS = 1000
WATCHED = 40  # the host with the history
SIZES = [(1440, 900), (1024, 768)]

# canvas converts any CSS colour (oklch included) into the sRGB bytes it paints
TO_RGB = """c => { const x = document.createElement('canvas').getContext('2d'); x.fillStyle = c; x.fillRect(0, 0, 1, 1);
                   return Array.from(x.getImageData(0, 0, 1, 1).data.slice(0, 3)); }"""


def _judge(captures, new_xids, files):
    from airflow_hetero_gpu.core import watch
    from airflow_hetero_gpu.core.config import ClusterConfig

    config = ClusterConfig()
    return watch.evaluate(captures, config, new_xids), watch.WatchPolicy.from_thresholds(config.thresholds)


def _fill_ledger(url: str) -> dict:
    from airflow_hetero_gpu.collect.freshness import FreshInventory
    from airflow_hetero_gpu.core.model import PlanRequest
    from airflow_hetero_gpu.ledger import Ledger

    specs = fleet_hosts(HOSTS)
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=50)
    clock = Clock(start)
    times = []
    watched = specs[WATCHED]
    with Ledger.from_url(url, clock=clock) as led:
        led.store_collection(fleet_records(specs, down_hosts(specs)), collector="fleet test",
                             fleet_files={"topology.conf": topology_conf(HOSTS)})
        for n in range(1, 10):
            clock.now = start + timedelta(minutes=5 * n)
            spec = copy.deepcopy(watched)
            if n in (2, 3):
                spec.gpus[3].ecc_uncorrected_volatile = 2
            led.record_health_check(fleet_records([spec]), collector="fleet test", judge=_judge)
            times.append(clock.now)
        events = [(e.kind, e.at) for e in led.gpu_events(start)]
    jobs = []
    with Ledger.from_url(url) as led:  # live leases on the real clock
        cluster = FreshInventory(led.inventory(), float("inf")).cluster()
        for n, k in enumerate([8, 8, 4, 2, 16, 1, 8]):
            job = f"hetero_gpu_retrain.train.{n:02d}{'abcdef'[n % 6] * 10}"
            ident = {"dag_id": "hetero_gpu_retrain", "run_id": f"scheduled__2026-12-01T{n:02d}:00:00+00:00",
                     "task_id": "train", "try_number": 1 + n % 2}
            assert led.reserve(job, cluster, PlanRequest(k), lease_seconds=4 * 3600, identity=ident).decision
            jobs.append(job)
        led.evict((specs[100].name, 5), reasons=["xid-79"])
    return {"times": times, "events": events, "watched": watched.name, "jobs": jobs}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    home = tmp_path_factory.mktemp("fleet_home")
    url = f"sqlite:///{home / 'ledger.db'}"
    facts = _fill_ledger(url)
    with ApiServer(home, env={"AIRFLOW__HETERO_GPU__LEDGER_URL": url,
                              "AIRFLOW__HETERO_GPU__REFRESH_SECONDS": "0"}) as srv:
        yield srv, facts


@pytest.fixture(scope="module")
def viewer(fleet, browser):  # noqa: F811
    """One logged-in browser context for the module (a page per test)."""
    page = login(browser, fleet[0], "viewer")
    page.close()
    yield page.context
    page.context.close()


def _shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("HETERO_GPU_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _open(context, server, size, path="/plugin/hetero-gpu"):
    """The Airflow UI at ``path`` in a new page of ``size`` of the logged-in ``context``;
    (page, the cluster page's frame)."""
    page = context.new_page()
    page.set_viewport_size({"width": size[0], "height": size[1]})
    page.goto(server.url(path))
    page.frame_locator("iframe").locator("h1").wait_for()
    frame = next(f for f in page.frames if f.parent_frame is not None and urlparse(f.url).path.startswith("/hetero-gpu/"))
    frame.wait_for_load_state()
    return page, frame


def _column(frame, table: str, name: str) -> dict:
    return frame.evaluate(
        """([table, name]) => {
            const th = [...document.querySelectorAll(`table.${table} thead th`)]
                .find(t => t.innerText.trim().replace(/[\\u25b2\\u25bc]$/, '') === name);
            const r = th.getBoundingClientRect(), cell = th.closest('table').querySelector(
                `tbody tr td:nth-child(${[...th.parentNode.children].indexOf(th) + 1})`).getBoundingClientRect();
            return {left: r.left, right: r.right, width: r.width, cell_right: cell.right,
                    shown: getComputedStyle(th).display !== 'none', vw: document.documentElement.clientWidth,
                    sw: document.documentElement.scrollWidth};
        }""", [table, name])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_state_and_lease_columns_are_visible_without_sideways_scrolling(fleet, viewer, size, tmp_path):
    server, facts = fleet
    page, frame = _open(viewer, server, size)
    try:
        for table, name in (("hg-gpus", "State"), ("hg-reservations", "Lease"), ("hg-gpus", "Job"),
                            ("hg-gpus", "Util"), ("hg-reservations", "Job")):
            col = _column(frame, table, name)
            assert col["shown"] and col["width"] > 20, (table, name, col)
            assert col["right"] <= col["vw"] and col["cell_right"] <= col["vw"], (table, name, col)
            assert col["sw"] <= col["vw"], f"the page scrolls sideways at {size}: {col}"
        outer = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
        assert outer[0] <= outer[1]
        rows = _rows(frame.locator("table.hg-reservations"))
        assert sorted(r["Job"] for r in rows) == sorted(facts["jobs"])
        assert all(re.fullmatch(r"in (3h\d\d|4h00)m|in 2\d\dm\d\ds", r["Lease"]) for r in rows), rows
        frame.locator("#reservations").evaluate("e => e.scrollIntoView()")
        page.screenshot(path=str(_shots(tmp_path) / f"cluster-page-{size[0]}.png"))
    finally:
        page.close()


def test_table_headers_stick_to_the_top_while_scrolling(fleet, viewer):
    server, _ = fleet
    page, frame = _open(viewer, server, SIZES[1])
    try:
        frame.locator("table.hg-gpus tbody tr").nth(60).evaluate("e => e.scrollIntoView()")
        top = frame.evaluate("""() => ({th: document.querySelector('table.hg-gpus thead th').getBoundingClientRect().top,
                                        table: document.querySelector('table.hg-gpus').getBoundingClientRect().top})""")
        assert top["table"] < -500 and abs(top["th"]) <= 1, top
    finally:
        page.close()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_thousand_hosts_fit_the_width_with_legible_labels(fleet, viewer, size, tmp_path):
    server, _ = fleet
    page, frame = _open(viewer, server, size)
    try:
        m = frame.evaluate("""() => {
            const names = [...document.querySelectorAll('#fleet .hg-tile-name')];
            const vw = document.documentElement.clientWidth;
            const sizes = names.map(n => parseFloat(getComputedStyle(n).fontSize));
            return {tiles: names.length, vw, sw: document.documentElement.scrollWidth,
                    min_font: Math.min(...sizes), min_height: Math.min(...names.map(n => n.getBoundingClientRect().height)),
                    cut: names.filter(n => n.scrollWidth > n.clientWidth).length,
                    beyond: [...document.querySelectorAll('#fleet .hg-tile')].filter(t => t.getBoundingClientRect().right > vw).length,
                    cells: document.querySelectorAll('#fleet .hg-cells i').length,
                    leaves: document.querySelectorAll('#fleet .hg-group[data-tier="1"]').length};
        }""")
        assert m["tiles"] == HOSTS and m["cells"] == (HOSTS - 2) * 8 and m["leaves"] == HOSTS // 16 + 1, m
        assert m["min_font"] >= 10 and m["min_height"] >= 10, m
        assert m["cut"] == 0 and m["beyond"] == 0 and m["sw"] <= m["vw"], m
        if size == SIZES[0]:
            page.screenshot(path=str(_shots(tmp_path) / "cluster-overview-1000.png"))
    finally:
        page.close()


def _rows(table) -> list[dict[str, str]]:
    """``table_rows`` with the sort mark of a sorted column's header dropped."""
    return [{k.rstrip("\u25b2\u25bc"): v for k, v in row.items()} for row in table_rows(table)]


def _rgb(frame, css: str) -> list[int]:
    return frame.evaluate(TO_RGB, css)


def _backgrounds(page, frame) -> tuple[list[int], list[int]]:
    ours = frame.evaluate("() => getComputedStyle(document.body).backgroundColor")
    airflow = page.evaluate("() => getComputedStyle(document.documentElement).backgroundColor")
    return _rgb(frame, ours), _rgb(frame, airflow)


def _appearance(page, choice: str) -> None:
    page.get_by_role("button", name="User").click()
    page.get_by_role("menuitem", name="Appearance").hover()
    page.get_by_role("menuitemradio", name=choice).click()
    page.keyboard.press("Escape")


def test_the_page_follows_airflows_theme(fleet, browser, tmp_path):  # noqa: F811
    server, _ = fleet
    context = login(browser, server, "viewer").context  # its own: the appearance is kept in the context
    page, frame = _open(context, server, SIZES[0])
    try:
        light, airflow = _backgrounds(page, frame)
        assert min(light) > 230 and max(abs(a - b) for a, b in zip(light, airflow)) <= 3, (light, airflow)
        _appearance(page, "Dark Mode")  # switched in the UI: the framed page follows without a reload
        frame.wait_for_function("() => document.documentElement.classList.contains('hg-dark')")
        dark, airflow = _backgrounds(page, frame)
        assert max(dark) < 80 and max(abs(a - b) for a, b in zip(dark, airflow)) <= 3, (dark, airflow)
        text = _rgb(frame, frame.evaluate("() => getComputedStyle(document.body).color"))
        assert min(text) > 200  # light text on the dark background
        frame.locator("#fleet").evaluate("e => e.scrollIntoView()")
        page.screenshot(path=str(_shots(tmp_path) / "cluster-page-dark.png"))
        _appearance(page, "Light Mode")
        frame.wait_for_function("() => !document.documentElement.classList.contains('hg-dark')")
        assert min(_backgrounds(page, frame)[0]) > 230
        # following the system setting: the operating system's dark preference
        page.emulate_media(color_scheme="dark")
        _appearance(page, "Follow System Setting")
        frame.wait_for_function("() => getComputedStyle(document.body).backgroundColor !== 'rgb(255, 255, 255)'")
        assert max(_backgrounds(page, frame)[0]) < 80
    finally:
        page.context.close()


def test_the_hosts_timeline_marks_its_eviction_and_readmission(fleet, viewer, tmp_path):
    server, facts = fleet
    host, times = facts["watched"], facts["times"]
    assert facts["events"] == [("evicted", times[1]), ("readmitted", times[5])]
    page, frame = _open(viewer, server, SIZES[0])
    try:
        frame.locator(f'#fleet a.hg-tile[data-host="{host}"]').click()  # the tile opens the host's page
        frame.wait_for_url(f"**/hetero-gpu/hosts/{host}")
        chart = frame.locator("svg#hg-h-counts")
        chart.wait_for()
        marks = chart.evaluate("""svg => {
            const box = svg.getBoundingClientRect(), scale = box.width / svg.viewBox.baseVal.width;
            return {since: svg.dataset.since, until: svg.dataset.until, x0: +svg.dataset.x0, x1: +svg.dataset.x1,
                    scale, marks: [...svg.querySelectorAll('g.hg-event')].map(g => {
                        const r = g.querySelector('line').getBoundingClientRect();
                        return {kind: g.dataset.kind, at: g.dataset.at, gpu: g.dataset.gpu,
                                x: (r.left + r.width / 2 - box.left) / scale};
                    })};
        }""")
        since, until = (datetime.fromisoformat(marks[k]) for k in ("since", "until"))
        got = [(m["kind"], m["gpu"], datetime.fromisoformat(m["at"])) for m in marks["marks"]]
        assert got == [("evicted", f"{host}:3", times[1]), ("readmitted", f"{host}:3", times[5])]
        for m, t in zip(marks["marks"], (times[1], times[5])):
            want = marks["x0"] + (marks["x1"] - marks["x0"]) * (t - since) / (until - since)
            assert abs(m["x"] - want) <= 1.5, (m, want)
        assert frame.locator("svg#hg-h-util path[data-series]").count() == 8
        rows = table_rows(frame.locator("table.hg-events"))
        assert [(r["Event"], r["GPU"]) for r in rows] == [("readmitted", "3"), ("evicted", "3")]
        frame.get_by_role("link", name="1 h", exact=True).click()  # the last hour: the same two events
        frame.wait_for_url("**hours=1**")
        assert frame.locator("svg#hg-h-counts g.hg-event").evaluate_all("gs => gs.map(g => g.dataset.kind)") == [
            "evicted", "readmitted"]
        frame.locator("#history").evaluate("e => e.scrollIntoView()")
        page.screenshot(path=str(_shots(tmp_path) / "host-history.png"))
    finally:
        page.close()


def test_filter_and_sort_without_a_script_framework(fleet, viewer):
    server, facts = fleet
    page, frame = _open(viewer, server, SIZES[0])
    try:
        frame.locator('select[name="state"]').select_option("reserved")
        frame.get_by_role("button", name="Filter").click()
        frame.wait_for_url("**state=reserved**")
        rows = _rows(frame.locator("table.hg-gpus"))
        assert len(rows) == 8 + 8 + 4 + 2 + 16 + 1 + 8 and {r["State"] for r in rows} == {"reserved"}
        tiles = frame.locator("#fleet a.hg-tile")
        assert 0 < tiles.count() < HOSTS  # the overview narrows to the hosts holding reservations
        frame.locator("table.hg-gpus thead th", has_text="Host").locator("a").click()  # sort by host: descending
        frame.wait_for_url("**sort=-host**")
        hosts = [r["Host"] for r in _rows(frame.locator("table.hg-gpus"))]
        assert hosts == sorted(hosts, reverse=True) and "state=reserved" in frame.url
    finally:
        page.close()


def test_the_json_link_opens_in_a_new_tab_and_the_page_keeps_its_policy(fleet, viewer):
    server, _ = fleet
    page = viewer.new_page()
    tab = None
    refused = []
    page.on("console", lambda msg: refused.append(msg.text) if "Content Security Policy" in msg.text else None)
    try:
        page.goto(server.url("/plugin/hetero-gpu"))
        frame = page.frame_locator("iframe")
        link = frame.get_by_role("link", name="JSON", exact=True)
        with page.context.expect_page() as opened:
            link.click()
        tab = opened.value
        tab.wait_for_load_state()
        assert tab.url == server.url("/hetero-gpu/api/cluster")
        facts = json.loads(tab.locator("body").inner_text())
        assert len(facts["hosts"]) == HOSTS and facts["totals"]["gpus"] == (HOSTS - 2) * 8
        assert "/plugin/hetero-gpu" in page.url  # the UI stays on the page's view
        assert refused == []
    finally:
        if tab is not None:
            tab.close()
        page.close()
    with server.client("viewer") as client:
        for path in ("/hetero-gpu/", "/hetero-gpu/api/cluster", f"/hetero-gpu/hosts/{fleet[1]['watched']}"):
            r = client.get(path)
            assert r.status_code == 200, (path, r.status_code)
            assert "frame-ancestors 'self'" in r.headers["content-security-policy"]
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["referrer-policy"] == "same-origin"
    with server.client() as anonymous:
        r = anonymous.get("/hetero-gpu/")
        assert r.status_code in (401, 403) and r.headers["x-content-type-options"] == "nosniff"
