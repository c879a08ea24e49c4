"""``hetero-gpu``, the command line: every sub-command lives in this package, one module each
(:mod:`.app` builds the parser and holds ``plan``, ``inventory`` and ``pools``). The rest of the
package imports nothing from here."""

from airflow_hetero_gpu.cli.app import main

__all__ = ["main"]
