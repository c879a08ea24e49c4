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
