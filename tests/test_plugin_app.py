"""The GPU cluster page in a real Airflow api-server: auth, the page, the JSON, the nav entry.

One api-server (simple auth manager, users ``admin`` and ``viewer`` with known passwords) runs
for the module on a free loopback port, with a temporary AIRFLOW_HOME, the sample captures as
``[hetero_gpu] captures_dir`` and a SQLite ledger holding one reservation and one eviction.
The plugin comes from the ``airflow.plugins`` entry point when the package is installed with
one, else from a one-line module in the plugins folder.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from importlib.metadata import distributions
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "airflow_hetero_gpu" / "samples" / "cluster"
AIRFLOW = Path(sys.executable).with_name("airflow")
PASSWORDS = {"admin": "admin-pw-for-tests", "viewer": "viewer-pw-for-tests"}
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
    assert set(ours) <= {"airflow_hetero_gpu", "airflow_hetero_gpu.plugins", "airflow_hetero_gpu.plugins.cluster_page"}


def _installed_entry_point() -> bool:
    """Whether Airflow will load the plugin from an ``airflow.plugins`` entry point.

    Every distribution is looked at, as Airflow does (``importlib.metadata.entry_points`` keeps only
    the first distribution of a name, which may be a stale ``.egg-info`` beside the sources).
    """
    return any(
        ep.group == "airflow.plugins" and ep.value.startswith("airflow_hetero_gpu.")
        for dist in distributions() for ep in dist.entry_points
    )


def _installed_outside_sources() -> bool:
    """Whether an installed distribution (not the .egg-info in the source tree) provides the plugin."""
    for dist in distributions():
        if any(ep.group == "airflow.plugins" and ep.value.startswith("airflow_hetero_gpu.") for ep in dist.entry_points):
            where = Path(str(getattr(dist, "_path", ""))).resolve()
            if not (where.suffix == ".egg-info" and where.parent == ROOT):
                return True
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
def server(tmp_path_factory):
    if not AIRFLOW.exists():
        pytest.skip(f"the airflow command is not installed beside {sys.executable}")
    home = tmp_path_factory.mktemp("airflow_home")
    (home / "plugins").mkdir()
    if not _installed_entry_point():
        (home / "plugins" / "hetero_gpu_page.py").write_text(
            "from airflow_hetero_gpu.plugins.cluster_page import HeteroGpuPlugin  # noqa: F401\n"
        )
    (home / "passwords.json").write_text(json.dumps(PASSWORDS))
    ledger_url = f"sqlite:///{home / 'ledger.db'}"
    _make_ledger(ledger_url)
    port = _free_port()
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        # the sources only when the package is not installed: an editable install leaves an
        # .egg-info beside them, which Airflow would count as a second copy of the plugin
        "PYTHONPATH": os.pathsep.join(
            ([] if _installed_outside_sources() else [str(ROOT)]) + [os.environ.get("PYTHONPATH", "")]),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API_AUTH__JWT_SECRET": "page-test-secret-" + os.urandom(8).hex(),
        "AIRFLOW__HETERO_GPU__CAPTURES_DIR": str(SAMPLE),
        "AIRFLOW__HETERO_GPU__LEDGER_URL": ledger_url,
        "AIRFLOW__HETERO_GPU__REFRESH_SECONDS": "0",
    }
    env.pop("AIRFLOW__HETERO_GPU__LEDGER_CONN_ID", None)
    migrate = subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, capture_output=True, text=True, timeout=180)
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    log = open(home / "api-server.log", "w+")
    proc = subprocess.Popen(
        [str(AIRFLOW), "api-server", "--host", "127.0.0.1", "--port", str(port), "--apps", "core", "--workers", "1"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=home,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"api-server exited with {proc.returncode}:\n{log.read()[-4000:]}")
            try:
                if httpx.get(f"{base}/api/v2/monitor/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"api-server did not answer within 120 s:\n{log.read()[-4000:]}")
            time.sleep(0.5)
        with httpx.Client(base_url=base, timeout=60) as client:
            yield client
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def _token(client, user: str) -> str:
    r = client.post("/auth/token", json={"username": user, "password": PASSWORDS[user]})
    assert r.status_code == 201, r.text
    return r.json()["access_token"]


@pytest.fixture(scope="module")
def admin(server):
    return {"Authorization": f"Bearer {_token(server, 'admin')}"}


@pytest.fixture(scope="module")
def viewer(server):
    return {"Authorization": f"Bearer {_token(server, 'viewer')}"}


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


@pytest.mark.slow
def test_in_the_airflow_ui_a_run_link_opens_the_run(server, admin):
    """The nav entry shows the page in a sandboxed iframe that may not navigate the top window
    itself; the page's run links still open the run in the UI. Needs Playwright and Chromium."""
    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if Path(p).exists()), None)
    if chromium is None:
        pytest.skip("no Chromium at /usr/bin/chromium")
    base = str(server.base_url).rstrip("/")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            context = browser.new_context()
            context.add_cookies([{"name": "_token", "value": admin["Authorization"].split()[1], "url": base}])
            page = context.new_page()
            page.goto(f"{base}/plugin/hetero-gpu")
            frame = page.frame_locator("iframe")
            link = frame.locator("table.hg-reservations a[data-ui-link]").first
            link.wait_for(timeout=60000)
            link.click()
            page.wait_for_url("**/dags/train_llm/runs/**", timeout=30000)
            assert page.url.endswith("/dags/train_llm/runs/manual__2025-06-01T11%3A00%3A00%2B00%3A00")
        finally:
            browser.close()


