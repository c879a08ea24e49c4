"""The GPU cluster page in a real Airflow api-server: auth, the page, the JSON, the nav entry,
and what a user sees in a real browser.

One api-server (``browser_fixtures.ApiServer``: simple auth manager, users ``admin`` and
``viewer`` with known passwords) runs for the module on a free loopback port, with a temporary
AIRFLOW_HOME, the sample captures as ``[hetero_gpu] captures_dir`` and a SQLite ledger holding
one reservation and one eviction.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from browser_fixtures import ApiServer, browser, login, table_rows  # noqa: F401  (browser: a fixture)

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "airflow_hetero_gpu" / "samples" / "cluster"
RUN_ID = "manual__2025-06-01T11:00:00+00:00"
PAGE, API, SVG = "/hetero-gpu/", "/hetero-gpu/api/cluster", "/hetero-gpu/topology.svg"


def test_plugin_module_is_light():
    """Task runners import plugins: the plugin class must not pull FastAPI or the engine in."""
    code = (
        "import sys\n"
        "import airflow.plugins_manager\n"
        "before = set(sys.modules)\n"
        "from airflow_hetero_gpu.plugins.cluster_page import HeteroGpuPlugin\n"
        "new = sorted(set(sys.modules) - before)\n"
        "heavy = [m for m in ('fastapi', 'starlette', 'networkx', 'numpy', 'yaml', 'pydantic') if m in new]\n"
        "ours = [m for m in new if m.startswith('airflow_hetero_gpu')]\n"
        "import json; print(json.dumps([HeteroGpuPlugin.name, heavy, ours]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    name, heavy, ours = json.loads(r.stdout.strip().splitlines()[-1])
    assert (name, heavy) == ("hetero_gpu", [])
    assert set(ours) <= {"airflow_hetero_gpu", "airflow_hetero_gpu.plugins", "airflow_hetero_gpu.plugins.cluster_page",
                         "airflow_hetero_gpu.plugins.paths"}


def _make_ledger(url: str) -> None:
    from airflow_hetero_gpu.core.inventory import load_cluster
    from airflow_hetero_gpu.core.model import PlanRequest
    from airflow_hetero_gpu.ledger import Ledger

    cluster = load_cluster(SAMPLE)
    with Ledger.from_url(url) as ledger:
        result = ledger.reserve(
            "retrain-42", cluster, PlanRequest(2, gpu_type="A100-SXM4-80GB"), lease_seconds=3600,
            identity={"dag_id": "train_llm", "run_id": RUN_ID, "task_id": "train", "try_number": 1},
        )
        assert result.decision is not None
        ledger.evict(("v100", 5), reasons=["xid-79"])


@pytest.fixture(scope="module")
def api_server(tmp_path_factory):
    """The api-server of this module: sample captures, a SQLite ledger with one reservation and
    one eviction, the page refreshed on every request."""
    home = tmp_path_factory.mktemp("airflow_home")
    ledger_url = f"sqlite:///{home / 'ledger.db'}"
    _make_ledger(ledger_url)
    with ApiServer(home, env={
        "AIRFLOW__HETERO_GPU__CAPTURES_DIR": str(SAMPLE),
        "AIRFLOW__HETERO_GPU__LEDGER_URL": ledger_url,
        "AIRFLOW__HETERO_GPU__REFRESH_SECONDS": "0",
    }) as srv:
        yield srv


@pytest.fixture(scope="module")
def server(api_server):
    with api_server.client() as client:
        yield client


@pytest.fixture(scope="module")
def admin(api_server):
    return {"Authorization": f"Bearer {api_server.token('admin')}"}


@pytest.fixture(scope="module")
def viewer(api_server):
    return {"Authorization": f"Bearer {api_server.token('viewer')}"}


@pytest.mark.slow
@pytest.mark.parametrize("path", [PAGE, API, SVG])
def test_anonymous_requests_are_refused(server, path):
    r = server.get(path)
    assert r.status_code in (401, 403), (r.status_code, r.text[:300])
    assert "retrain-42" not in r.text and "A100" not in r.text
    forged = server.get(path, headers={"Authorization": "Bearer not-a-token"})
    assert forged.status_code in (401, 403)
    assert server.get(path, headers={"Cookie": "_token=not-a-token"}).status_code in (401, 403)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/hetero-gpu/openapi.json", "/hetero-gpu/docs", "/hetero-gpu/redoc"])
def test_no_unguarded_extras(server, path):
    assert server.get(path).status_code == 404


@pytest.mark.slow
def test_page_for_a_logged_in_user(server, admin):
    r = server.get(PAGE, headers=admin)
    assert r.status_code == 200, r.text[:500]
    assert r.headers["content-type"].startswith("text/html")
    html = r.text
    for needle in (
        "finetune+llm-pretrain@NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB", "cv+finetune@NVIDIA GeForce RTX 4090",
        "32 GPUs in 3 pools", "retrain-42", "train_llm", "xid-79", "ecc", "<svg", 'data-gpu="a100-2:6"',
        'data-job="retrain-42"', 'href="/hetero-gpu/api/cluster"',
        'href="/dags/train_llm/runs/manual__2025-06-01T11%3A00%3A00%2B00%3A00"',
    ):
        assert needle in html, needle
    assert html.split('class="hg-gpus"')[1].count("<tr>") == 1 + 32
    # the session cookie the Airflow UI sets works as well as a bearer token (the page runs in an iframe)
    cookie = admin["Authorization"].split()[1]
    assert server.get(PAGE, headers={"Cookie": f"_token={cookie}"}).status_code == 200


@pytest.mark.slow
def test_json_for_a_viewer(server, viewer):
    r = server.get(API, headers=viewer)
    assert r.status_code == 200, r.text[:500]
    facts = r.json()
    pools = {p["pool"]: p for p in facts["pools"]}
    assert set(pools) == {"finetune+llm-pretrain@NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB",
                          "cv+finetune@NVIDIA GeForce RTX 4090"}
    a100 = pools["finetune+llm-pretrain@NVIDIA A100-SXM4-80GB"]
    assert (a100["gpus"], a100["healthy"], a100["reserved"]) == (16, 15, 2)
    assert pools["Tesla V100-SXM2-32GB"]["evicted"] == 1
    assert len(facts["gpus"]) == 32
    (res,) = facts["reservations"]
    assert res["job_id"] == "retrain-42" and res["identity"]["dag_id"] == "train_llm"
    assert res["identity"]["run_id"] == RUN_ID and res["identity"]["task_id"] == "train"
    held = {(g["host"], g["index"]) for g in facts["gpus"] if g["reserved_by"] == "retrain-42"}
    assert held == {(g["host"], g["index"]) for g in res["gpus"]} and len(held) == 2
    (ev,) = facts["evictions"]
    assert (ev["host"], ev["index"], ev["reasons"]) == ("v100", 5, ["xid-79"])
    assert facts["sources"]["captures"]["status"] == facts["sources"]["ledger"]["status"] == "ok"
    svg = server.get(SVG, headers=viewer)
    assert svg.status_code == 200 and svg.headers["content-type"].startswith("image/svg+xml")
    assert 'data-host="rtx-2"' in svg.text


@pytest.mark.slow
def test_nav_entry_in_the_plugins_api(server, admin):
    assert server.get("/api/v2/plugins").status_code == 401
    r = server.get("/api/v2/plugins", headers=admin)
    assert r.status_code == 200
    plugin = next(p for p in r.json()["plugins"] if p["name"] == "hetero_gpu")
    (view,) = plugin["external_views"]
    assert view["name"] == "GPU cluster" and view["href"] == "hetero-gpu/"
    assert view["url_route"] == "hetero-gpu" and view["destination"] == "nav" and view["category"] == "browse"
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/hetero-gpu"]
    errors = server.get("/api/v2/plugins/importErrors", headers=admin).json()
    assert not [e for e in errors.get("import_errors", []) if "hetero" in json.dumps(e)], errors


def _open_cluster_page(page):
    """From the Airflow UI's navigation: Browse, then GPU cluster; returns the page's frame.

    On a loaded machine a click on the menu can land while the UI is still rendering and
    open nothing (CI once waited 60 s for a navigation that never started), so the two clicks
    are repeated, three times at most, until the UI has gone to the page."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(3):
        page.get_by_role("button", name="Browse").click()
        page.get_by_role("menuitem", name="GPU cluster").click()
        try:
            page.wait_for_url("**/plugin/hetero-gpu", timeout=20_000)
            break
        except PlaywrightTimeout:
            if attempt == 2:
                raise
            page.keyboard.press("Escape")
    return page.frame_locator("iframe")


