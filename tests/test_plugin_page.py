"""The cluster page's parts without a server: job labels, filters and sorting, the fleet overview,
the summary against the pools table, the queue, the security policy, and history and job views
read from a real ledger (SQLite) after a sequence of health checks."""

from __future__ import annotations

import base64
import json
import hashlib
import re
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_hetero_gpu.core import watch
from airflow_hetero_gpu.core.cluster import build_cluster
from airflow_hetero_gpu.core.config import ClusterConfig
from airflow_hetero_gpu.core.inventory import load_cluster
from airflow_hetero_gpu.core.model import Gpu, PlanRequest
from airflow_hetero_gpu.core.topology import HostWiring, NetworkTiers
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.ledger.inventory import HostRecord
from airflow_hetero_gpu.ledger.records import Eviction, Reservation, ReservedGpu, TaskIdentity
from airflow_hetero_gpu.plugins import charts, labels, model, overview, render, security, sources, tables
from airflow_hetero_gpu.testing.captures import host_files
from airflow_hetero_gpu.testing.demo import small_hosts
from ledger_clock import Clock

SAMPLE = Path(__file__).resolve().parents[1] / "airflow_hetero_gpu" / "samples" / "cluster"
NS = "{http://www.w3.org/2000/svg}"
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)


def reservation(job_id, gpus, *, dag_id="train_llm", try_number=1, pool="finetune+llm-pretrain@NVIDIA A100-SXM4-80GB"):
    return Reservation(
        job_id=job_id, pool=pool, gpus=tuple(ReservedGpu(h, i, None, s) for s, (h, i) in enumerate(gpus)),
        score={"total": 0.5}, created_at=NOW - timedelta(minutes=30), renewed_at=NOW - timedelta(minutes=1),
        expires_at=NOW + timedelta(minutes=4), gpu_count=len(gpus),
        identity=TaskIdentity(dag_id, "manual__2025-06-01T11:00:00+00:00", "train", try_number, None))


@pytest.fixture(scope="module")
def sample():
    return load_cluster(SAMPLE)


@pytest.fixture(scope="module")
def page(sample):
    res = [reservation("retrain-42", [("a100-1", 3), ("a100-1", 4)])]
    ev = [Eviction("v100", 5, None, ("xid-79",), NOW - timedelta(hours=2), NOW, 1),
          Eviction("a100-2", 6, None, ("ecc",), NOW - timedelta(hours=1), NOW, 0)]  # also unhealthy
    return model.build(sample, res, ev, now=NOW)


# --- job labels ------------------------------------------------------------------------------------
@pytest.mark.parametrize("ids, expected", [
    (["retrain-42"], {"retrain-42": "retrain-42"}),
    # default_job_id's <dag>.<task>.<hash>: the same dag and task, so the hash tells them apart
    (["hetero_gpu_retrain.train.1a2b3c4d5e6f", "hetero_gpu_retrain.train.9f8e7d6c5b4a"],
     {"hetero_gpu_retrain.train.1a2b3c4d5e6f": "1a2b3c\u20265e6f",
      "hetero_gpu_retrain.train.9f8e7d6c5b4a": "9f8e7d\u20265b4a"}),
    (["retrain-2025-06-01-a", "retrain-2025-06-01-b", "retrain-2025-06-02-a"],
     {"retrain-2025-06-01-a": "01-a", "retrain-2025-06-01-b": "01-b", "retrain-2025-06-02-a": "02-a"}),
    (["job-1", "job-10", "job-100"], {"job-1": "1", "job-10": "10", "job-100": "100"}),
    # a long single id is cut in the middle, not at its end
    (["hetero_gpu_retrain.train.1a2b3c4d5e6f"], {"hetero_gpu_retrain.train.1a2b3c4d5e6f": "hetero\u20265e6f"}),
])
def test_job_labels_tell_jobs_apart(ids, expected):
    got = labels.job_labels(ids)
    assert got == expected
    assert len(set(got.values())) == len(ids) and all(len(v) <= 11 for v in got.values())