# --- where the facts come from, without a server ------------------------------------------------
def test_missing_captures_and_ledger_are_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    from airflow_hetero_gpu.plugins import app, render

    cluster, src = app.read_inventory(app.PageSettings())  # no ledger yet, nothing created
    assert cluster is None and src["status"] == "missing" and "hetero_gpu_health_watch" in src["message"]
    assert not (tmp_path / "hetero_gpu_ledger.db").exists()
    cluster, src = app.read_inventory(app.PageSettings(captures_dir=str(tmp_path / "none")))
    assert cluster is None and src["status"] == "missing" and "does not exist" in src["message"]
    (tmp_path / "broken" / "hosts" / "h1").mkdir(parents=True)
    (tmp_path / "broken" / "hosts" / "h1" / "query.csv").write_text("index, name\n0, X\n")
    cluster, src = app.read_inventory(app.PageSettings(captures_dir=str(tmp_path / "broken")))
    assert cluster is None and src["status"] == "error" and "query.csv" in src["message"]

    # the default ledger file does not exist yet: reported, and not created by looking
    res, evs, src = app.read_ledger(app.PageSettings())
    assert (res, evs, src["status"]) == ([], [], "missing")
    assert "nothing has been reserved" in src["message"]
    assert not (tmp_path / "hetero_gpu_ledger.db").exists()
    res, evs, src = app.read_ledger(app.PageSettings(ledger_url="mysql://x/y"))
    assert src["status"] == "error" and "unsupported database" in src["message"]

    facts, cluster, _ = app.snapshot(None, app.PageSettings())
    html = render.render_page(facts, None)
    assert "hetero_gpu_health_watch DAG (it starts paused)" in html and "No ledger yet" in html


def test_inventory_is_reread_when_a_capture_changes(tmp_path):
    import shutil

    from airflow_hetero_gpu.plugins import app

    caps = tmp_path / "caps"
    shutil.copytree(SAMPLE, caps)
    settings = app.PageSettings(captures_dir=str(caps))
    first, _ = app.read_inventory(settings)
    again, _ = app.read_inventory(settings)
    assert again is first  # unchanged files: the parsed cluster is reused
    csv = caps / "hosts" / "rtx-2" / "query.csv"
    csv.write_text(csv.read_text().replace(", 5 %,", ", 95 %,"))
    os.utime(csv, ns=(time.time_ns() + 10**9,) * 2)
    changed, src = app.read_inventory(settings)
    assert changed is not first
    assert changed.gpu(("rtx-2", 1)).utilization == pytest.approx(0.95)
    assert src["collected_at"] is not None


def test_ledger_from_an_airflow_connection(tmp_path, monkeypatch):
    from airflow_hetero_gpu.plugins import app

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    _make_ledger(url)
    monkeypatch.setenv("AIRFLOW_CONN_GPU_LEDGER", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "ledger.db")}))
    res, evs, src = app.read_ledger(app.PageSettings(ledger_conn_id="gpu_ledger"))
    assert src["status"] == "ok" and src["conn_id"] == "gpu_ledger"
    assert [r.job_id for r in res] == ["retrain-42"] and [e.reasons for e in evs] == [("xid-79",)]
    res, evs, src = app.read_ledger(app.PageSettings(ledger_conn_id="no_such_connection"))
    assert src["status"] == "error" and "no_such_connection" in src["message"]
