"""The cluster page with people on the fleet: a drained host and a GPU in use outside the
scheduler, rendered without Airflow from the sample capture directory."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

from airflow_hetero_gpu.core.inventory import load_cluster
from airflow_hetero_gpu.ledger.drains import Drain
from airflow_hetero_gpu.plugins import model, render

SAMPLE = Path(__file__).resolve().parents[1] / "airflow_hetero_gpu" / "samples" / "cluster"
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=timezone.utc)


def test_a_drained_host_and_a_gpu_in_use_outside_show_why(tmp_path):
    root = tmp_path / "captures"
    shutil.copytree(SAMPLE, root)
    base = model.build(load_cluster(SAMPLE), now=NOW)
    free = next(g for g in base.gpus if g["host"] == "rtx-1" and g["available"])  # an idle GPU
    rtx = root / "hosts" / "rtx-1"
    uuid = free["uuid"]
    (rtx / "apps.csv").write_text(f"gpu_uuid, pid, used_gpu_memory [MiB], process_name\n{uuid}, 4242, 1632 MiB, python3\n")
    (rtx / "procs.txt").write_text(" 4242  4200 alice\n")
    cluster = load_cluster(root)
    drain = Drain("v100", "driver upgrade to 580", NOW + timedelta(hours=2), NOW - timedelta(minutes=3), "ops on admin")
    page = model.build(cluster, drains=[drain], now=NOW)
    gpus = {(g["host"], g["index"]): g for g in page.gpus}
    taken = gpus[("rtx-1", free["index"])]
    assert taken["state"] == "busy" and not taken["available"]
    assert taken["held"] == ["in use outside the scheduler: alice, pid 4242 python3, 1,632 MiB"]
    v100 = [g for g in page.gpus if g["host"] == "v100"]
    assert v100 and all(not g["available"] and g["held"] == ["drained: driver upgrade to 580"] for g in v100)
    (host,) = [h for h in page.hosts if h.host == "v100"]
    assert host.notes[0] == "v100 drained: driver upgrade to 580 (since 3m00s, by ops on admin; running jobs end in 2h00m)"
    before = {p.pool: p.available for p in base.pools}
    after = {p.pool: p.available for p in page.pools}
    rtx_pool = free["pool"]
    assert after["Tesla V100-SXM2-32GB"] == 0 < before["Tesla V100-SXM2-32GB"]
    assert after[rtx_pool] == before[rtx_pool] - 1
    assert not any(st.available for key, st in page.statuses.items() if key[0] == "v100")  # the wiring picture
    assert page.to_json()["drained"][0]["reason"] == "driver upgrade to 580"
    html = render.render_page(page)
    assert "in use outside the scheduler: alice, pid 4242 python3, 1,632 MiB" in html
    assert "v100 drained: driver upgrade to 580" in html


def test_a_drained_host_has_its_own_state_colour_count_and_tooltip():
    """A drained host's idle GPUs are ``drained`` (not ``busy``): their own colour in the overview
    and its legend, their own count in the summary, the reason and the deadline on the tile's
    tooltip, and a line above the overview; a job running there stays ``reserved``."""
    import re

    from airflow_hetero_gpu.ledger.records import Reservation, ReservedGpu
    from airflow_hetero_gpu.plugins import overview, tables

    cluster = load_cluster(SAMPLE)
    base = model.build(cluster, now=NOW)
    v100 = [g for g in base.gpus if g["host"] == "v100"]
    job = Reservation("retrain-7", "Tesla V100-SXM2-32GB", (ReservedGpu("v100", 0, None, 0),), {},
                      NOW - timedelta(hours=1), NOW - timedelta(minutes=1), NOW + timedelta(hours=3), 1)
    drain = Drain("v100", "driver upgrade to 580", NOW + timedelta(hours=2), NOW - timedelta(minutes=3), "ops")
    page = model.build(cluster, [job], drains=[drain], now=NOW)
    states = {g["index"]: g["state"] for g in page.gpus if g["host"] == "v100"}
    assert states[0] == "reserved" and {states[i] for i in states if i} == {"drained"}
    drained = len(v100) - 1
    t, t0 = page.totals, base.totals
    assert t["drained"] == drained and t0["drained"] == 0
    # the drained GPUs are no longer counted busy: the busy count is the other hosts' alone
    assert t["busy"] == t0["busy"] - sum(1 for g in v100 if g["state"] == "busy" and g["index"] != 0)
    assert page.to_json()["totals"]["drained"] == drained
    assert page.to_json()["drained"][0]["deadline"] == (NOW + timedelta(hours=2)).isoformat()
    assert tables.gpu_table(page, tables.Query(state="drained")).total == drained
    html = render.render_page(page)
    summary = re.search(r'<p class="hg-summary">(.*?)</p>', html, re.S).group(1)
    assert f"{t['busy']} busy, {drained} drained, " in summary
    # above the overview: the line naming the drained host, why and when its jobs end
    top = html.split('<h2 id="overview">')[0]
    assert re.search(r'class="hg-drained-line".*1 host drained</strong>.*v100</a>: driver upgrade to 580 '
                     r'\(since 3m00s, by ops; running jobs end in 2h00m\)', top, re.S)
    legend = re.search(r'<div class="hg-legend">(.*?)</div>', html, re.S).group(1)
    assert f'<i class="hg-swatch hg-c-drained"></i>drained (no new jobs): {drained} GPUs' in legend
    (tile,) = [t for g in overview.groups(page, tables.Query()) for t in g.walk_tiles() if t.host == "v100"]
    assert [c.state for c in tile.cells] == ["reserved"] + ["drained"] * drained
    assert tile.title == (f"v100: {len(v100)} GPUs ({drained} drained (no new jobs), 1 reserved) \u00b7 drained: "
                          "driver upgrade to 580 (since 3m00s, by ops; running jobs end in 2h00m)")
    a = re.search(r'<a class="hg-tile hg-tile-drained" href="/hosts/v100"[^>]*title="([^"]*)"', html)
    assert a and "driver upgrade to 580" in a.group(1) and "running jobs end in 2h00m" in a.group(1)
    assert html.count('<i class="hg-c-drained"') == drained
    # and the style sheet gives the state its own colour, apart from busy's
    css = render.asset("page.css")
    colour = lambda name: re.search(rf"--hg-c-{name}:(#[0-9a-f]+)", css).group(1)
    assert ".hg-c-drained{background:var(--hg-c-drained)}" in css and colour("drained") != colour("busy")
