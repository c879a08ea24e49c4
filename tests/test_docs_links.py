"""Every link between the repository's Markdown files lands: the file exists, and an anchor
(``file.md#section``) names a heading of it, as GitHub derives heading anchors."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]*?)(?:#([^)\s]+))?\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def markdown_files() -> list[Path]:
    return sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = anchor(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_the_anchor_rule_matches_githubs():
    assert anchor("`xid.log`: kernel log lines with `NVRM: Xid`") == "xidlog-kernel-log-lines-with-nvrm-xid"
    assert anchor("The full day again, with writes keeping their warmed cluster") == \
        "the-full-day-again-with-writes-keeping-their-warmed-cluster"
    assert anchor("Task starts in a health check's seconds") == "task-starts-in-a-health-checks-seconds"


def test_every_link_between_markdown_files_lands():
    files = markdown_files()
    assert len(files) > 10
    known = {path: anchors(path) for path in files}
    broken = []
    for path in files:
        for target, fragment in LINK.findall(FENCE.sub("", path.read_text())):
            if re.match(r"[a-z]+:", target) or (not target and not fragment):
                continue  # a URL, a mail address
            dest = (path.parent / target).resolve() if target else path
            if not dest.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} does not exist")
            elif fragment and dest.suffix == ".md":
                headings = known.get(dest) or anchors(dest)
                if fragment not in headings:
                    broken.append(f"{path.relative_to(ROOT)}: {target or path.name}#{fragment} names no heading")
    assert broken == [], "\n".join(broken)
