"""``python -m airflow_hetero_gpu.sim simulate ...``: the ``simulate`` command on its own."""

from __future__ import annotations

import argparse
import sys

from airflow_hetero_gpu.errors import HeteroGpuError
from airflow_hetero_gpu.sim.cli import register


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_hetero_gpu.sim")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HeteroGpuError as err:
        print(f"simulate: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