def test_reserved_gpus_carry_distinct_labels_in_the_picture(sample):
    res = [reservation("hetero_gpu_retrain.train.1a2b3c4d5e6f", [("a100-1", 3)]),
           reservation("hetero_gpu_retrain.train.9f8e7d6c5b4a", [("a100-1", 4)])]
    m = model.build(sample, res, now=NOW)
    from airflow_hetero_gpu.plugins.topology_svg import topology_svg

    root = ET.fromstring(topology_svg(sample.graph, m.statuses))
    shown = {g.get("data-gpu"): [t.text for t in g.iter(f"{NS}text") if "hg-gpu-job" in (t.get("class") or "")]
             for g in root.iter(f"{NS}g") if g.get("data-job")}
    assert shown == {"a100-1:3": ["1a2b3c\u20265e6f"], "a100-1:4": ["9f8e7d\u20265b4a"]}


# --- the summary, the pools table and the state filter agree ------------------------------------------
def test_summary_states_the_pools_tables_totals(page):
    html = render.render_page(page)
    t = page.totals
    assert (t["gpus"], t["healthy"], t["evicted"], t["unhealthy"], t["reserved"]) == (32, 30, 2, 1, 2)
    summary = re.search(r'<p class="hg-summary">(.*?)</p>', html, re.S).group(1)
    assert (f"32 GPUs in 3 pools: {t['healthy']} healthy, {t['available']} available,\n{t['busy']} busy, "
            f"{t['drained']} drained, {t['reserved']} reserved, {t['evicted']} evicted, {t['unhealthy']} unhealthy") in summary
    foot = re.search(r"<tfoot>(.*?)</tfoot>", html, re.S).group(1)
    cells = re.findall(r'<td class="hg-n">(\d+)</td>', foot)
    assert cells == [str(t[k]) for k in ("gpus", "healthy", "available", "reserved", "evicted", "unhealthy")]
    # the evicted GPU that is also unhealthy is counted under both, as each pool row does
    assert sum(p.evicted for p in page.pools) == 2 and sum(p.unhealthy for p in page.pools) == 1


@pytest.mark.parametrize("state", ["available", "busy", "reserved", "evicted", "unhealthy"])
def test_the_state_filter_matches_the_pools_count(page, state):
    view = tables.gpu_table(page, tables.Query(state=state))
    assert view.total == page.totals[state]
    assert view.total > 0


# --- filters, sorting, pages ------------------------------------------------------------------------
def test_query_parameters_are_checked_and_bad_ones_reported():
    q = tables.Query.parse({"state": "broken", "sort": "-nope", "page": "x", "group": "racks", "host": "a" * 300})
    assert (q.state, q.sort, q.page, q.group, q.host) == ("", "host", 1, "network", "")
    assert len(q.problems) == 5 and any("state='broken'" in p for p in q.problems)
    q = tables.Query.parse({"state": "Reserved", "sort": "-temp", "rsort": "created", "page": "2", "group": "pool"})
    assert (q.state, q.sort, q.desc, q.rsort, q.rdesc, q.page, q.group, q.problems) == (
        "reserved", "temp", True, "created", False, 2, "pool", ())
    assert q.link(state="") == "?sort=-temp&rsort=created&group=pool"  # a filter change: back to page 1


def test_filters_and_sorting_of_the_gpus_table(page):
    rows = tables.gpu_table(page, tables.Query(host="A100-", job="")).rows
    assert {r["host"] for r in rows} == {"a100-1", "a100-2"} and len(rows) == 16
    rows = tables.gpu_table(page, tables.Query(job="RETRAIN")).rows
    assert [(r["host"], r["index"]) for r in rows] == [("a100-1", 3), ("a100-1", 4)]
    pool = "cv+finetune@NVIDIA GeForce RTX 4090"
    assert {r["pool"] for r in tables.gpu_table(page, tables.Query(pool=pool)).rows} == {pool}
    utils = [r["utilization"] for r in tables.gpu_table(page, tables.Query(sort="util", desc=True)).rows]
    assert utils == sorted(utils, reverse=True) and utils[0] == pytest.approx(0.97)