@pytest.mark.slow
def test_in_a_browser_a_user_sees_pools_topology_reservations_and_the_json(api_server, browser):  # noqa: F811
    """A viewer logs in through the login form, opens the page from the navigation and sees the
    three pools with their counts, the topology picture with every host, the reservation with its
    DAG, and a JSON link that gives the same facts to the logged-in browser."""
    page = login(browser, api_server, "viewer")
    try:
        frame = _open_cluster_page(page)
        frame.get_by_role("heading", name="GPU cluster").wait_for()
        body = frame.locator("body")
        assert "32 GPUs in 3 pools" in body.inner_text()
        pools_table = frame.locator("xpath=//h2[normalize-space()='Pools']/following::table[1]")
        assert pools_table.is_visible()
        pools = {row["Pool"]: row for row in table_rows(pools_table)}
        assert set(pools) == {"finetune+llm-pretrain@NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB",
                              "cv+finetune@NVIDIA GeForce RTX 4090"}
        a100 = pools["finetune+llm-pretrain@NVIDIA A100-SXM4-80GB"]
        assert (a100["GPUs"], a100["Healthy"], a100["Reserved"]) == ("16", "15", "2")
        assert pools["Tesla V100-SXM2-32GB"]["Evicted"] == "1"
        picture = frame.locator("#fleet")  # the fleet overview: a tile per host
        assert picture.is_visible()
        box = picture.bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 100, box
        hosts = picture.locator("[data-host]")
        assert sorted(set(hosts.evaluate_all("els => els.map(e => e.dataset.host)"))) == [
            "a100-1", "a100-2", "rtx-1", "rtx-2", "v100"]
        assert picture.locator('[data-job="retrain-42"]').count() == 2  # the two reserved GPUs
        reservations = frame.locator("xpath=//h2[normalize-space()='Live reservations']/following::table[1]")
        assert reservations.is_visible()
        (held,) = table_rows(reservations)
        assert "retrain-42" in held.values() and "train_llm" in held.values(), held
        json_link = frame.get_by_role("link", name="JSON", exact=True)
        href = json_link.get_attribute("href")
        facts = page.context.request.get(api_server.url(href)).json()  # the browser's own cookie
        assert {p["pool"] for p in facts["pools"]} == {
            "finetune+llm-pretrain@NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB",
            "cv+finetune@NVIDIA GeForce RTX 4090"}
        assert [r["job_id"] for r in facts["reservations"]] == ["retrain-42"]
        # a context that never logged in gets no facts from the same link
        anonymous = browser.new_context()
        try:
            assert anonymous.request.get(api_server.url(href)).status in (401, 403)
        finally:
            anonymous.close()
    finally:
        page.context.close()


