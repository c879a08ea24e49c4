"""Tests of Slurm host lists and topology.conf."""

from __future__ import annotations


import pytest

from airflow_hetero_gpu.capture.slurm import expand_hostlist, parse_topology_conf
from airflow_hetero_gpu.errors import CaptureError


@pytest.mark.parametrize(
    "expr, hosts",
    [
        ("gpu-a", ["gpu-a"]),
        ("node[01-04,07],gpu-a", ["node01", "node02", "node03", "node04", "node07", "gpu-a"]),
        ("tux[0-3]", ["tux0", "tux1", "tux2", "tux3"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[001-002]", ["n001", "n002"]),
        ("rack[1-2]-n[1-3]", ["rack1-n1", "rack1-n2", "rack1-n3", "rack2-n1", "rack2-n2", "rack2-n3"]),
        ("a[1,3],b[2-3],c", ["a1", "a3", "b2", "b3", "c"]),
        ("s[5]", ["s5"]),
        ("[1-2]x", ["1x", "2x"]),
        ("dgx-a100-[1-2].cluster.local", ["dgx-a100-1.cluster.local", "dgx-a100-2.cluster.local"]),
        ("  n1,n1 ", ["n1", "n1"]),  # surrounding blanks dropped, duplicates kept
    ],
)
def test_expand_hostlist(expr, hosts):
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize(
    "expr, fragment",
    [
        ("", "empty host list"),
        ("a,,b", "malformed host list"),
        ("a,", "malformed host list"),
        ("node[1-3", "malformed host list"),
        ("node1-3]", "malformed host list"),
        ("n[[1-2]]", "malformed host list"),
        ("n1 n2", "malformed host list"),
        ("n[]", "bad range ''"),
        ("n[a-c]", "bad range 'a-c'"),
        ("n[1-2-3]", "bad range '1-2-3'"),
        ("n[1-3:2]", "bad range '1-3:2'"),
        ("n[5-1]", "runs backwards"),
        ("n[0-99999999]", "too large"),
        ("a[0-999]b[0-999]c[0-9]", "expands to more than"),
    ],
)
def test_expand_hostlist_rejects(expr, fragment):
    with pytest.raises(ValueError) as info:
        expand_hostlist(expr)
    assert fragment in str(info.value) and "\n" not in str(info.value)


CONF = """\
# Three-level fat tree
SwitchName=leaf0 Nodes=dgx[01-04] LinkSpeed=400
switchname=leaf1 NODES=dgx[05-08],gpu-a   # keys are case-insensitive
SwitchName=leaf2 Nodes=tux[0-1]
SwitchName=spine0 Switches=leaf[0-1]
SwitchName=core \\
    Switches=spine0,leaf2

SwitchName=island Nodes=lonely
"""


@pytest.mark.parametrize(
    "a, b, tier",
    [
        ("dgx01", "dgx02", 1),
        ("dgx01", "dgx01", 1),
        ("dgx01", "dgx05", 2),
        ("gpu-a", "dgx04", 2),
        ("dgx01", "tux0", 3),
        ("tux0", "tux1", 1),
        ("dgx01", "lonely", None),  # no switch holds both
        ("dgx01", "unlisted", None),
        ("unlisted", "unlisted", None),
    ],
)
def test_lowest_common_tier(a, b, tier):
    topology = parse_topology_conf(CONF, "topology.conf")
    assert topology.lowest_common_tier(a, b) == tier
    assert topology.lowest_common_tier(b, a) == tier


def test_topology_summary():
    topology = parse_topology_conf(CONF, "topology.conf")
    assert topology.max_tier == 3
    assert topology.hosts == {f"dgx0{i}" for i in range(1, 9)} | {"gpu-a", "tux0", "tux1", "lonely"}
    assert {name: s.tier for name, s in topology.switches.items()} == {
        "leaf0": 1, "leaf1": 1, "leaf2": 1, "spine0": 2, "core": 3, "island": 1
    }
    assert topology.switches["core"].line == 6 and topology.switches["core"].switches == ("spine0", "leaf2")
    assert topology.switches["leaf0"].link_speed == "400"
    assert topology.switches_of("dgx05") == ("leaf1", "spine0", "core")
    assert topology.switches_of("tux1") == ("leaf2", "core")
    assert topology.switches_of("nobody") == ()


@pytest.mark.parametrize("text", ["", "# only a comment\n\n   \n"])
def test_empty_topology(text):
    topology = parse_topology_conf(text, "topology.conf")
    assert topology.max_tier == 0 and topology.hosts == frozenset()
    assert topology.lowest_common_tier("a", "b") is None


def test_tier_is_one_above_the_highest_child():
    text = "SwitchName=l0 Nodes=a\nSwitchName=l1 Nodes=b\nSwitchName=mid Switches=l1\nSwitchName=top Switches=l0,mid\n"
    topology = parse_topology_conf(text, "topology.conf")
    assert topology.switches["top"].tier == 3 and topology.lowest_common_tier("a", "b") == 3


def test_host_under_two_leaf_switches():
    text = "SwitchName=l0 Nodes=a,b\nSwitchName=l1 Nodes=b,c\nSwitchName=top Switches=l[0-1]\n"
    topology = parse_topology_conf(text, "topology.conf")
    assert topology.lowest_common_tier("a", "b") == 1 and topology.lowest_common_tier("b", "c") == 1
    assert topology.lowest_common_tier("a", "c") == 2
    assert topology.switches_of("b") == ("l0", "l1", "top")
    assert topology.switches_of("a") == ("l0", "top")


# text, expected line, message fragment
BAD_CASES = [
    pytest.param("SwitchName=s0 Nodes=a Bandwidth=1\n", 1, "unknown key 'Bandwidth'", id="unknown-key"),
    pytest.param("\nSwitchName=s0\n", 2, "switch s0 needs exactly one of Nodes= or Switches=", id="neither"),
    pytest.param("SwitchName=s0 Nodes=a\nSwitchName=s1 Nodes=b Switches=s0\n", 2, "exactly one of", id="both"),
    pytest.param("SwitchName=s0 Nodes=a\nSwitchName=top Switches=s[0-1]\n", 2, "switch top lists undefined switch 's1'",
                 id="undefined-switch"),
    pytest.param("SwitchName=s0 Nodes=a\n# c\nSwitchName=s0 Nodes=b\n", 3, "switch s0 defined twice (first on line 1)",
                 id="duplicate-switch"),
    pytest.param("SwitchName=a Switches=b\nSwitchName=b Switches=a\n", 2, "cycle", id="cycle"),
    pytest.param("SwitchName=l Nodes=x\nSwitchName=a Switches=l,c\nSwitchName=b Switches=a\nSwitchName=c Switches=b\n",
                 None, "cycle", id="longer-cycle"),
    pytest.param("SwitchName=a Switches=a\n", 1, "cycle", id="self-cycle"),
    pytest.param("Nodes=a\n", 1, "SwitchName= missing", id="no-switch-name"),
    pytest.param("SwitchName=s0 Nodes=\n", 1, "Nodes has no value", id="empty-value"),
    pytest.param("SwitchName=s0 Nodes\n", 1, "Nodes has no value", id="no-equals"),
    pytest.param("SwitchName=s0 Nodes=a nodes=b\n", 1, "Nodes given twice", id="duplicate-key"),
    pytest.param("SwitchName=s0 Nodes=a[1-\n", 1, "switch s0 Nodes=: malformed host list", id="bad-hostlist"),
    pytest.param("SwitchName=s[0-1] Nodes=a\n", 1, "bad switch name 's[0-1]'", id="bracketed-switch-name"),
]


@pytest.mark.parametrize("text, line, fragment", BAD_CASES)
def test_rejects_with_file_and_line(text, line, fragment):
    with pytest.raises(CaptureError) as info:
        parse_topology_conf(text, "captures/topology.conf")
    message = str(info.value)
    assert "\n" not in message and message.startswith("captures/topology.conf:")
    if line is not None:
        assert info.value.line == line
    else:
        assert info.value.line in {2, 3, 4}
    assert fragment in message


def test_ten_thousand_hosts_in_three_tiers():
    """(How fast: benchmarks/capture_parse.py.)"""
    leaves = "\n".join(f"SwitchName=leaf{i} Nodes=n{i}-[000-099]" for i in range(100))
    spines = "\n".join(f"SwitchName=spine{j} Switches=leaf[{10 * j}-{10 * j + 9}]" for j in range(10))
    topology = parse_topology_conf(f"{leaves}\n{spines}\nSwitchName=core Switches=spine[0-9]\n", "topology.conf")
    assert len(topology.hosts) == 10_000 and topology.max_tier == 3
    pairs = [("n1-001", "n1-099"), ("n1-001", "n2-000"), ("n1-001", "n55-042")]
    assert [topology.lowest_common_tier(a, b) for a, b in pairs] == [1, 2, 3]
