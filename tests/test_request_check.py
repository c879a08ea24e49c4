"""core.request_check.never_satisfiable: a request for a card or task type the fleet does not have
or more GPUs than every matching pool has at all is named as such (the callers make it bad input),
a shortage (of healthy or free GPUs) is not, and a fleet with a host that was not collected gets
the benefit of the doubt."""

from __future__ import annotations

import pytest

from airflow_hetero_gpu.core.inventory import load_cluster
from airflow_hetero_gpu.core.model import PlanRequest
from airflow_hetero_gpu.core.request_check import never_satisfiable
from plan_fixtures import make_captures

CARDS = "NVIDIA A100-SXM4-80GB, NVIDIA GeForce RTX 4090, Tesla V100-SXM2-32GB"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    return load_cluster(make_captures(tmp_path_factory.mktemp("caps")))


@pytest.mark.parametrize("request_, expected", [
    (PlanRequest(2), None),
    (PlanRequest(16), None),                                   # the A100 pool has 16: a shortage at most
    (PlanRequest(64), "gpu_count 64: more GPUs than any matching pool has at all, healthy or not, so it can never "
                      "start: NVIDIA A100-SXM4-80GB has 16; NVIDIA GeForce RTX 4090 has 8; Tesla V100-SXM2-32GB has 8"),
    (PlanRequest(9, "V100*"), "gpu_count 9: more GPUs than any matching pool has at all, healthy or not, so it can "
                              "never start: Tesla V100-SXM2-32GB has 8"),
    (PlanRequest(2, "A100-SXM4-80GB"), None),
    (PlanRequest(2, "a100*"), None),                           # a pattern matching a card of the fleet
    (PlanRequest(2, ("H100", "RTX 4090")), None),              # one of the types exists
    (PlanRequest(2, "H100"), f"gpu_type 'H100': the fleet has no GPU of that card type; its card types: {CARDS}"),
    (PlanRequest(2, ("H100", "B200*")), f"gpu_type 'H100' or 'B200*': the fleet has no GPU of that card type; "
                                        f"its card types: {CARDS}"),
    (PlanRequest(2, task_type="NVIDIA A100-SXM4-80GB"), None),  # a pool's default task type is its card type
    (PlanRequest(2, task_type="speech"), "task_type 'speech': no pool of the fleet supports it; the fleet's task "
                                         f"types: {CARDS}"),
])
def test_never_satisfiable(fleet, request_, expected):
    assert never_satisfiable(fleet, request_) == expected


def test_a_host_that_was_not_collected_may_hold_the_card(tmp_path):
    fleet = load_cluster(make_captures(tmp_path, errors={"rtx-2": "connection refused"}))
    assert fleet.host_errors
    assert never_satisfiable(fleet, PlanRequest(2, "H100")) is None


def test_more_than_the_healthy_gpus_is_a_shortage_not_a_mistake(tmp_path):
    fleet = load_cluster(make_captures(tmp_path, faults={"v100": {i: {"ecc_uncorrected_volatile": 1} for i in range(4)}}))
    assert never_satisfiable(fleet, PlanRequest(8, "V100*")) is None   # 4 healthy of 8: hosts or GPUs lost
    assert "Tesla V100-SXM2-32GB has 8" in never_satisfiable(fleet, PlanRequest(9, "V100*"))