@pytest.mark.slow
def test_in_the_airflow_ui_a_run_link_opens_the_run(api_server, browser):  # noqa: F811
    """The nav entry shows the page in a sandboxed iframe that may not navigate the top window
    itself; the page's run links still open the run in the UI."""
    page = login(browser, api_server, "admin")
    try:
        frame = _open_cluster_page(page)
        link = frame.locator("table.hg-reservations a[data-ui-link]").first
        link.wait_for()
        link.click()
        page.wait_for_url("**/dags/train_llm/runs/**")
        assert page.url.endswith("/dags/train_llm/runs/manual__2025-06-01T11%3A00%3A00%2B00%3A00")
    finally:
        page.context.close()


# --- where the facts come from, without a server ------------------------------------------------
def test_missing_captures_and_ledger_are_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    from airflow_hetero_gpu.plugins import app, render, sources

    cluster, src = sources.read_inventory(sources.PageSettings())  # no ledger yet, nothing created
    assert cluster is None and src["status"] == "missing" and "hetero_gpu_health_watch" in src["message"]
    assert not (tmp_path / "hetero_gpu_ledger.db").exists()
    cluster, src = sources.read_inventory(sources.PageSettings(captures_dir=str(tmp_path / "none")))
    assert cluster is None and src["status"] == "missing" and "does not exist" in src["message"]
    # the empty state names the DAG that collects, and that it starts paused
    assert "hetero_gpu_health_watch DAG collects it; it starts paused: unpause it" in src["message"]
    (tmp_path / "broken" / "hosts" / "h1").mkdir(parents=True)
    (tmp_path / "broken" / "hosts" / "h1" / "query.csv").write_text("index, name\n0, X\n")
    cluster, src = sources.read_inventory(sources.PageSettings(captures_dir=str(tmp_path / "broken")))
    assert cluster is None and src["status"] == "error" and "query.csv" in src["message"]

    # the default ledger file does not exist yet: reported, and not created by looking
    res, evs, src = sources.read_ledger(sources.PageSettings())
    assert (res, evs, src["status"]) == ([], [], "missing")
    assert "nothing has been reserved" in src["message"]
    assert not (tmp_path / "hetero_gpu_ledger.db").exists()
    res, evs, src = sources.read_ledger(sources.PageSettings(ledger_url="mysql://x/y"))
    assert src["status"] == "error" and "unsupported database" in src["message"]

    html = render.render_page(app.snapshot(None, sources.PageSettings()))
    assert "hetero_gpu_health_watch DAG (it starts paused)" in html and "No ledger yet" in html


