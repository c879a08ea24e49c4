"""core.request_check.never_satisfiable: a request for a card or task type the fleet does not have
is named as such (the callers make it bad input), a shortage is not, and a fleet with a host that
was not collected gets the benefit of the doubt."""

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
    (PlanRequest(64), None),                                   # too many: a shortage, the planner says why
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
