"""Health rules, the extra health fields, and the watch's hysteresis (core.watch, ledger side).

Table-driven: one row per case, the expected value written out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_hetero_gpu.capture.directory import QUERY_FIELDS, read_capture_dir
from airflow_hetero_gpu.capture.query import EXTRA_HEALTH_FIELDS, FABRIC_FIELDS, MIG_FIELDS, parse_query_csv
from airflow_hetero_gpu.core import watch
from airflow_hetero_gpu.core.config import ClusterConfig, Thresholds, config_from_mapping
from airflow_hetero_gpu.core.health import RULES, GpuFacts, health_reasons
from airflow_hetero_gpu.core.model import GpuKey, PlanRequest
from airflow_hetero_gpu.errors import CaptureError, ConfigError
from airflow_hetero_gpu.ledger import Ledger
from airflow_hetero_gpu.testing import nvsmi
from airflow_hetero_gpu.testing.demo import small_hosts
from shared_data import shared_data

TH = Thresholds()

# --- the rules -----------------------------------------------------------------------------------
RULE_TABLE = [
    # (facts, threshold overrides, reasons)
    (GpuFacts(), {}, ()),
    (GpuFacts(host_error="connection refused (127.0.0.11:22)"), {}, ("unreachable",)),
    (GpuFacts(lost=True), {}, ("lost",)),
    (GpuFacts(ecc_uncorrected=0), {}, ()),
    (GpuFacts(ecc_uncorrected=None), {}, ()),
    (GpuFacts(ecc_uncorrected=2), {}, ("ecc",)),
    (GpuFacts(retired_pages_pending=False), {}, ()),
    (GpuFacts(retired_pages_pending=None), {}, ()),
    (GpuFacts(retired_pages_pending=True), {}, ("retired-pages-pending",)),
    (GpuFacts(temperature_c=89.9), {}, ()),
    (GpuFacts(temperature_c=90), {}, ("temperature",)),
    (GpuFacts(temperature_c=94), {"max_temperature_c": 95}, ()),
    (GpuFacts(temperature_c=None), {}, ()),
    (GpuFacts(xids=(13, 31, 43, 45, 68, 109)), {}, ()),  # application errors
    (GpuFacts(xids=(48,)), {}, ("xid-48",)),
    (GpuFacts(xids=(79, 13, 79)), {}, ("xid-79",)),
    (GpuFacts(xids=(94, 48)), {}, ("xid-48", "xid-94")),
    (GpuFacts(remapped_rows_failure=True), {}, ("row-remap-failure",)),
    (GpuFacts(remapped_rows_pending=True), {}, ("row-remap-pending",)),
    (GpuFacts(remapped_rows_failure=None, remapped_rows_pending=None), {}, ()),  # older driver
    (GpuFacts(remapped_rows_failure=True, remapped_rows_pending=True), {"check_row_remap": False}, ()),
    (GpuFacts(hw_slowdown=True), {}, ("hw-slowdown",)),
    (GpuFacts(hw_slowdown=False), {}, ()),
    (GpuFacts(hw_slowdown=True), {"check_hw_slowdown": False}, ()),
    # several at once: RULES order
    (GpuFacts(host_error="x", lost=True, ecc_uncorrected=1, retired_pages_pending=True, temperature_c=99,
              xids=(48,), remapped_rows_failure=True, hw_slowdown=True), {},
     ("unreachable", "lost", "ecc", "retired-pages-pending", "row-remap-failure", "temperature", "hw-slowdown",
      "xid-48")),
]


@pytest.mark.parametrize("facts, overrides, reasons", RULE_TABLE)
def test_rules(facts, overrides, reasons):
    th = Thresholds(**overrides) if overrides else TH
    assert health_reasons(facts, th) == reasons


def test_every_rule_is_registered_once():
    names = [r.__name__ for r in RULES]
    assert names == ["stale", "unreachable", "lost", "ecc", "retired_pages", "row_remap", "temperature", "hw_slowdown",
                     "fabric", "xid"]


@pytest.mark.parametrize("data, message", [
    ({"thresholds": {"soft_fault_checks": 0}}, "thresholds.soft_fault_checks: input should be greater than"),
    ({"thresholds": {"unreachable_checks": "2"}}, "thresholds.unreachable_checks: input should be a valid integer"),
    ({"thresholds": {"check_row_remap": "yes"}}, "thresholds.check_row_remap: input should be a valid boolean"),
    ({"thresholds": {"check_hw_slowdown": 1}}, "thresholds.check_hw_slowdown: input should be a valid boolean"),
])
def test_watch_thresholds_are_validated(data, message):
    with pytest.raises(ConfigError, match=message):
        config_from_mapping(data, source="cluster.yaml")


def test_watch_threshold_defaults():
    th = ClusterConfig().thresholds
    assert (th.soft_fault_checks, th.unreachable_checks, th.readmit_after_healthy_checks) == (3, 2, 3)
    assert th.check_row_remap is True and th.check_hw_slowdown is True
    assert watch.WatchPolicy.from_thresholds(th) == watch.WatchPolicy(3, 2, 3)


# --- the extra fields in query.csv --------------------------------------------------------------
EXTRA_HEADER = ("index, name, memory.total [MiB], remapped_rows.pending, remapped_rows.failure, "
                "clocks_event_reasons.hw_slowdown")
EXTRA_TABLE = [
    # (header, row, (pending, failure, hw_slowdown))
    (EXTRA_HEADER, "0, NVIDIA A100-SXM4-80GB, 81920 MiB, No, No, Not Active", (False, False, False)),
    (EXTRA_HEADER, "0, NVIDIA A100-SXM4-80GB, 81920 MiB, Yes, Yes, Active", (True, True, True)),
    (EXTRA_HEADER, "0, NVIDIA GeForce RTX 2080 SUPER, 8192 MiB, [N/A], [N/A], Not Active", (None, None, False)),
    # a driver before the 535 series echoes the older name
    ("index, name, memory.total [MiB], clocks_throttle_reasons.hw_slowdown",
     "0, Tesla V100-SXM2-32GB, 32768 MiB, Active", (None, None, True)),
    # SPEC fields only: nothing known
    ("index, name, memory.total [MiB]", "0, Tesla V100-SXM2-32GB, 32768 MiB", (None, None, None)),
]


@pytest.mark.parametrize("header, row, expected", EXTRA_TABLE)
def test_extra_health_fields_are_read(header, row, expected):
    got = parse_query_csv(f"{header}\n{row}\n", "query.csv").rows[0]
    assert (got.remapped_rows_pending, got.remapped_rows_failure, got.hw_slowdown) == expected


def test_a_bad_slowdown_value_names_the_field():
    with pytest.raises(CaptureError, match="clocks_event_reasons.hw_slowdown: expected Active or Not Active"):
        parse_query_csv(f"{EXTRA_HEADER}\n0, A100, 81920 MiB, No, No, Maybe\n", "query.csv")


def _shared_query() -> Path:
    return shared_data() / "nvidia-smi" / "query"


@pytest.mark.parametrize("name, expected", [
    ("query-gpu-allfields-h100-80gb-hbm3-load.csv", (False, False, False)),
    ("query-gpu-allfields-rtx2080super-driver610-idle.csv", (None, None, False)),  # consumer card: no remapping
])
def test_extra_health_fields_of_real_allfields_captures(name, expected):
    local = Path(__file__).resolve().parent / "data" / "nvidia-smi" / name
    path = local if local.is_file() else _shared_query() / name
    if not path.is_file():
        pytest.skip(f"real sample {name} not present")
    row = parse_query_csv(path.read_text(encoding="utf-8"), str(path)).rows[0]
    assert (row.remapped_rows_pending, row.remapped_rows_failure, row.hw_slowdown) == expected
    facts = GpuFacts.from_row(row)
    assert health_reasons(facts, TH) == ()


def test_the_emulation_prints_the_extra_fields_and_refuses_them_like_an_older_driver():
    state = small_hosts(1, gpus=1)[0].to_state()
    state["gpus"][0].update(remapped_rows_failure=True, hw_slowdown=True)
    fields = ",".join([QUERY_FIELDS, *EXTRA_HEALTH_FIELDS])
    text, rc = nvsmi.query_gpu(state, fields, "csv")
    assert rc == 0 and text.splitlines()[1].endswith(", No, Yes, Active")
    old, _ = nvsmi.query_gpu(state, QUERY_FIELDS + ",clocks_throttle_reasons.hw_slowdown", "csv")
    assert old.splitlines()[0].endswith("clocks_event_reasons.hw_slowdown")
    state["unknown_query_fields"] = ["remapped_rows.pending"]
    assert nvsmi.query_gpu(state, fields, "csv") == (
        'Field "remapped_rows.pending" is not a valid field to query.\n\n', 2)


# --- Xid lines: only new ones count ---------------------------------------------------------------
M = watch.XidMarker
SPLIT_TABLE = [
    # (lines, marker, first new index, marker kept)
    ([], None, 0, None),
    ([], M("a"), 0, M("a")),  # nothing readable this time: keep the marker
    (["a", "b"], None, 0, M("b")),  # first check: everything is new
    (["a", "b"], M("b"), 2, M("b")),  # nothing new
    (["a", "b", "c"], M("b"), 2, M("c")),
    (["c", "d"], M("b"), 0, M("d")),  # marker gone (reboot, ring buffer): what is left is new
    (["a", "a"], M("a", 1), 1, M("a", 2)),  # equal journal lines: occurrences count
    (["a", "a"], M("a", 2), 2, M("a", 2)),
    (["a", "a", "a"], M("a", 2), 2, M("a", 3)),
]


@pytest.mark.parametrize("lines, marker, start, kept", SPLIT_TABLE)
def test_split_new_lines(lines, marker, start, kept):
    assert watch.split_new_lines(lines, marker) == (start, kept)


def test_marker_json_round_trip():
    assert M.from_json(M("x", 2).to_json()) == M("x", 2)
    assert M.from_json(None) is None and M.from_json({}) is None


# --- one step -----------------------------------------------------------------------------------
K = GpuKey("h", 0)
P = watch.WatchPolicy(soft_fault_checks=3, unreachable_checks=2, readmit_after=3)
STEP_TABLE = [
    # (reasons, streaks before, healthy_checks (None: not evicted), action, evict reasons, healthy after, streaks after)
    ((), {}, None, watch.OK, (), 0, {}),
    (("ecc",), {}, None, watch.EVICT, ("ecc",), 0, {}),
    (("xid-79", "lost"), {}, None, watch.EVICT, ("xid-79", "lost"), 0, {}),
    (("row-remap-failure",), {}, None, watch.EVICT, ("row-remap-failure",), 0, {}),
    (("retired-pages-pending",), {}, None, watch.EVICT, ("retired-pages-pending",), 0, {}),
    (("temperature",), {}, None, watch.PENDING, (), 0, {"temperature": 1}),
    (("temperature",), {"temperature": 1}, None, watch.PENDING, (), 0, {"temperature": 2}),
    (("temperature",), {"temperature": 2}, None, watch.EVICT, ("temperature",), 0, {"temperature": 3}),
    (("hw-slowdown",), {"temperature": 2}, None, watch.PENDING, (), 0, {"hw-slowdown": 1}),  # streaks are per reason
    (("unreachable",), {}, None, watch.PENDING, (), 0, {"unreachable": 1}),
    (("unreachable",), {"unreachable": 1}, None, watch.EVICT, ("unreachable",), 0, {"unreachable": 2}),
    (("temperature", "ecc"), {}, None, watch.EVICT, ("ecc",), 0, {"temperature": 1}),
    ((), {"temperature": 2}, None, watch.OK, (), 0, {}),  # a good check ends the streak
    # evicted GPUs
    ((), {}, 0, watch.HEALTHY_CHECK, (), 1, {}),
    ((), {}, 1, watch.HEALTHY_CHECK, (), 2, {}),
    ((), {}, 2, watch.READMIT, (), 0, {}),
    (("ecc",), {}, 2, watch.STILL_EVICTED, ("ecc",), 0, {}),
    (("temperature",), {}, 2, watch.HOLD, (), 0, {"temperature": 1}),  # breaks the run, adds no reason
    (("temperature",), {"temperature": 5}, 0, watch.STILL_EVICTED, ("temperature",), 0, {"temperature": 6}),
]


@pytest.mark.parametrize("reasons, streaks, healthy, action, evict, healthy_after, streaks_after", STEP_TABLE)
def test_step(reasons, streaks, healthy, action, evict, healthy_after, streaks_after):
    st = watch.step(watch.Observation(K, "GPU-x", tuple(reasons)), streaks, healthy, P)
    assert (st.action, st.evict_reasons, st.healthy_checks, dict(st.streaks)) == (
        action, evict, healthy_after, streaks_after)


@pytest.mark.parametrize("reason, kind, checks", [
    ("ecc", watch.HARD, 1), ("lost", watch.HARD, 1), ("xid-48", watch.HARD, 1),
    ("retired-pages-pending", watch.HARD, 1), ("row-remap-failure", watch.HARD, 1),
    ("row-remap-pending", watch.HARD, 1), ("something-new", watch.HARD, 1),
    ("temperature", watch.SOFT, 3), ("hw-slowdown", watch.SOFT, 3), ("unreachable", watch.UNREACHABLE, 2),
])
def test_fault_kinds(reason, kind, checks):
    assert (watch.fault_kind(reason), P.checks_to_evict(reason)) == (kind, checks)


def test_policy_refuses_nonsense():
    with pytest.raises(ValueError, match="readmit_after"):
        watch.WatchPolicy(readmit_after=0)


# --- the state machine over many checks -----------------------------------------------------------
def run_sequence(sequence, policy=P):
    """Feed reasons per check through step() with an in-memory ledger; actions per check."""
    streaks: dict = {}
    healthy: int | None = None
    actions = []
    for reasons in sequence:
        st = watch.step(watch.Observation(K, "GPU-x", tuple(reasons)), streaks, healthy, policy)
        streaks = dict(st.streaks)
        healthy = st.healthy_checks if st.evicted_after else None
        actions.append(st.action)
    return actions


T, E, U = ("temperature",), ("ecc",), ("unreachable",)
SEQUENCES = [
    # hard fault: out at once, back after 3 healthy checks
    ([E, (), (), (), ()], ["evict", "healthy-check", "healthy-check", "readmit", "ok"]),
    # soft fault: 3 bad checks in a row
    ([T, T, T, (), (), ()], ["pending", "pending", "evict", "healthy-check", "healthy-check", "readmit"]),
    # a blip does not evict
    ([T, (), T, T, ()], ["pending", "ok", "pending", "pending", "ok"]),
    # a network blip of one check does not evict a host; two do
    ([U, (), U, U, (), (), ()], ["pending", "ok", "pending", "evict", "healthy-check", "healthy-check", "readmit"]),
    # flapping while evicted restarts the healthy run
    ([E, (), (), T, (), (), ()], ["evict", "healthy-check", "healthy-check", "hold", "healthy-check",
                                  "healthy-check", "readmit"]),
    # the fault stays: stays out
    ([E, E, E, E], ["evict", "still-evicted", "still-evicted", "still-evicted"]),
]


@pytest.mark.parametrize("sequence, actions", SEQUENCES)
def test_state_machine(sequence, actions):
    assert run_sequence(sequence) == actions


def test_state_machine_with_other_counts():
    policy = watch.WatchPolicy(soft_fault_checks=1, unreachable_checks=1, readmit_after=1)
    assert run_sequence([T, (), U, ()], policy) == ["evict", "readmit", "evict", "readmit"]


# --- evaluate(): a capture directory as the watch sees it ---------------------------------------
def write_host(root: Path, spec, *, fields: str = ",".join([QUERY_FIELDS, *EXTRA_HEALTH_FIELDS])):
    state = spec.to_state()
    d = root / "hosts" / spec.name
    d.mkdir(parents=True, exist_ok=True)
    (d / "query.csv").write_text(nvsmi.query_gpu(state, fields, "csv")[0])
    (d / "topo.txt").write_text(nvsmi.topo_text(state))
    (d / "xid.log").write_text("".join(ln for ln in nvsmi.dmesg_text(state).splitlines(True) if "NVRM: Xid" in ln))


def test_evaluate_counts_the_new_xids_it_is_given_and_applies_the_extra_rules(tmp_path):
    specs = small_hosts(2, gpus=2)
    specs[0].xid.append({"time": 100.5, "gpu": 1, "xid": 48})
    specs[1].gpus[0].remapped_rows_failure = True
    specs[1].gpus[1].hw_slowdown = True
    for spec in specs:
        write_host(tmp_path, spec)
    captures = read_capture_dir(tmp_path)
    # the capture's own Xid lines are not read: which lines are new is the ledger's cursor's business
    first = watch.evaluate(captures, ClusterConfig())
    got = {str(o.key): o.reasons for o in first.observations}
    assert got == {"node01:0": (), "node01:1": (), "node02:0": ("row-remap-failure",),
                   "node02:1": ("hw-slowdown",)}
    assert [g.healthy for g in first.cluster.gpus] == [True, True, False, False]
    # the new Xid numbers it is handed count; application errors (13) do not
    news = watch.evaluate(captures, ClusterConfig(), {GpuKey("node01", 1): (48,), GpuKey("node01", 0): (13,)})
    assert {str(o.key): o.reasons for o in news.observations}["node01:1"] == ("xid-48",)
    assert {str(o.key): o.reasons for o in news.observations}["node01:0"] == ()
    assert not news.cluster.gpu(("node01", 1)).healthy
    # switching the optional rules off
    quiet = config_from_mapping({"thresholds": {"check_row_remap": False, "check_hw_slowdown": False}})
    assert all(g.healthy for g in watch.evaluate(captures, quiet).cluster.gpus)


def test_evaluate_keeps_the_inventory_and_the_lost_gpu_index(tmp_path):
    spec = small_hosts(1, gpus=3)[0]
    spec.gpus[1].lost = True
    write_host(tmp_path, spec)
    ev = watch.evaluate(read_capture_dir(tmp_path), ClusterConfig())
    assert [(str(o.key), o.reasons) for o in ev.observations] == [
        ("node01:0", ()), ("node01:1", ("lost",)), ("node01:2", ())]
    assert [p.id for p in ev.cluster.pools] == ["NVIDIA A100-SXM4-80GB"]
    assert watch.available_keys(ev.cluster) == {GpuKey("node01", 0), GpuKey("node01", 2)}
    counts = watch.pool_counts(ev.cluster, evicted={GpuKey("node01", 2): ("ecc",)})
    assert counts == [{"pool": "NVIDIA A100-SXM4-80GB", "gpus": 3, "healthy": 1, "evicted": 1, "available": 1}]
    gate = watch.gate_status(ev.cluster, PlanRequest(gpus=2))
    assert gate.met is True and gate.to_json()["pool"] == "NVIDIA A100-SXM4-80GB"
    assert watch.gate_status(ev.cluster, PlanRequest(gpus=3)).met is False


# --- the ledger side: one check, one transaction --------------------------------------------------
def obs(key, reasons=()):
    return watch.Observation(GpuKey(*key), f"GPU-{key[0]}-{key[1]}", tuple(reasons))


def test_ledger_applies_checks_with_hysteresis(tmp_path):
    with Ledger.from_url(str(tmp_path / "ledger.db")) as led:
        a, b, c = ("h", 0), ("h", 1), ("h", 2)

        def check(*observations):
            return [s.action for s in led.apply_watch_check(observations, P)]

        assert check(obs(a, ["ecc"]), obs(b, ["temperature"]), obs(c)) == ["evict", "pending", "ok"]
        assert led.evicted_map() == {GpuKey("h", 0): ("ecc",)}
        assert led.watch_streaks() == {GpuKey("h", 1): {"temperature": 1}}
        assert check(obs(a), obs(b, ["temperature"]), obs(c)) == ["healthy-check", "pending", "ok"]
        assert check(obs(a), obs(b, ["temperature"]), obs(c)) == ["healthy-check", "evict", "ok"]
        assert led.evicted_map() == {GpuKey("h", 0): ("ecc",), GpuKey("h", 1): ("temperature",)}
        assert led.evictions()[0].healthy_checks == 2
        assert check(obs(a), obs(b, ["temperature"])) == ["readmit", "still-evicted"]
        assert led.evicted_map() == {GpuKey("h", 1): ("temperature",)}
        # the operator brings b back: its soft-fault count starts again
        assert led.uncordon("h", 1) == [GpuKey("h", 1)]
        assert led.watch_streaks() == {}
        assert check(obs(b, ["temperature"])) == ["pending"]
        # record_check (the public single-GPU API) and the watch agree on the same rows
        led.record_check(a, False, reasons=["xid-79"])
        assert check(obs(a)) == check(obs(a)) == ["healthy-check"]
        assert check(obs(a)) == ["readmit"] and led.evicted_map() == {}
        with pytest.raises(ValueError, match="observed twice"):
            check(obs(a), obs(a))


# --- the collector's query: extra fields with a fallback for older drivers ------------------------
REST = list(MIG_FIELDS + FABRIC_FIELDS)  # asked for after the health fields
FALLBACK_TABLE = [
    # (fields the driver does not know, extra fields in the header, warnings, queries run)
    ([], list(EXTRA_HEALTH_FIELDS) + REST, [], 1),
    (["remapped_rows.pending", "remapped_rows.failure"], ["clocks_event_reasons.hw_slowdown"] + REST,
     ["nvidia-smi does not know remapped_rows.pending; its health rule is off for this host",
      "nvidia-smi does not know remapped_rows.failure; its health rule is off for this host"], 3),
    # a driver before the 535 series: the slowdown flag under its older name
    (["clocks_event_reasons.hw_slowdown"], ["remapped_rows.pending", "remapped_rows.failure",
                                            "clocks_event_reasons.hw_slowdown"] + REST, [], 2),
    (["clocks_event_reasons.hw_slowdown", "clocks_throttle_reasons.hw_slowdown"],
     ["remapped_rows.pending", "remapped_rows.failure"] + REST,
     ["nvidia-smi does not know clocks_throttle_reasons.hw_slowdown; its health rule is off for this host"], 3),
    # a driver without the fabric fields: the four of the registration go at once, one query more
    (["fabric.state", "fabric.status", "fabric.cliqueId", "fabric.clusterUuid"],
     list(EXTRA_HEALTH_FIELDS) + [f for f in REST if f not in FABRIC_FIELDS[:4]],
     ["nvidia-smi does not know fabric.state; fabric.state, fabric.status, fabric.cliqueId, fabric.clusterUuid "
      "not read on this host"], 2),
    # an old driver knowing neither MIG, the fabric, nor the tray index
    (list(MIG_FIELDS + FABRIC_FIELDS), list(EXTRA_HEALTH_FIELDS),
     ["nvidia-smi does not know mig.mode.current; mig.mode.current, mig.mode.pending not read on this host",
      "nvidia-smi does not know fabric.state; fabric.state, fabric.status, fabric.cliqueId, fabric.clusterUuid "
      "not read on this host",
      "nvidia-smi does not know fabric.health.summary; fabric.health.summary, fabric.health.bandwidth "
      "not read on this host",
      "nvidia-smi does not know platform.tray_index; platform.tray_index not read on this host"], 5),
]


@pytest.mark.parametrize("unknown, extra, warnings, queries", FALLBACK_TABLE)
def test_collector_query_falls_back_field_by_field(monkeypatch, unknown, extra, warnings, queries):
    from airflow_hetero_gpu.collect import gather
    from airflow_hetero_gpu.collect.command import CommandResult

    state = small_hosts(1, gpus=1)[0].to_state()
    state["unknown_query_fields"] = unknown
    commands = []

    def run_command(client, command, timeout, label=None, stdin=None):
        commands.append(command)
        fields = command.split("--query-gpu=")[1].split()[0]
        text, rc = nvsmi.query_gpu(state, fields, "csv")
        return CommandResult(rc, text, "")

    monkeypatch.setattr(gather, "run_command", run_command)
    got_warnings: list[str] = []
    result = gather._smi_query(None, 5, got_warnings)
    header = [c.split(" [")[0] for c in result.stdout.splitlines()[0].split(", ")]
    assert header == QUERY_FIELDS.split(",") + extra
    assert got_warnings == warnings
    assert len(commands) == queries
    assert parse_query_csv(result.stdout, "query.csv").rows[0].index == 0


# --- the reasons memo of one cluster build ----------------------------------------------------------
def _other_value(value):
    if isinstance(value, bool) or value is None:
        return True if value is not True else False
    if isinstance(value, frozenset):
        return frozenset({"[GPU requires reset]"}) if not value else frozenset()
    if isinstance(value, (int, float)):
        return value + 7
    return value + " changed"


def test_the_reasons_memo_key_holds_every_fact_the_rules_read():
    """Changing any one field of a row either leaves its GpuFacts as they were or changes the
    memo's key: two GPUs that share a key share their reasons rightly."""
    import dataclasses

    from airflow_hetero_gpu.capture.query import QueryRow
    from airflow_hetero_gpu.core.inventory import _health_key

    base = QueryRow(index=0, uuid="GPU-1", name="NVIDIA GB200", pci_bus_id="00000000:01:00.0",
                    memory_total_mib=1000.0, memory_used_mib=0.0, utilization_pct=0.0, temperature_c=40.0,
                    power_w=100.0, power_limit_w=700.0, ecc_uncorrected=0, retired_pages_pending=False,
                    problems=frozenset(), line=2, fabric_state="Completed", fabric_status="Success",
                    fabric_cluster_uuid="0", fabric_health_summary="Healthy", fabric_health_bandwidth="Full")
    covered = 0
    for f in dataclasses.fields(QueryRow):
        changed = dataclasses.replace(base, **{f.name: _other_value(getattr(base, f.name))})
        if GpuFacts.from_row(changed) != GpuFacts.from_row(base):
            assert _health_key(changed, None, False, ()) != _health_key(base, None, False, ()), f.name
            covered += 1
    assert covered >= 11  # the rules read that many fields (the name only for GB200/GB300)
    assert _health_key(base, "ssh: timed out", False, ()) != _health_key(base, None, False, ())
    assert _health_key(base, None, True, ()) != _health_key(base, None, False, ())
    assert _health_key(base, None, False, (79,)) != _health_key(base, None, False, ())