def test_pages_of_a_large_table():
    gpus = [Gpu(f"h{h:03d}", i, f"u{h}-{i}", "X", 100, 0, 0.0) for h in range(30) for i in range(8)]
    cluster = build_cluster(gpus, {f"h{h:03d}": HostWiring.from_links(range(8), {}) for h in range(30)})
    m = model.build(cluster, now=NOW)
    first = tables.gpu_table(m, tables.Query())
    assert (first.total, first.pages, len(first.rows), first.first, first.last) == (240, 3, 100, 1, 100)
    last = tables.gpu_table(m, tables.Query(page=9))  # past the end: the last page
    assert (last.page, len(last.rows), last.first, last.last) == (3, 40, 201, 240)
    html = render.render_page(m, tables.Query(page=2))
    assert 'href="?page=3#gpus"' in html and 'href="?page=1#gpus"' not in html and 'href="?#gpus"' in html


def test_reservations_sorted_by_lease_and_filtered_by_host(sample):
    res = [reservation("late", [("rtx-1", 0)]), reservation("early", [("rtx-2", 0)])]
    res[1] = Reservation(**{**res[1].__dict__, "expires_at": NOW + timedelta(minutes=1)})
    m = model.build(sample, res, now=NOW)
    assert [r["job_id"] for r in tables.reservation_table(m, tables.Query()).rows] == ["early", "late"]
    assert [r["job_id"] for r in tables.reservation_table(m, tables.Query(rsort="job", rdesc=True)).rows] == [
        "late", "early"]
    assert [r["job_id"] for r in tables.reservation_table(m, tables.Query(host="rtx-1")).rows] == ["late"]


# --- the overview -----------------------------------------------------------------------------------
def tree(groups):
    return [(g.name, g.tier, [t.host for t in g.tiles], tree(g.children)) for g in groups]


def test_overview_follows_the_switch_tree(page):
    assert tree(overview.groups(page, tables.Query())) == [
        ("spine", 2, [], [("leaf1", 1, ["a100-1", "v100"], []), ("leaf2", 1, ["a100-2", "rtx-1"], []),
                          ("leaf3", 1, ["rtx-2"], [])])]
    spine = overview.groups(page, tables.Query())[0]
    assert spine.counts == page.state_counts
    assert spine.summary == f"5 hosts, {page.totals['available']}/32 GPUs available (75%)"


def test_overview_cells_are_the_gpus_states(page):
    tiles = {t.host: t for g in overview.groups(page, tables.Query()) for t in g.walk_tiles()}
    a100 = [(c.index, c.state, c.job) for c in tiles["a100-1"].cells]
    assert a100[:5] == [(0, "busy", None), (1, "busy", None), (2, "busy", None), (3, "reserved", "retrain-42"),
                        (4, "reserved", "retrain-42")]
    # evicted and unhealthy GPUs share one colour
    assert [c.state for c in tiles["a100-2"].cells][6] == "out" and [c.state for c in tiles["v100"].cells][5] == "out"
    assert "reserved" in tiles["a100-1"].title and "job retrain-42" in tiles["a100-1"].cells[3].title


def test_overview_by_pool_and_filtered(page):
    by_pool = {g.name: g for g in overview.groups(page, tables.Query(group="pool"))}
    rtx = by_pool["cv+finetune@NVIDIA GeForce RTX 4090"]
    assert [t.host for t in rtx.tiles] == ["rtx-1", "rtx-2"] and all(len(t.cells) == 4 for t in rtx.tiles)
    only = overview.groups(page, tables.Query(host="rtx"))
    assert [t.host for g in only for t in g.walk_tiles()] == ["rtx-1", "rtx-2"]
    held = [t for g in overview.groups(page, tables.Query(state="reserved")) for t in g.walk_tiles()]
    assert [t.host for t in held] == ["a100-1"]
    assert [c.index for c in held[0].cells if not c.dim] == [3, 4]


