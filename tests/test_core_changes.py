"""Hot-add (S10): what changed between two collections."""

from __future__ import annotations

from airflow_hetero_gpu.core.changes import diff_clusters, diff_inventory
from airflow_hetero_gpu.core.inventory import load_cluster
from airflow_hetero_gpu.core.model import Gpu, GpuKey
from airflow_hetero_gpu.testing.captures import write_capture_dir
from plan_fixtures import hosts


def _g(host, index, uuid="u", name="NVIDIA A100-SXM4-80GB"):
    return Gpu(host, index, f"{uuid}-{host}-{index}", name)


def test_nothing_changed():
    inv = [_g("a", 0), _g("a", 1)]
    change = diff_inventory(inv, list(inv))
    assert not change.changed and change.lines() == []


def test_new_host_new_gpu_missing_and_swapped():
    old = [_g("a", 0), _g("a", 1), _g("b", 0)]
    new = [_g("a", 0), _g("a", 2), _g("b", 0, uuid="v"), _g("c", 0, name="Tesla V100-SXM2-32GB")]
    change = diff_inventory(old, new, old_pools=["NVIDIA A100-SXM4-80GB"],
                            new_pools=["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB"])
    assert change.added_hosts == ("c",)
    assert change.added_gpus == (GpuKey("a", 2), GpuKey("c", 0))
    assert change.missing_gpus == (GpuKey("a", 1),)
    assert change.replaced_gpus == (GpuKey("b", 0),)
    assert change.pools_added == ("Tesla V100-SXM2-32GB",)
    assert change.lines() == [
        "new host c",
        "new GPU a GPU2 (NVIDIA A100-SXM4-80GB, u-a-2)",
        "new GPU c GPU0 (Tesla V100-SXM2-32GB, u-c-0)",
        "GPU a GPU1 missing since the last collection",
        "GPU b GPU0 replaced (u-b-0 -> v-b-0)",
        "new pool Tesla V100-SXM2-32GB",
    ]


def test_unreachable_host_is_not_reported_missing():
    old = [_g("a", 0), _g("b", 0)]
    change = diff_inventory(old, [_g("a", 0)], unreachable_hosts=["b"])
    assert not change.changed


def test_a_host_added_between_two_collections_repartitions_the_pools(tmp_path):
    specs = hosts()
    first = load_cluster(write_capture_dir(tmp_path / "1", [s for s in specs if s.name != "v100"]))
    second = load_cluster(write_capture_dir(tmp_path / "2", specs))
    assert "Tesla V100-SXM2-32GB" not in {p.id for p in first.pools}
    change = diff_clusters(first, second)
    assert change.added_hosts == ("v100",)
    assert change.added_gpus == tuple(GpuKey("v100", i) for i in range(8))
    assert change.pools_added == ("Tesla V100-SXM2-32GB",)
