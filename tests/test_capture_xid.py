"""Tests of the kernel-log Xid reader.

The log lines below are real ones, as posted in public bug reports and documentation (source
given beside each); only unrelated neighbouring lines were left out.
"""

from __future__ import annotations

import pytest

from airflow_hetero_gpu.capture.xid import APPLICATION_XIDS, XidEvent, parse_xid_log
from airflow_hetero_gpu.errors import CaptureError

# line, expected normalised bus id, expected Xid
REAL_LINES = [
    # dmesg --ctime (leptonai/gpud pull request 46)
    ("[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, "
     "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter", "0000:cb:00", 13),
    ("[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, "
     "errorString CTX SWITCH TIMEOUT, Info 0x58005", "0000:cb:00", 109),
    # journalctl -k (NVIDIA/open-gpu-kernel-modules issue 1150)
    ("kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
     "0000:dc:00", 45),
    # syslog with the dmesg timestamp inside (3dem/relion issue 436)
    ("Feb 15 17:37:45 Gipfeli kernel: [82659.755847] NVRM: Xid (PCI:0000:41:00): 13, Graphics Exception: "
     "ESR 0x5067b0=0x9 0x5067b4=0x24 0x5067a8=0x4c1eb72 0x5067ac=0x174", "0000:41:00", 13),
    # plain dmesg (Bumblebee-Project/Bumblebee issue 677)
    ("[24128.834365] NVRM: Xid (PCI:0000:01:00): 31, Ch 00000003, engmask 00000101, intr 10000000", "0000:01:00", 31),
    ("[24128.828315] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000000 intr 00004000", "0000:01:00", 32),
    # GPU fell off the bus, kern.log (congphase/my-t450s troubleshoot_log.md)
    ("Mar 21 20:18:56 pc kernel: [   65.315783] NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, "
     "GPU has fallen off the bus.", "0000:01:00", 79),
    # dmesg -T on a cloud VM (akash-network/support issue 244)
    ("[Wed Jul 31 23:14:18 2024] NVRM: Xid (PCI:0000:00:05): 43, pid=1045242, name=pt_main_thread, Ch 00000008",
     "0000:00:05", 43),
    ("[Fri Aug  9 13:32:56 2024] NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, "
     "Contained: SM (0x1). RST: No, D-RST: No", "0000:00:08", 94),
    # Grace-based system, non-zero PCI domain (leptonai/gpud pull request 1174)
    ("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 "
     "0x00000000 0x00000000)", "0019:01:00", 149),
    # row remapping failure (Xid catalogue example)
    ("NVRM: Xid (PCI:0000:65:00): 64, pid='N/A', Row Remapper: Failed to remap row", "0000:65:00", 64),
    # older drivers: no "PCI:" (NVIDIA "Xid Errors" document, r384)
    ("[...] NVRM: Xid (0000:03:00): 14, Channel 00000001", "0000:03:00", 14),
]


@pytest.mark.parametrize("line, bus_id, xid", REAL_LINES)
def test_real_xid_lines(line, bus_id, xid):
    assert parse_xid_log(line + "\n", "xid.log") == [XidEvent(bus_id, xid, 1, line)]


def test_a_real_log_keeps_order_and_skips_other_lines():
    # dmesg around an Xid 79 (NVSentinel / NVIDIA SXid documentation excerpt)
    log = (
        "[6781741.548768] NVRM: GPU at PCI:0000:91:00: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b\n"
        "[6781741.548776] NVRM: GPU Board Serial Number: 1653723052734\n"
        "[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        "[6781741.548783] NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.\n"
        "\n"
        "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008\n"
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
    )
    events = parse_xid_log(log, "hosts/a/xid.log")
    assert [(e.pci_bus_id, e.xid, e.line) for e in events] == [("0000:91:00", 79, 3), ("0000:cb:00", 109, 6)]
    assert events[0].text.startswith("[6781741.548779] NVRM: Xid")


@pytest.mark.parametrize("text", ["", "\n\n", "[    2.757687] NVRM: loading NVIDIA UNIX Open Kernel Module  530.41.03\n"])
def test_no_xid_lines(text):
    assert parse_xid_log(text, "xid.log") == []


