"""The order ``hetero-gpu --help`` lists its commands in, and one example for each.

The order follows a user's first hour: fill a ledger with the fleet's inventory (``check``, or
``collect``), look at it (``inventory``, ``pools``), ask for a placement (``plan``), then the
ledger's state and the rest. Every command's own ``--help`` ends with its example. A new command
joins with one line in :data:`COMMANDS` (a command missing from it is listed last, without an
example, and the command-line tests say so).
"""

from __future__ import annotations

import argparse
import textwrap

LEDGER = "sqlite:////srv/hetero-gpu/ledger.db"
SAMPLE = "airflow_hetero_gpu/samples/cluster"

#: (command, example), in the order of a user's first hour
COMMANDS: tuple[tuple[str, str], ...] = (
    ("check", f"hetero-gpu check --ledger {LEDGER} --hosts dgx-a1=gpu@10.0.0.11,rtx-box=gpu@10.0.0.14"),
    ("collect", f"hetero-gpu collect --hosts-file hosts.txt --identity-file ~/.ssh/gpu --ledger {LEDGER}"),
    ("inventory", f"hetero-gpu inventory --ledger {LEDGER}"),
    ("pools", f"hetero-gpu pools --captures {SAMPLE}"),
    ("plan", f"hetero-gpu plan --captures {SAMPLE} --gpus 4 --task-type finetune"),
    ("reservations", f"hetero-gpu reservations --ledger {LEDGER}"),
    ("queue", f"hetero-gpu queue --ledger {LEDGER}"),
    ("teams", f"hetero-gpu teams apply teams.yaml --ledger {LEDGER}"),
    ("release", f"hetero-gpu release --ledger {LEDGER} --job-id retrain.train.3f2a9c1d0b7e"),
    ("evictions", f"hetero-gpu evictions --ledger {LEDGER}"),
    ("uncordon", f"hetero-gpu uncordon dgx-a1:3 --ledger {LEDGER}"),
    ("drain", f"hetero-gpu drain dgx-a1 --reason 'driver upgrade' --deadline 2h --ledger {LEDGER}"),
    ("undrain", f"hetero-gpu undrain dgx-a1 --ledger {LEDGER}"),
    ("hosts", f"hetero-gpu hosts remove dgx-old --ledger {LEDGER}"),
    ("ledger", f"hetero-gpu ledger init {LEDGER}"),
    ("captures", f"hetero-gpu captures export --ledger {LEDGER} --out /tmp/fleet-captures"),
    ("simulate", "hetero-gpu simulate --trace alibaba:multigpu50 --alibaba-dir ~/alibaba-gpu-v2023"),
)

EPILOG = ("Start with `check` (or `collect`): it fills a ledger with the fleet's inventory, which "
          "`inventory`, `pools` and `plan` read (--ledger URL; or --captures DIR, a capture directory). "
          "`<command> --help` shows an example of each.")


def arrange(subparsers: argparse._SubParsersAction) -> None:
    """List the sub-commands in :data:`COMMANDS` order (the others after them) and give each a
    description (its one-line help where it has none) and its example."""
    rank = {name: i for i, (name, _) in enumerate(COMMANDS)}
    examples = dict(COMMANDS)
    helps = {action.dest: action.help for action in subparsers._choices_actions}
    subparsers._choices_actions.sort(key=lambda action: rank.get(action.dest, len(rank)))
    for name, parser in subparsers.choices.items():
        if not parser.description and helps.get(name):
            text = helps[name]
            parser.description = text[0].upper() + text[1:] + "."
        if name in examples:  # the example on a line of its own, as it is typed (never wrapped)
            parser.formatter_class = argparse.RawDescriptionHelpFormatter
            parser.description = textwrap.fill(" ".join((parser.description or "").split()), 79)
            parser.epilog = f"example:\n  {examples[name]}"


__all__ = ["COMMANDS", "EPILOG", "arrange"]