def test_an_unreachable_host_shows_unreachable_cells():
    gpus = [Gpu("up", 0, "u0", "NVIDIA L4", 100, 0, 0.0), Gpu("down", 0, "u1", "NVIDIA L4", 100, 0, 0.0)]
    cluster = build_cluster(gpus, {"up": HostWiring.from_links([0], {}), "down": HostWiring.from_links([0], {})},
                            NetworkTiers.from_groups([("leafA", 1, ["up", "down", "gone"])]),
                            host_errors={"down": "ssh: timed out", "gone": "ssh: connection refused"})
    m = model.build(cluster, now=NOW)
    assert m.state_counts["unreachable"] == 1 and [h.host for h in m.unreachable_hosts] == ["down", "gone"]
    q = tables.Query(state="unreachable")
    assert [t.host for g in overview.groups(m, q) for t in g.walk_tiles()] == ["down", "gone"]
    html = render.render_page(m)
    assert 'class="hg-tile hg-tile-down" href="/hosts/down"' in html and "2 hosts unreachable" in html


# --- the queue ---------------------------------------------------------------------------------------------
def test_queue_table_shows_position_priority_waited_and_reason(sample):
    html = render.render_page(model.build(sample, now=NOW))
    assert "No ledger to read the queue from" in html
    queue = [model.QueueEntry("big-job", 1, 5, NOW - timedelta(minutes=12), "needs 16 available, has 12",
                              {"gpus": 16, "gpu_type": "A100*"}),
             model.QueueEntry("small-job", 2, 0, NOW - timedelta(seconds=40), "waits behind big-job", {"gpus": 1})]
    m = model.build(sample, queue=queue, now=NOW)
    assert [(q["job_id"], q["waited_s"]) for q in m.to_json()["queue"]] == [("big-job", 720.0), ("small-job", 40.0)]
    html = render.render_page(m)
    body = html.split('class="hg-queue"')[1].split("</table>")[0]
    assert re.search(r"<td class=\"hg-n\">1</td>.*big-job.*<td class=\"hg-n\">5</td>\s*<td>12m00s</td>\s*"
                     r"<td>16 GPUs of A100\*</td>\s*<td class=\"hg-wrap\"></td>\s*"
                     r"<td class=\"hg-wrap\">needs 16 available, has 12</td>", body, re.S)
    assert "2 jobs waiting" in html