# text, expected line, message fragment
BAD_CASES = [
    pytest.param("ok line\nkernel: NVRM: Xid (PCI:0000:3b\n", 2, "cannot read this Xid line", id="truncated"),
    pytest.param("NVRM: Xid (PCI:0000:3b:00): seventy-nine, GPU has fallen off the bus.\n", 1,
                 "cannot read this Xid line", id="no-number"),
    pytest.param("NVRM: Xid (PCI:0000:3b:00) 79, pid=1\n", 1, "cannot read this Xid line", id="no-colon"),
    pytest.param("NVRM: Xid (PCI:0000:zz:00): 79, pid=1\n", 1, "cannot read this Xid line", id="bad-hex"),
    pytest.param("NVRM: Xid (PCI:0000:3b:00:00): 79, pid=1\n", 1, "Xid line: not a PCI bus id", id="bad-bus-id"),
    pytest.param("NVRM: Xid (PCI:0000:3b:00): 79x, pid=1\n", 1, "cannot read this Xid line", id="junk-after-number"),
]


@pytest.mark.parametrize("text, line, fragment", BAD_CASES)
def test_rejects_unreadable_xid_lines(text, line, fragment):
    with pytest.raises(CaptureError) as info:
        parse_xid_log(text, "hosts/a/xid.log")
    assert info.value.line == line and "\n" not in str(info.value)
    assert str(info.value).startswith(f"hosts/a/xid.log:{line}: ") and fragment in str(info.value)


@pytest.mark.parametrize("xid, application", [(13, True), (31, True), (43, True), (45, True), (68, True), (109, True),
                                              (48, False), (63, False), (79, False), (94, False), (119, False)])
def test_application_xids(xid, application):
    assert (xid in APPLICATION_XIDS) is application


# --- when a line was logged (the inventory's offline Xid rule ages lines by it) ---------------
from datetime import datetime, timezone  # noqa: E402

from airflow_hetero_gpu.capture.xid import line_time  # noqa: E402

CAPTURED = datetime(2026, 3, 1, 12, 0, 0)

# line prefix, expected time (None: no wall-clock time in the prefix)
LINE_TIMES = [
    ("Mar 01 11:50:00 dgx kernel: NVRM: Xid (PCI:0000:3b:00): 79,", datetime(2026, 3, 1, 11, 50)),
    ("Feb 15 17:37:45 Gipfeli kernel: [82659.755847] NVRM: Xid (PCI:0000:41:00): 13,", datetime(2026, 2, 15, 17, 37, 45)),
    # December seen in March is last year's; a line a few hours "ahead" (another time zone) is today's
    ("Dec 31 23:59:59 dgx kernel: NVRM: Xid (PCI:0000:3b:00): 79,", datetime(2025, 12, 31, 23, 59, 59)),
    ("Mar 01 20:00:00 dgx kernel: NVRM: Xid (PCI:0000:3b:00): 79,", datetime(2026, 3, 1, 20, 0)),
    ("Mar  3 08:00:00 dgx kernel: NVRM: Xid (PCI:0000:3b:00): 79,", datetime(2025, 3, 3, 8, 0)),
    ("2026-03-01T11:59:00+0000 dgx kernel: NVRM: Xid (PCI:0000:3b:00): 79,", None),  # offset: below
    ("[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13,", datetime(2024, 8, 30, 11, 43, 9)),
    ("[Fri Aug  9 13:32:56 2024] NVRM: Xid (PCI:0000:00:08): 94,", datetime(2024, 8, 9, 13, 32, 56)),
    ("[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79,", None),
    ("[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79,", None),
    ("kernel: NVRM: Xid (PCI:0000:dc:00): 45,", None),
    ("NVRM: Xid (PCI:0019:01:00): 149,", None),
]


@pytest.mark.parametrize("line, expected", [c for c in LINE_TIMES if "T11:59" not in c[0]])
def test_line_time_of_each_prefix(line, expected):
    assert line_time(line, CAPTURED) == expected


def test_line_time_of_an_iso_line_is_an_instant():
    captured = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
    assert line_time("2026-03-01T11:59:00+0000 dgx kernel: NVRM: Xid (PCI:0000:3b:00): 79,", captured) == \
        datetime(2026, 3, 1, 11, 59, tzinfo=timezone.utc)
    assert line_time("2026-03-01T13:59:00+02:00 dgx kernel: x", captured) == \
        datetime(2026, 3, 1, 11, 59, tzinfo=timezone.utc)  # the same instant
    # a zone-aware capture time gives zone-less journal lines its own zone
    assert line_time("Mar 01 11:50:00 dgx kernel: x", captured) == datetime(2026, 3, 1, 11, 50, tzinfo=timezone.utc)


def test_line_time_skips_an_impossible_date():
    # Feb 29 exists in 2024 only (of 2025-2027): the latest year that has it and is not ahead
    assert line_time("Feb 29 10:00:00 h kernel: x", CAPTURED) is None
    assert line_time("Feb 29 10:00:00 h kernel: x", datetime(2028, 3, 1)) == datetime(2028, 2, 29, 10, 0)
