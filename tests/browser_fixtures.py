"""A real Airflow api-server and a real browser for the UI tests. Import what a module needs::

    from browser_fixtures import ApiServer, browser, login  # noqa: F401  (browser: a fixture)

    @pytest.fixture(scope="module")
    def server(tmp_path_factory):
        with ApiServer(tmp_path_factory.mktemp("home"), env={...}) as srv:   # migrated, answering
            yield srv

    def test_x(server, browser):
        page = login(browser, server, "admin")     # a fresh context, logged in through the login form
        page.goto(server.url("/plugin/hetero-gpu"))

- :class:`ApiServer`: ``airflow api-server`` (the ``core`` app: UI and REST API) on a free loopback
  port with its own ``AIRFLOW_HOME`` and SQLite metadata database, Airflow's simple auth manager
  with the users of ``users`` (``admin`` an Admin, ``viewer`` a Viewer, known passwords), the
  ``hetero_gpu`` plugin loaded (from the ``airflow.plugins`` entry point of the installed
  package, else from a one-line module in the plugins folder), optionally a DAGs folder
  (serialized with ``airflow dags reserialize``, so the UI lists its DAGs without a
  dag-processor). :meth:`ApiServer.token` gives a bearer token, :meth:`ApiServer.client` an
  ``httpx.Client``.
- ``browser`` (module-scoped fixture): headless Debian Chromium (``/usr/bin/chromium``) driven by
  Playwright's sync API, with no browser download; one per test module, closed after it.
- :func:`login`: a new browser context (its own cookies), the login form filled in and sent, the
  Airflow UI loaded; returns the page.

Missing Chromium or Playwright skips with a reason that names them (a failure under ``CI=true``,
``ci_skips.py``); ``.ci/run`` installs Debian's ``chromium``, the test extra ``playwright``.
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
from typing import Any, Iterator, Mapping

import pytest

ROOT = Path(__file__).resolve().parents[1]
AIRFLOW = Path(sys.executable).with_name("airflow")
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
#: Headless Chromium on a machine without a GPU, a sandbox or a network beyond loopback; the
#: background-networking flags keep it from trying (and failing) to reach Google's hosts.
CHROMIUM_ARGS = (
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
)
USERS = {"admin": "admin", "viewer": "viewer"}  # user -> role of the simple auth manager
PASSWORDS = {"admin": "admin-pw-for-tests", "viewer": "viewer-pw-for-tests"}
TIMEOUT_MS = 60_000


def chromium_executable() -> str | None:
    return next((p for p in CHROMIUM_CANDIDATES if os.access(p, os.X_OK)), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plugin_entry_point_installed() -> bool:
    """Whether Airflow will load the plugin from an ``airflow.plugins`` entry point.

    Every distribution is looked at, as Airflow does (``importlib.metadata.entry_points`` keeps only
    the first distribution of a name, which may be a stale ``.egg-info`` beside the sources).
    """
    return any(
        ep.group == "airflow.plugins" and ep.value.startswith("airflow_hetero_gpu.")
        for dist in distributions() for ep in dist.entry_points
    )


def installed_outside_sources() -> bool:
    """Whether an installed distribution (not the .egg-info in the source tree) provides the plugin."""
    for dist in distributions():
        if any(ep.group == "airflow.plugins" and ep.value.startswith("airflow_hetero_gpu.") for ep in dist.entry_points):
            where = Path(str(getattr(dist, "_path", ""))).resolve()
            if not (where.suffix == ".egg-info" and where.parent == ROOT):
                return True
    return False


class ApiServer:
    """``airflow api-server`` for tests; a context manager (started and answering inside)."""

    def __init__(self, home: Path, env: Mapping[str, str] | None = None, *, dags_folder: Path | None = None,
                 users: Mapping[str, str] = USERS, passwords: Mapping[str, str] = PASSWORDS,
                 start_timeout: float = 180):
        if not AIRFLOW.exists():
            pytest.skip(f"the airflow command is not installed beside {sys.executable}")
        self.home = Path(home)
        self.passwords = dict(passwords)
        self.port = free_port()
        self.start_timeout = start_timeout
        self.dags_folder = Path(dags_folder) if dags_folder else None
        (self.home / "plugins").mkdir(parents=True, exist_ok=True)
        if not plugin_entry_point_installed():
            (self.home / "plugins" / "hetero_gpu_page.py").write_text(
                "from airflow_hetero_gpu.plugins.cluster_page import HeteroGpuPlugin  # noqa: F401\n")
        (self.home / "passwords.json").write_text(json.dumps(self.passwords))
        base = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
        pythonpath = ([] if installed_outside_sources() else [str(ROOT)])
        if self.dags_folder:
            pythonpath.append(str(self.dags_folder))
        self.env: dict[str, str] = {
            **base,
            "AIRFLOW_HOME": str(self.home),
            # the sources only when the package is not installed: an editable install leaves an
            # .egg-info beside them, which Airflow would count as a second copy of the plugin
            "PYTHONPATH": os.pathsep.join(pythonpath + [os.environ.get("PYTHONPATH", "")]),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(self.home / "plugins"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder or self.home / "dags"),
            "AIRFLOW__CORE__AUTH_MANAGER":
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in users.items()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            "AIRFLOW__API_AUTH__JWT_SECRET": "ui-test-secret-" + os.urandom(8).hex(),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        self.proc: subprocess.Popen | None = None
        self._log: Any = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "/") -> str:
        return self.base_url + (path if path.startswith("/") else "/" + path)

    def airflow(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run an ``airflow`` command in the server's environment (it must succeed)."""
        r = subprocess.run([str(AIRFLOW), *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                           cwd=self.home)
        assert r.returncode == 0, f"airflow {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}"
        return r

    def start(self) -> "ApiServer":
        import httpx

        self.airflow("db", "migrate")
        if self.dags_folder:
            self.airflow("dags", "reserialize")
        self._log = open(self.home / "api-server.log", "w+")
        self.proc = subprocess.Popen(
            [str(AIRFLOW), "api-server", "--host", "127.0.0.1", "--port", str(self.port), "--apps", "core",
             "--workers", "1"],
            env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.home)
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"api-server exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                if httpx.get(self.url("/api/v2/monitor/health"), timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"api-server did not answer within {self.start_timeout:g} s:\n{self.log()[-4000:]}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "ApiServer":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self) -> str:
        path = self.home / "api-server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def token(self, user: str) -> str:
        import httpx

        r = httpx.post(self.url("/auth/token"), json={"username": user, "password": self.passwords[user]},
                       timeout=60)
        assert r.status_code == 201, r.text
        return r.json()["access_token"]

    def client(self, user: str | None = None):
        """An ``httpx.Client`` on the server (with ``user``'s bearer token when given)."""
        import httpx

        headers = {"Authorization": f"Bearer {self.token(user)}"} if user else {}
        return httpx.Client(base_url=self.base_url, timeout=60, headers=headers)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (Debian's package) driven by Playwright, for one test module."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")
    executable = chromium_executable()
    if executable is None:
        pytest.skip(f"no Chromium at {' or '.join(CHROMIUM_CANDIDATES)} (apt-get install -y chromium)")
    with sync_api.sync_playwright() as pw:
        instance = pw.chromium.launch(executable_path=executable, headless=True, args=list(CHROMIUM_ARGS))
        try:
            yield instance
        finally:
            instance.close()


def login(browser: Any, server: ApiServer, user: str, path: str = "/") -> Any:
    """A new browser context logged in as ``user`` through the login form; returns the page
    showing ``path`` (the Airflow UI's home by default)."""
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    page.goto(server.url(path))
    page.wait_for_url("**/auth/login**")
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(server.passwords[user])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/login" not in url)
    return page


def table_rows(table: Any) -> list[dict[str, str]]:
    """The rows of an HTML table as a user reads them: ``{column header: cell text}`` per row
    (``table`` is a Playwright locator of one ``<table>``)."""
    return table.evaluate(
        """t => {
            const heads = [...t.querySelectorAll('thead th')].map(th => th.innerText.trim());
            return [...t.querySelectorAll('tbody tr')].map(tr => Object.fromEntries(
                [...tr.children].map((td, i) => [heads[i] ?? String(i), td.innerText.trim()])));
        }""")