def test_a_cluster_built_with_the_memo_has_every_gpus_own_reasons(tmp_path):
    """A fleet whose GPUs share some facts and differ in others: each GPU's reasons are what
    the rules give for it alone."""
    from airflow_hetero_gpu.core.inventory import host_gpus

    specs = small_hosts(3, gpus=4)
    specs[0].gpus[1].ecc_uncorrected_volatile = 3
    specs[1].gpus[2].temperature_c = 95
    specs[2].gpus[3].temperature_c = 95  # the same facts as specs[1]'s GPU 2: one memo entry
    from airflow_hetero_gpu.testing.captures import write_capture_dir

    write_capture_dir(tmp_path, specs)
    caps = read_capture_dir(tmp_path)
    config = ClusterConfig()
    memo: dict = {}
    shared = [g for cap in caps.hosts.values() for g in host_gpus(cap, config, None, memo)]
    alone = [g for cap in caps.hosts.values() for g in host_gpus(cap, config, None, {})]
    assert shared == alone
    reasons = {(g.host, g.index): g.reasons for g in shared if g.reasons}
    assert reasons == {(specs[0].name, 1): ("ecc",), (specs[1].name, 2): ("temperature",),
                       (specs[2].name, 3): ("temperature",)}
    assert len(memo) < len(shared)  # the healthy GPUs of equal facts share one entry