def test_the_page_shows_the_ledgers_queue_with_the_heads_claim(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger.from_url(url) as led:
        led.record_health_check([HostRecord(s.name, True, host_files(s)) for s in small_hosts(2, gpus=8)],
                                collector="test", judge=judge)
        for i in range(15):
            led.enqueue(f"small-{i}", PlanRequest(1), lease_seconds=3600)
            led.take_admission(f"small-{i}")
        led.enqueue("gang-8", PlanRequest(8), priority=1, lease_seconds=3600)
        led.enqueue("late-1", PlanRequest(1), lease_seconds=3600)
        claimed = led.queue_entry("gang-8").claimed_gpus
    inputs = sources.read_inputs(None, sources.PageSettings(ledger_url=url))
    assert [(q.job_id, q.position, q.state) for q in inputs.queue] == [("gang-8", 1, "head"), ("late-1", 2, "waiting")]
    m = model.build(inputs.cluster, inputs.reservations, inputs.evictions, queue=inputs.queue, now=inputs.now)
    html = render.render_page(m)
    body = html.split('class="hg-queue"')[1].split("</table>")[0]
    host = claimed[0].host
    assert re.search(r"gang-8.*<td class=\"hg-n\">1</td>.*<td>8 GPUs</td>\s*<td class=\"hg-wrap\">"
                     + host + r" GPU 0-7 \(7 held\)</td>\s*<td class=\"hg-wrap\">head of the queue: claims", body, re.S)
    assert re.search(r"late-1.*<td class=\"hg-wrap\">2nd in the queue, 2nd for pool [^<]*behind gang-8", body, re.S)
    assert "2 jobs waiting" in html


# --- theme, links, the security policy ------------------------------------------------------------------
def test_theme_parameter_and_the_json_link(page):
    html = render.render_page(page, theme="dark", api_path="/hetero-gpu/api/cluster")
    assert '<html lang="en" class="hg-dark" data-theme-fixed>' in html
    assert '<a href="/hetero-gpu/api/cluster" target="_blank" rel="noopener">JSON</a>' in html
    assert "<html lang=\"en\">" in render.render_page(page, theme="purple")


def _sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@pytest.mark.parametrize("which", ["cluster", "host", "job", "history"])
def test_every_inline_style_and_script_is_allowed_by_the_policy_and_nothing_else(page, which):
    html = {"cluster": lambda: render.render_page(page), "host": lambda: render.render_host(page, "a100-1", hours=6),
            "job": lambda: render.render_job(page, "retrain-42"), "history": lambda: render.render_history(page, hours=6)
            }[which]()
    csp = dict(part.strip().split(" ", 1) for part in security.content_security_policy().split(";"))
    styles = re.findall(r"<style>(.*?)</style>", html, re.S)
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    assert styles and len(scripts) == 1
    assert all(_sha(s) in csp["style-src"].split() for s in styles)
    assert _sha(scripts[0]) in csp["script-src"].split()
    assert " style=" not in html and "<script " not in html  # no attribute the policy would block
    assert csp["default-src"] == "'none'" and csp["frame-ancestors"] == "'self'"


# --- history and jobs from a real ledger ---------------------------------------------------------------------
def judge(captures, new_xids, files):
    config = ClusterConfig()
    return watch.evaluate(captures, config, new_xids), watch.WatchPolicy.from_thresholds(config.thresholds)


@pytest.fixture(scope="module")
def history_ledger(tmp_path_factory):
    """Ten health checks five minutes apart: node01 GPU 1 reports an uncorrectable ECC error in
    checks 3 and 4, is evicted at check 3 and readmitted at check 7 (the third healthy check)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('history') / 'ledger.db'}"
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    clock = Clock(start)
    times = []
    with Ledger.from_url(url, clock=clock) as led:
        for n in range(10):
            clock.now = start + timedelta(minutes=5 * n)
            specs = small_hosts(2, gpus=2)
            if n in (3, 4):
                specs[0].gpus[1].ecc_uncorrected_volatile = 2
            led.record_health_check([HostRecord(s.name, True, host_files(s)) for s in specs], collector="test",
                                    judge=judge, history_interval=300, history_retention=7 * 86400)
            times.append(clock.now)
    return url, times


def test_a_hosts_timeline_shows_the_eviction_and_the_readmission_at_their_times(history_ledger):
    url, times = history_ledger
    now = times[-1] + timedelta(minutes=2)
    settings = sources.PageSettings(ledger_url=url)  # no capture directory: the ledger's inventory
    inputs = sources.read_inputs(None, settings, history_hours=6, history_hosts=["node01"], now=now)
    assert inputs.sources["captures"]["kind"] == "ledger" and inputs.sources["history"]["status"] == "ok"
    assert [(e.kind, e.index, e.at) for e in inputs.events] == [("evicted", 1, times[3]), ("readmitted", 1, times[7])]
    m = model.build(inputs.cluster, inputs.reservations, inputs.evictions, samples=inputs.samples,
                    events=inputs.events, sources=inputs.sources, now=now)
    html = render.render_host(m, "node01", hours=6)
    axis = charts.Axis(now - timedelta(hours=6), now)
    svgs = [ET.fromstring(s) for s in re.findall(r'<svg class="hg-chart".*?</svg>', html, re.S)]
    assert [s.get("id") for s in svgs] == ["hg-h-counts", "hg-h-util", "hg-h-temp"]
    for svg in svgs:
        marks = [(g.get("data-kind"), g.get("data-gpu"), g.get("data-at"), float(g.find(f"{NS}line").get("x1")))
                 for g in svg.iter(f"{NS}g") if g.get("data-kind")]
        assert marks == [("evicted", "node01:1", times[3].isoformat(), axis.x(times[3])),
                         ("readmitted", "node01:1", times[7].isoformat(), axis.x(times[7]))]
    assert axis.x(times[3]) < axis.x(times[7]) < axis.x1
    # healthy GPUs of node01 step down to 1 at the eviction and back to 2 at the readmission
    healthy = next(p for p in svgs[0].iter(f"{NS}path") if p.get("data-series") == "healthy").get("d")
    chart = charts.Chart("c", "", "", axis, 2)
    steps = re.findall(r"[ML]([\d.]+) ([\d.]+)H([\d.]+)", healthy)
    level = {round(float(x), 1): round(float(y), 1) for x, y, _ in steps}
    assert level[axis.x(times[2])] == chart.y(2) and level[axis.x(times[3])] == chart.y(1)
    assert level[axis.x(times[6])] == chart.y(1) and level[axis.x(times[7])] == chart.y(2)
    # the events table says the same
    rows = re.findall(r'<tr data-kind="(\w+)"><td><span title="([^"]+)"', html)
    assert rows == [("readmitted", times[7].isoformat()), ("evicted", times[3].isoformat())]


def test_the_pools_history_counts_the_evicted_gpu_out(history_ledger):
    url, times = history_ledger
    now = times[-1] + timedelta(minutes=2)
    inputs = sources.read_inputs(None, sources.PageSettings(ledger_url=url), history_hours=1, now=now)
    m = model.build(inputs.cluster, samples=inputs.samples, events=inputs.events, now=now)
    (chart,) = charts.pool_charts({p.pool: [(g["host"], g["index"]) for g in m.gpus if g["pool"] == p.pool]
                                   for p in m.pools}, m.samples, m.events, charts.Axis(now - timedelta(hours=1), now),
                                  busy_utilization=0.1, now=now)
    healthy = next(line for line in chart.lines if line.name == "healthy")
    ys = [float(y) for y in re.findall(r"[ML][\d.]+ ([\d.]+)", healthy.d)]
    assert chart.y(3) in ys and ys[-1] == chart.y(4)  # 3 of 4 while evicted, 4 again after
    assert [mk.kind for mk in chart.markers] == ["evicted", "readmitted"]
    html = render.render_history(m, hours=1)
    assert html.count('class="hg-chart"') == 1 and 'data-kind="readmitted"' in html


def test_job_view_shows_its_gpus_run_restarts_and_replacements(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    specs = small_hosts(2, gpus=2)
    with Ledger.from_url(url) as led:
        led.record_health_check([HostRecord(s.name, True, host_files(s)) for s in specs], collector="test",
                                judge=judge)
        cluster = sources.read_inventory(sources.PageSettings(ledger_url=url))[0]
        ident = {"dag_id": "train_llm", "run_id": "r1", "task_id": "train", "try_number": 3}
        assert led.reserve("job-a", cluster, PlanRequest(2), lease_seconds=3600, identity=ident).decision
        held = led.get("job-a").keys
        led.add_job_hosts("job-a", [held[0].host])
        new = led.replace("job-a", held[0], cluster, reasons=["xid-79"])
        assert new is not None
    settings = sources.PageSettings(ledger_url=url)
    inputs = sources.read_inputs(None, settings, history_hours=168, history_hosts=[])
    m = model.build(inputs.cluster, inputs.reservations, inputs.evictions, events=inputs.events, now=inputs.now)
    html = render.render_job(m, "job-a", job_hosts=sources.read_job_hosts(settings, "job-a"), base="/hetero-gpu")
    assert '<a target="_top" data-ui-link href="/dags/train_llm/runs/r1">r1</a>' in html
    assert "3 (2 restarts by Airflow)" in html
    root = ET.fromstring(re.search(r'<svg xmlns="http://www.w3.org/2000/svg" class="hg-topology".*?</svg>', html,
                                   re.S).group(0))
    chosen = {g.get("data-gpu") for g in root.iter(f"{NS}g") if g.get("data-chosen")}
    assert chosen == {f"{g['host']}:{g['index']}" for g in m.reservations[0]["gpus"]}
    assert f"{new.host}:{new.index}" in chosen and f"{held[0].host}:{held[0].index}" not in chosen
    events = re.findall(r'<tr data-kind="(\w+)">.*?<a href="/hetero-gpu/hosts/(\w+)">\w+</a>:(\d+)</td>', html)
    assert ("replaced", held[0].host, str(held[0].index)) in events
    assert f'Every try so far: <a href="/hetero-gpu/hosts/{held[0].host}">' in html
    unknown = render.render_job(m, "no-such-job")
    assert "No live reservation for job no-such-job" in unknown


def test_the_cli_the_health_watch_and_the_page_count_pools_alike(sample, capsys):
    """One computation (core/occupancy) behind `hetero-gpu pools`, the watch's pool metrics and the page."""
    from airflow_hetero_gpu.cli.app import main

    assert main(["pools", "--captures", str(SAMPLE), "--json"]) == 0
    cli = {p["pool"]: p for p in json.loads(capsys.readouterr().out)}
    page = {p["pool"]: p for p in model.build(sample, now=NOW).to_json()["pools"]}
    assert cli == page
    for row in watch.pool_counts(sample):
        assert row == {k: page[row["pool"]][k] for k in ("pool", "gpus", "healthy", "evicted", "available")}


# --- MIG instances and multi-node NVLink domains ----------------------------------------------------
def test_mig_instances_are_rows_of_their_own_and_an_nvlink_domain_is_named(tmp_path):
    from airflow_hetero_gpu.testing.captures import write_capture_dir
    from airflow_hetero_gpu.testing.demo import enable_mig, hgx_h100_hosts, nvl72_rack

    hosts = hgx_h100_hosts(["h100-a"]) + nvl72_rack(trays=4)
    enable_mig(hosts[0], 0)
    cluster = load_cluster(write_capture_dir(tmp_path / "caps", hosts))
    slice_ = next(g for g in cluster.gpus if g.host == "h100-a" and g.instance == 2)
    res = Reservation(
        job_id="tiny-eval", pool="x", gpus=(ReservedGpu("h100-a", 0, slice_.uuid, 0, instance=2),),
        score={"total": 1.0}, created_at=NOW, renewed_at=NOW, expires_at=NOW + timedelta(minutes=4), gpu_count=1,
        identity=None)
    pm = model.build(cluster, [res], [], now=NOW)
    rows = {g["unit"]: g for g in pm.gpus if g["host"] == "h100-a"}
    # the whole GPU is held (never handed out whole) and each instance is a unit with its own state
    assert rows["0"]["held"] == ["mig-enabled"] and rows["0"]["reserved_by"] is None
    assert (rows["0 MIG 2"]["state"], rows["0 MIG 2"]["reserved_by"]) == ("reserved", "tiny-eval")
    assert {rows[f"0 MIG {i}"]["state"] for i in (0, 1, 3)} == {"available"}
    page = render.render_host(pm, "h100-a", hours=6)
    assert '<td class="hg-n">0 MIG 2</td><td><span class="hg-pill hg-state-reserved">' in page
    assert "mig-enabled" in page
    job = render.render_job(pm, "tiny-eval")
    assert "h100-a:0 MIG 2" in job
    tray = render.render_host(pm, "nvl72-t00", hours=6)
    assert re.search(r"In NVLink domain <code>9c6f5af3-[0-9a-f-]+/1</code> with 3 other hosts", tray)
    assert "In NVLink domain" not in page  # an HGX host's NVSwitch is no multi-node domain


def test_the_overview_groups_an_nvlink_domain_and_splits_a_partitioned_rack(tmp_path):
    from airflow_hetero_gpu.testing.captures import write_capture_dir
    from airflow_hetero_gpu.testing.demo import hgx_h100_hosts, nvl72_rack

    hosts = hgx_h100_hosts(["h100-a"]) + nvl72_rack(trays=4, cliques=[1, 1, 2, 2])
    cluster = load_cluster(write_capture_dir(tmp_path / "caps", hosts))
    (top,) = overview.groups(model.build(cluster, [], [], now=NOW), tables.Query())  # no topology.conf
    assert top.name == "(all hosts)" and [t.host for t in top.tiles] == ["h100-a"]
    domains = {g.name: sorted(t.host for t in g.walk_tiles()) for g in top.children}
    # two partitions of one rack: two domains of two trays each; the HGX host is in none
    assert sorted(domains.values()) == [["nvl72-t00", "nvl72-t01"], ["nvl72-t02", "nvl72-t03"]]
    assert all(n.startswith("NVLink domain 9c6f5af3-") for n in domains)
    assert sorted(n.rsplit("/", 1)[1] for n in domains) == ["1", "2"]
    html = render.render_page(model.build(cluster, [], [], now=NOW))
    assert html.count('<div class="hg-group" data-group="NVLink domain 9c6f5af3-') == 2


def test_the_page_shows_preemptions_in_progress_and_the_last_days(tmp_path):
    from airflow_hetero_gpu.core.admission import PreemptionRules

    clock = Clock(datetime.now(timezone.utc))  # the page reads the last 24 h of the real clock
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger.from_url(url, clock=clock) as led:
        led.preemption = PreemptionRules(min_runtime_s=0, delay_s=0)
        led.record_health_check([HostRecord(s.name, True, host_files(s)) for s in small_hosts(1, gpus=8)],
                                collector="test", judge=judge)
        led.enqueue("lo", PlanRequest(8), priority=1, lease_seconds=3600, preemptible=True)
        led.take_admission("lo")
        clock.tick(30)
        led.enqueue("hi", PlanRequest(8), priority=5, lease_seconds=3600)
        clock.tick(1)
        assert led.renew_queue_entry("hi").reason.endswith("preempting lo for it")
    inputs = sources.read_inputs(None, sources.PageSettings(ledger_url=url))
    html = render.render_page(model.build(inputs.cluster, inputs.reservations, queue=inputs.queue,
                                          preemptions=inputs.preemptions, now=inputs.now))
    body = html.split('class="hg-preemptions"')[1].split("</table>")[0]
    assert re.search(r"lo.*hi.*<td>in progress</td>.*priority 5 &gt; 1", body, re.S)
    with Ledger.from_url(url, clock=clock) as led:
        clock.tick(4)
        led.finish_preemption("lo", outcome="killed", exited_after_s=4, checkpoint="epoch 2")
    inputs = sources.read_inputs(None, sources.PageSettings(ledger_url=url))
    m = model.build(inputs.cluster, inputs.reservations, queue=inputs.queue, preemptions=inputs.preemptions,
                    now=inputs.now)
    assert m.to_json()["preemptions"][0]["state"] == "killed"
    body = render.render_page(m).split('class="hg-preemptions"')[1].split("</table>")[0]
    assert re.search(r"<td>killed</td>.*<td>4s</td>\s*<td class=\"hg-n\">280 GPU-s</td><td>epoch 2</td>", body, re.S)
