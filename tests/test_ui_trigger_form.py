"""``hetero_gpu_train_ui``'s trigger form in a real browser: a user opens the DAG in the Airflow UI,
opens the trigger form, submits it with its defaults, and a run starts with those values.

The api-server serves the repository's ``dags/`` (serialized with ``airflow dags reserialize``);
no scheduler runs, so the run stays queued: what is checked is that the form accepted its
defaults and Airflow created the run with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from browser_fixtures import ApiServer, browser, login  # noqa: F401  (browser: a fixture)

DAGS = Path(__file__).resolve().parents[1] / "dags"
DAG_ID = "hetero_gpu_train_ui"
DEFAULTS = {"gpu_type": "any", "gpu_count": 2, "task_type": "any", "epochs": 5}


@pytest.fixture(scope="module")
def api_server(tmp_path_factory):
    with ApiServer(tmp_path_factory.mktemp("airflow_home"), dags_folder=DAGS) as srv:
        yield srv


def _runs(api_server) -> list[dict]:
    with api_server.client("admin") as client:
        r = client.get(f"/api/v2/dags/{DAG_ID}/dagRuns")
        assert r.status_code == 200, r.text
        return r.json()["dag_runs"]


@pytest.mark.slow
def test_the_trigger_form_submitted_with_its_defaults_starts_a_run(api_server, browser):  # noqa: F811
    assert _runs(api_server) == []
    page = login(browser, api_server, "admin", f"/dags/{DAG_ID}")
    try:
        page.get_by_role("button", name="Trigger").first.click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_text("Run Parameters").wait_for()
        # what the user sees before touching anything: every field filled with its default
        assert dialog.get_by_text("Card type").is_visible()
        assert dialog.get_by_text("Training-task type").is_visible()
        submit = dialog.get_by_role("button", name="Trigger")
        assert submit.is_enabled()
        submit.click()
        page.wait_for_url(f"**/dags/{DAG_ID}/runs/**")
    finally:
        page.context.close()
    (run,) = _runs(api_server)
    assert run["conf"] == DEFAULTS
    assert run["state"] in ("queued", "running")


def test_the_defaults_mean_any_card_and_any_task_type():
    """What the operator receives for the form's defaults (and for a cleared task-type field)."""
    import jinja2

    source = (DAGS / f"{DAG_ID}.py").read_text()
    template = next(line.split('task_type="', 1)[1].rsplit('"', 1)[0] for line in source.splitlines()
                    if line.strip().startswith('task_type="'))
    render = jinja2.Template(template).render
    assert render(params={"task_type": "any"}) == ""
    assert render(params={"task_type": None}) == ""
    assert render(params={"task_type": "finetune"}) == "finetune"