def test_inventory_is_reread_when_a_capture_changes(tmp_path):
    import shutil

    from airflow_hetero_gpu.plugins import sources

    caps = tmp_path / "caps"
    shutil.copytree(SAMPLE, caps)
    settings = sources.PageSettings(captures_dir=str(caps))
    first, _ = sources.read_inventory(settings)
    again, _ = sources.read_inventory(settings)
    assert again is first  # unchanged files: the parsed cluster is reused
    csv = caps / "hosts" / "rtx-2" / "query.csv"
    csv.write_text(csv.read_text().replace(", 5 %,", ", 95 %,"))
    os.utime(csv, ns=(time.time_ns() + 10**9,) * 2)
    changed, src = sources.read_inventory(settings)
    assert changed is not first
    assert changed.gpu(("rtx-2", 1)).utilization == pytest.approx(0.95)
    assert src["collected_at"] is not None


def test_ledger_from_an_airflow_connection(tmp_path, monkeypatch):
    from airflow_hetero_gpu.plugins import sources

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    _make_ledger(url)
    monkeypatch.setenv("AIRFLOW_CONN_GPU_LEDGER", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "ledger.db")}))
    res, evs, src = sources.read_ledger(sources.PageSettings(ledger_conn_id="gpu_ledger"))
    assert src["status"] == "ok" and src["conn_id"] == "gpu_ledger"
    assert [r.job_id for r in res] == ["retrain-42"] and [e.reasons for e in evs] == [("xid-79",)]
    res, evs, src = sources.read_ledger(sources.PageSettings(ledger_conn_id="no_such_connection"))
    assert src["status"] == "error" and "no_such_connection" in src["message"]
