"""Write tests/slow_tests.txt from a pytest ``--durations=0`` report: every test (its parameters
taken together) whose setup, call and teardown took ``--over`` seconds or more, slowest first.
``make test-fast`` leaves those out (tests/conftest.py marks them ``slow``).

    .venv/bin/python -m pytest -q -n 2 --durations=0 -m "not serial" > durations.log
    .venv/bin/python scripts/slow_tests.py durations.log
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*([0-9.]+)s (?:call|setup|teardown)\s+(\S+)")
OUT = Path(__file__).resolve().parents[1] / "tests" / "slow_tests.txt"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="the output of pytest --durations=0")
    parser.add_argument("--over", type=float, default=2.5, help="seconds (default 2.5)")
    args = parser.parse_args(argv)
    total: dict[str, float] = defaultdict(float)
    for line in Path(args.report).read_text(encoding="utf-8", errors="replace").splitlines():
        m = LINE.match(line)
        if m:
            total[m.group(2).split("[")[0]] += float(m.group(1))
    slow = sorted(((s, t) for t, s in total.items() if s >= args.over), reverse=True)
    if not slow:
        print(f"{args.report}: no test took {args.over:g} s or more (is it a --durations=0 report?)",
              file=sys.stderr)
        return 2
    lines = ["# tests that take 2.5 s or more; `make test-fast` leaves them out (scripts/slow_tests.py)"]
    lines += [f"{s:8.1f}  {t}" for s, t in slow]
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{OUT}: {len(slow)} tests, {sum(s for s, _ in slow):.0f} s of {sum(total.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
