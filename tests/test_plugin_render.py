"""The cluster page's model, topology SVG and HTML, rendered without Airflow."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_hetero_gpu.core.cluster import build_cluster
from airflow_hetero_gpu.core.inventory import load_cluster
from airflow_hetero_gpu.core.model import Gpu
from airflow_hetero_gpu.core.topology import HostWiring, NetworkTiers
from airflow_hetero_gpu.ledger.records import Eviction, Reservation, ReservedGpu, TaskIdentity
from airflow_hetero_gpu.plugins import labels, model, render
from airflow_hetero_gpu.plugins import topology_svg as topo

SAMPLE = Path(__file__).resolve().parents[1] / "airflow_hetero_gpu" / "samples" / "cluster"
NS = "{http://www.w3.org/2000/svg}"
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)


def reservation(job_id, gpus, *, dag_id="train_llm", run_id="manual__2025-06-01T11:00:00+00:00",
                task_id="train", try_number=2, map_index=None, pool="finetune+llm-pretrain@NVIDIA A100-SXM4-80GB"):
    ident = None if dag_id is None else TaskIdentity(dag_id, run_id, task_id, try_number, map_index)
    return Reservation(
        job_id=job_id, pool=pool,
        gpus=tuple(ReservedGpu(h, i, None, slot) for slot, (h, i) in enumerate(gpus)),
        score={"total": 0.8}, created_at=NOW - timedelta(minutes=30), renewed_at=NOW - timedelta(minutes=1),
        expires_at=NOW + timedelta(minutes=4), gpu_count=len(gpus), identity=ident,
    )


def eviction(host, index, reasons):
    return Eviction(host, index, None, tuple(reasons), NOW - timedelta(hours=2), NOW - timedelta(minutes=5), 1)


@pytest.fixture(scope="module")
def sample():
    return load_cluster(SAMPLE)


@pytest.fixture(scope="module")
def ledger_state():
    return (
        [reservation("retrain-42", [("a100-1", 3), ("a100-1", 4)])],
        [eviction("v100", 5, ["xid-79"])],
    )


def svg_of(cluster, reservations=(), evictions=()):
    statuses = model.gpu_statuses(
        cluster, {g.key: r.job_id for r in reservations for g in r.gpus}, {e.key: e.reasons for e in evictions}
    )
    text = topo.topology_svg(cluster.graph, statuses)
    return text, ET.fromstring(text)


def groups(root, cls):
    return [g for g in root.iter(f"{NS}g") if cls in (g.get("class") or "").split()]


def lines(root, cls):
    return [e for e in root.iter(f"{NS}line") if cls in (e.get("class") or "").split()]


# --- link classes ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "label, kind",
    [("NV12", "nvlink"), ("NV1", "nvlink"), ("nv4", "nvlink"), ("PIX", "pcie-switch"), ("PXB", "pcie-switch"),
     ("PHB", "pcie-host-bridge"), ("NODE", "cpu"), ("SYS", "cpu"), ("SOC", "cpu"), ("", "cpu")],
)
def test_link_kind(label, kind):
    assert topo.link_kind(label) == kind


@pytest.mark.parametrize("label, bonds", [("NV1", 1), ("NV12", 12), ("NV18", 18), ("NV", 1)])
def test_nvlink_bonds(label, bonds):
    assert topo.nvlink_bonds(label) == bonds


# --- the SVG -------------------------------------------------------------------------------------
def test_svg_has_every_host_gpu_and_switch(sample, ledger_state):
    _, root = svg_of(sample, *ledger_state)
    hosts = {g.get("data-host") for g in groups(root, "hg-host")}
    assert hosts == {"a100-1", "a100-2", "rtx-1", "rtx-2", "v100"}
    drawn = {g.get("data-gpu") for g in groups(root, "hg-gpu") if g.get("data-gpu")}
    assert drawn == {f"{g.host}:{g.index}" for g in sample.gpus}
    assert len(drawn) == 32
    # every GPU sits inside its host's group
    for host in groups(root, "hg-host"):
        inside = {g.get("data-gpu") for g in groups(host, "hg-gpu")}
        assert inside == {f"{host.get('data-host')}:{i}" for g in sample.gpus if g.host == host.get("data-host")
                          for i in [g.index]}
    switches = {(g.get("data-switch"), g.get("data-tier")) for g in groups(root, "hg-switch")}
    assert switches == {("leaf1", "1"), ("leaf2", "1"), ("leaf3", "1"), ("spine", "2")}


def test_switch_tiers_sit_above_hosts(sample):
    _, root = svg_of(sample)
    ys = {}
    for g in groups(root, "hg-switch"):
        ys[g.get("data-switch")] = float(g.find(f"{NS}rect").get("y"))
    host_top = min(float(g.find(f"{NS}rect").get("y")) for g in groups(root, "hg-host"))
    assert ys["spine"] < ys["leaf1"] == ys["leaf2"] == ys["leaf3"] < host_top
    uplinks = {(e.get("data-from"), e.get("data-to")) for e in lines(root, "hg-uplink")}
    assert {("a100-1", "leaf1"), ("v100", "leaf1"), ("a100-2", "leaf2"), ("rtx-1", "leaf2"), ("rtx-2", "leaf3"),
            ("leaf1", "spine"), ("leaf2", "spine"), ("leaf3", "spine")} == uplinks


def test_hosts_under_one_switch_are_neighbours(sample):
    _, root = svg_of(sample)
    order = [g.get("data-host") for g in sorted(groups(root, "hg-host"),
                                                key=lambda g: float(g.find(f"{NS}rect").get("x")))]
    assert order == ["a100-1", "v100", "a100-2", "rtx-1", "rtx-2"]


def test_nvlink_and_pcie_links_are_styled_apart(sample):
    _, root = svg_of(sample)
    nv = lines(root, "hg-nvlink")
    pcie = lines(root, "hg-pcie-host-bridge")
    # a100: NV12 all-to-all (28 pairs each); v100: the DGX-1 hybrid cube mesh (16 NVLink pairs)
    per_host = {}
    for host in groups(root, "hg-host"):
        per_host[host.get("data-host")] = (len(lines(host, "hg-nvlink")), len(lines(host, "hg-pcie-host-bridge")))
    assert per_host == {"a100-1": (28, 0), "a100-2": (28, 0), "v100": (16, 0), "rtx-1": (0, 2), "rtx-2": (0, 2)}
    assert (len(nv), len(pcie)) == (72 + 1, 4 + 1)  # the legend draws one sample of each too
    # NVLink width grows with the bond count; PCIe has no explicit width but a dash pattern in the style
    width = {e.get("data-link"): float(e.get("stroke-width")) for e in nv if e.get("data-link")}
    assert width["NV12"] > width["NV2"] > width["NV1"]
    assert all(e.get("stroke-width") is None for e in pcie)
    style = root.find(f"{NS}style").text
    assert ".hg-link.hg-pcie-host-bridge{" in style and "stroke-dasharray" in style.split(".hg-link.hg-pcie-host-bridge{")[1].split("}")[0]
    assert "stroke-dasharray" not in style.split(".hg-link.hg-nvlink{")[1].split("}")[0]
    # SYS pairs (CPU interconnect) are not drawn
    assert not [e for e in root.iter(f"{NS}line") if e.get("data-link") == "SYS"]


def test_unhealthy_and_evicted_gpus_are_marked(sample, ledger_state):
    _, root = svg_of(sample, *ledger_state)
    sick = {g.get("data-gpu"): g for g in groups(root, "hg-state-unhealthy") if g.get("data-gpu")}
    assert set(sick) == {"a100-2:6"}
    texts = [t.text for t in sick["a100-2:6"].iter(f"{NS}text")]
    assert "ecc" in texts and "\u2715" in texts
    assert "unhealthy: ecc" in sick["a100-2:6"].find(f"{NS}title").text
    out = {g.get("data-gpu"): g for g in groups(root, "hg-state-evicted") if g.get("data-gpu")}
    assert set(out) == {"v100:5"}
    assert "xid-79" in [t.text for t in out["v100:5"].iter(f"{NS}text")]


def test_reserved_gpus_are_labelled_with_the_job(sample, ledger_state):
    _, root = svg_of(sample, *ledger_state)
    held = {g.get("data-gpu"): g for g in groups(root, "hg-state-reserved") if g.get("data-gpu")}
    assert set(held) == {"a100-1:3", "a100-1:4"}
    for g in held.values():
        assert g.get("data-job") == "retrain-42"
        assert "retrain-42" in [t.text for t in g.iter(f"{NS}text")]
        assert "reserved by retrain-42" in g.find(f"{NS}title").text
        # the label is the utilization nvidia-smi reported (0 % on these idle GPUs), not the
        # planner's load, which counts a reserved GPU as fully loaded
        assert g.find(f"{NS}text").text == f"GPU{g.get('data-gpu').split(':')[1]} 0%"
        assert g.get("data-util") == "0" and g.get("data-load") == "1"
        assert "utilization 0%" in g.find(f"{NS}title").text and "planner load 100%" in g.find(f"{NS}title").text


def test_busy_gpus_and_load(sample):
    _, root = svg_of(sample)
    busy = {g.get("data-gpu") for g in groups(root, "hg-state-busy") if g.get("data-gpu")}
    assert busy == {"a100-1:0", "a100-1:1", "a100-1:2", "v100:4"}  # loads 97, 97, 35, 60 %


def test_a_sick_reserved_gpu_shows_sick_and_keeps_its_job_label():
    gpus = [Gpu("h", 0, "u0", "X", 100, 0, 0.0), Gpu("h", 1, "u1", "X", 100, 0, 0.0, healthy=False, reasons=("ecc",))]
    cluster = build_cluster(gpus, {"h": HostWiring.from_links([0, 1], {(0, 1): "PIX"})})
    _, root = svg_of(cluster, [reservation("j1", [("h", 0), ("h", 1)])])
    g1 = next(g for g in groups(root, "hg-gpu") if g.get("data-gpu") == "h:1")
    assert g1.get("data-state") == "unhealthy" and g1.get("data-job") == "j1"
    assert len(lines(next(iter(groups(root, "hg-host"))), "hg-pcie-switch")) == 1
    assert [s.get("data-switch") for s in groups(root, "hg-switch")] == ["(all hosts)"]


def test_unreachable_host_and_single_gpu_host():
    gpus = [Gpu("solo", 0, "u0", "NVIDIA L4", 100, 0, 0.0)]
    cluster = build_cluster(gpus, {"solo": HostWiring.from_links([0], {})},
                            NetworkTiers.from_groups([("leafA", 1, ["solo", "dead"])]),
                            host_errors={"dead": "ssh: connection refused"})
    _, root = svg_of(cluster)
    hosts = {g.get("data-host"): g for g in groups(root, "hg-host")}
    assert set(hosts) == {"solo", "dead"}
    assert "hg-host-error" in hosts["dead"].get("class")
    assert any("connection refused" in (t.text or "") for t in hosts["dead"].iter(f"{NS}text"))
    assert not groups(hosts["dead"], "hg-gpu")


def test_text_is_escaped_in_svg_and_html(sample):
    evil = '<img src=x onerror="alert(1)">&'
    res = [reservation(evil, [("rtx-1", 0)], dag_id=evil, run_id="r<1>", task_id="t")]
    text, root = svg_of(sample, res)  # parses, so nothing broke the XML
    assert "<img" not in text
    held = next(g for g in groups(root, "hg-gpu") if g.get("data-gpu") == "rtx-1:0")
    assert held.get("data-job") == evil
    html = render.render_page(model.build(sample, res, now=NOW))
    assert "<img" not in html and "&lt;img src=x" in html


def test_svg_is_a_valid_standalone_document(sample, tmp_path):
    text, root = svg_of(sample)
    assert root.tag == f"{NS}svg" and root.get("viewBox")
    width, height = float(root.get("width")), float(root.get("height"))
    for rect in root.iter(f"{NS}rect"):
        assert float(rect.get("x")) + float(rect.get("width")) <= width + 0.5
        assert float(rect.get("y")) + float(rect.get("height")) <= height + 0.5


def test_highlight_rings_the_decisions_gpus_and_the_links_between_them(sample):
    from airflow_hetero_gpu.core.model import PlanRequest
    from airflow_hetero_gpu.core.planner import plan

    decision = plan(sample, PlanRequest(4)).decision  # docs/algorithm.md: v100 GPU 0-3
    keys = [(g.host, g.index) for g in decision.gpus]
    assert keys == [("v100", 0), ("v100", 1), ("v100", 2), ("v100", 3)]
    statuses = model.gpu_statuses(sample)
    plain = topo.topology_svg(sample.graph, statuses)
    text = topo.topology_svg(sample.graph, statuses, highlight=keys, highlight_label="decision: v100 GPU 0-3")
    root = ET.fromstring(text)
    chosen = {g.get("data-gpu") for g in groups(root, "hg-chosen")}
    assert chosen == {"v100:0", "v100:1", "v100:2", "v100:3"}
    for g in groups(root, "hg-gpu"):
        if not g.get("data-gpu"):
            continue  # the legend's swatches
        rings = [r for r in g.iter(f"{NS}rect") if r.get("class") == "hg-chosen-ring"]
        assert len(rings) == (1 if g.get("data-gpu") in chosen else 0), g.get("data-gpu")
        assert (g.get("data-chosen") == "true") == (g.get("data-gpu") in chosen)
    # the six pairs of GPU 0-3 are NVLinked on the DGX-1 mesh: all six recoloured, nothing else
    marked = [e for e in lines(root, "hg-chosen-link") if e.get("data-link")]
    assert sorted((e.get("data-a"), e.get("data-b")) for e in marked) == [
        ("0", "1"), ("0", "2"), ("0", "3"), ("1", "2"), ("1", "3"), ("2", "3")]
    v100 = next(h for h in groups(root, "hg-host") if h.get("data-host") == "v100")
    inside = list(v100.iter())
    assert all("hg-nvlink" in e.get("class") and e in inside for e in marked)
    # a legend row names it; everything below the legend moves down by that row
    assert "decision: v100 GPU 0-3" in [t.text for t in groups(root, "hg-legend")[0].iter(f"{NS}text")]
    plain_root = ET.fromstring(plain)
    assert float(root.get("height")) == float(plain_root.get("height")) + topo.LEGEND_ROW

    def tops(r):
        return {g.get("data-host"): float(g.find(f"{NS}rect").get("y")) for g in groups(r, "hg-host")}

    assert {h: y + topo.LEGEND_ROW for h, y in tops(plain_root).items()} == tops(root)
    # without highlight the picture is unchanged; keys that are not in the graph are ignored
    assert topo.topology_svg(sample.graph, statuses, highlight=None) == plain
    plain_root_classes = " ".join(e.get("class") or "" for e in plain_root.iter())
    assert "hg-chosen" not in plain_root_classes and "data-chosen" not in plain
    unknown = ET.fromstring(topo.topology_svg(sample.graph, statuses, highlight=[("no-such-host", 0)]))
    assert not groups(unknown, "hg-chosen")


# --- the facts (the JSON endpoint) ---------------------------------------------------------------
def test_facts_pools_with_stage_counts(sample, ledger_state):
    facts = model.build(sample, *ledger_state, now=NOW).to_json()
    json.dumps(facts)  # JSON-ready
    pools = {p["pool"]: p for p in facts["pools"]}
    a100 = pools["finetune+llm-pretrain@NVIDIA A100-SXM4-80GB"]
    assert (a100["gpus"], a100["healthy"], a100["available"], a100["reserved"], a100["evicted"]) == (16, 15, 10, 2, 0)
    v100 = pools["Tesla V100-SXM2-32GB"]
    assert (v100["gpus"], v100["healthy"], v100["available"], v100["reserved"], v100["evicted"]) == (8, 7, 6, 0, 1)
    rtx = pools["cv+finetune@NVIDIA GeForce RTX 4090"]
    assert (rtx["gpus"], rtx["healthy"], rtx["available"], rtx["reserved"], rtx["evicted"]) == (8, 8, 8, 0, 0)
    assert rtx["hosts"] == ["rtx-1", "rtx-2"]


def test_facts_gpus_hosts_switches(sample, ledger_state):
    facts = model.build(sample, *ledger_state, now=NOW).to_json()
    gpus = {(g["host"], g["index"]): g for g in facts["gpus"]}
    assert len(gpus) == 32
    assert gpus[("a100-1", 3)]["reserved_by"] == "retrain-42" and gpus[("a100-1", 3)]["state"] == "reserved"
    assert gpus[("a100-1", 3)]["load"] == 1.0
    assert gpus[("a100-2", 6)]["reasons"] == ["ecc"] and gpus[("a100-2", 6)]["state"] == "unhealthy"
    assert gpus[("v100", 5)]["evicted"] == ["xid-79"] and not gpus[("v100", 5)]["available"]
    assert gpus[("a100-1", 0)]["load"] == pytest.approx(0.97)
    hosts = {h["host"]: h for h in facts["hosts"]}
    assert hosts["v100"]["switches"] == ["leaf1", "spine"]
    assert len(hosts["a100-1"]["links"]) == 28 and {l["link"] for l in hosts["a100-1"]["links"]} == {"NV12"}
    sw = {s["switch"]: s for s in facts["switches"]}
    assert sw["leaf2"] == {"switch": "leaf2", "tier": 1, "parent": "spine", "hosts": ["a100-2", "rtx-1"]}
    assert sw["spine"]["parent"] is None
    assert facts["thresholds"]["busy_utilization"] == pytest.approx(0.10)


def test_reservation_links_to_its_dag_run(sample, ledger_state):
    facts = model.build(sample, *ledger_state, now=NOW).to_json()
    (r,) = facts["reservations"]
    assert r["identity"]["dag_id"] == "train_llm" and r["identity"]["try_number"] == 2
    assert r["run_path"] == "/dags/train_llm/runs/manual__2025-06-01T11%3A00%3A00%2B00%3A00"
    assert r["task_path"] == r["run_path"] + "/tasks/train"
    mapped = model.reservation_facts(reservation("j", [("h", 0)], map_index=3))
    assert mapped["task_path"].endswith("/tasks/train/mapped/3")
    (e,) = facts["evictions"]
    assert e["reasons"] == ["xid-79"] and e["evicted_at"].startswith("2025-06-01T10:00")


def test_reservation_of_an_unreadable_dag_hides_its_run(sample):
    res = [reservation("a", [("rtx-1", 0)], dag_id="secret_dag"), reservation("b", [("rtx-1", 1)], dag_id="open_dag"),
           reservation("c", [("rtx-1", 2)], dag_id=None)]
    m = model.build(sample, res, visible_dag_ids={"open_dag"}, now=NOW)
    facts = m.to_json()
    by_job = {r["job_id"]: r for r in facts["reservations"]}
    assert by_job["a"]["identity"] is None and by_job["a"]["identity_hidden"] and by_job["a"]["run_path"] is None
    assert by_job["a"]["gpus"] == [{"host": "rtx-1", "index": 0, "uuid": None}]
    assert by_job["b"]["identity"]["dag_id"] == "open_dag" and not by_job["b"]["identity_hidden"]
    assert by_job["c"]["identity"] is None and not by_job["c"]["identity_hidden"]
    html = render.render_page(m)
    assert "secret_dag" not in html and "hidden (no access to the DAG)" in html and "open_dag" in html


def test_queue_entry_of_an_unreadable_dag_hides_its_dag_run_task_and_try(sample, monkeypatch):
    """A waiting job of a DAG the viewer may not read keeps its place, job id and request, but not
    its DAG, run, task and try, in the JSON and the page alike (as a reservation's)."""
    from airflow_hetero_gpu.plugins import sources

    def entry(job, pos, dag_id):
        ident = {"dag_id": dag_id, "run_id": f"manual__{job}", "task_id": f"task_{job}", "map_index": None,
                 "try_number": 3}
        return model.QueueEntry(job, pos, 0, NOW - timedelta(minutes=5), "waits for 2 GPUs", {"gpus": 2}, ident,
                                "waiting")

    queue = [entry("qa", 1, "secret_dag"), entry("qb", 2, "open_dag")]
    res = [reservation("r", [("rtx-1", 0)], dag_id="secret_dag")]

    class Manager:  # the auth manager: this viewer may read open_dag only
        asked: set = set()

        def filter_authorized_dag_ids(self, *, dag_ids, user):
            Manager.asked = set(dag_ids)
            return {d for d in dag_ids if d == "open_dag"}

    import airflow.api_fastapi.app as api_app

    monkeypatch.setattr(api_app, "get_auth_manager", lambda: Manager())
    visible = sources.visible_dags(res, "viewer", queue)
    assert visible == {"open_dag"} and Manager.asked == {"secret_dag", "open_dag"}
    facts = model.build(sample, res, queue=queue, visible_dag_ids=visible, now=NOW).to_json()
    by_job = {q["job_id"]: q for q in facts["queue"]}
    assert by_job["qa"]["identity"] is None and by_job["qa"]["identity_hidden"]
    assert (by_job["qa"]["position"], by_job["qa"]["request"]) == (1, {"gpus": 2})
    assert by_job["qb"]["identity"]["dag_id"] == "open_dag" and not by_job["qb"]["identity_hidden"]
    text = json.dumps(facts)
    assert "secret_dag" not in text and "manual__qa" not in text and "task_qa" not in text
    html = render.render_page(model.build(sample, res, queue=queue, visible_dag_ids=visible, now=NOW))
    assert "secret_dag" not in html and "task_qa" not in html and "manual__qa" not in html
    # a viewer who may read both sees both
    assert model.build(sample, res, queue=queue, visible_dag_ids=None, now=NOW).to_json()["queue"][0][
        "identity"]["dag_id"] == "secret_dag"


def test_facts_without_inventory():
    m = model.build(None, [reservation("j", [("gone", 0)])], [eviction("gone", 1, ["lost"])],
                    sources={"captures": {"status": "missing", "message": "No inventory yet"}}, now=NOW)
    facts = m.to_json()
    assert facts["pools"] == facts["gpus"] == facts["hosts"] == []
    assert [r["job_id"] for r in facts["reservations"]] == ["j"]
    html = render.render_page(m)
    assert "No inventory yet" in html and "No inventory to draw" in html and "lost" in html


# --- the page ---------------------------------------------------------------------------------------
def test_page_has_every_section(sample, ledger_state):
    reservations, evictions = ledger_state
    m = model.build(
        sample, reservations, evictions, now=NOW,
        sources={"captures": {"path": "/data/caps", "status": "ok", "collected_at": (NOW - timedelta(minutes=3)).isoformat()},
                 "ledger": {"url": "sqlite:////x/ledger.db", "status": "ok"}},
    )
    html = render.render_page(m, ui_base="/airflow", refresh_seconds=30, api_path="/airflow/hetero-gpu/api/cluster")
    for needle in ("finetune+llm-pretrain@NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB", "<svg", "retrain-42",
                   "train_llm", "xid-79", "ecc", "/data/caps", "3m00s ago", 'content="30"',
                   'href="/airflow/hetero-gpu/api/cluster"', 'id="pools"', 'id="topology"', 'id="reservations"',
                   'id="evictions"', 'id="gpus"', "32 GPUs in 3 pools"):
        assert needle in html, needle
    assert ('<a target="_top" data-ui-link href="/airflow/dags/train_llm/runs/manual__2025-06-01T11%3A00%3A00%2B00%3A00">'
            in html)
    # one row per GPU in the GPU table
    assert html.split('class="hg-gpus"')[1].count("<tr>") == 1 + 32
    assert "http-equiv" not in render.render_page(m, refresh_seconds=0)


@pytest.mark.parametrize(
    "seconds, text",
    [(-30, "30s ago"), (-600, "10m00s ago"), (-7200 * 3 - 65, "6h01m ago"), (-86400 * 3, "3d00h ago"), (240, "in 4m00s")],
)
def test_ago(seconds, text):
    assert labels.ago((NOW + timedelta(seconds=seconds)).isoformat(), NOW) == text


def test_the_page_and_the_queue_print_durations_alike():
    from airflow_hetero_gpu import durations
    from airflow_hetero_gpu.cli import ledger as ledger_cli

    for seconds in (0, 59, 185, 3600 * 5 + 61, 86400 * 2 + 3600 * 4):
        assert labels.duration(seconds) == durations.duration(seconds) == ledger_cli.duration(seconds)
    assert durations.duration(185) == "3m05s"
    assert [durations.parse_duration(t) for t in ("90", "90s", "30m", "2h", "1d", "1h30m")] == \
        [90, 90, 1800, 7200, 86400, 5400]
    for bad in ("", "0", "-5m", "soon", "5 m", "5mm", "nan"):
        with pytest.raises(ValueError, match="expected a positive duration"):
            durations.parse_duration(bad)


def test_the_reservation_column_names_whole_gpus_without_mig(sample):
    res = [reservation("whole", [("a100-1", 0), ("a100-1", 1)])]
    html = render.render_page(model.build(sample, res, now=NOW))
    assert "a100-1:0,1" in html and "MIG" not in html.split('id="reservations"')[1].split("</table>")[0]
