"""``hetero-gpu --help`` follows a user's first hour, and every command says what it does with an
example that the command line accepts as written."""

from __future__ import annotations

import re
import shlex

import pytest

from airflow_hetero_gpu.cli.app import build_parser, main
from airflow_hetero_gpu.cli.guide import COMMANDS


def _subparsers(parser):
    (action,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return action


def test_the_help_lists_the_commands_in_the_order_of_a_first_hour(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    listed = re.findall(r"^    (\w+)", out, re.MULTILINE)
    assert listed[:5] == ["check", "collect", "inventory", "pools", "plan"]
    assert listed == [name for name, _ in COMMANDS]   # every command is in the guide, in its order
    assert "Start with `check` (or `collect`)" in " ".join(out.split())


@pytest.mark.parametrize("name, example", COMMANDS)
def test_every_command_has_a_description_and_an_example_it_accepts(capsys, name, example):
    parser = _subparsers(build_parser()).choices[name]
    assert parser.description and len(parser.description) > 20
    with pytest.raises(SystemExit):
        main([name, "--help"])
    out = capsys.readouterr().out
    assert out.rstrip().endswith(f"example:\n  {example}")   # on a line of its own, as typed
    argv = shlex.split(example)
    assert argv[0] == "hetero-gpu" and argv[1] == name
    args = build_parser().parse_args(argv[1:])            # a usage mistake would exit 2 here
    assert args.command == name


def test_inventory_max_age_does_not_speak_of_placing(capsys):
    with pytest.raises(SystemExit):
        main(["inventory", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "mark GPUs of hosts whose inventory is older as stale" in text and "do not place" not in text


def test_plan_without_a_source_names_both_and_opens_no_ledger(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.delenv("AIRFLOW__HETERO_GPU__LEDGER_URL", raising=False)
    monkeypatch.delenv("AIRFLOW_CONFIG", raising=False)
    assert main(["plan", "--gpus", "2"]) == 2
    err = capsys.readouterr().err
    assert err == ("hetero-gpu plan: error: give --ledger URL (the ledger `hetero-gpu check` or `collect` filled) "
                   "or --captures DIR (a capture directory); without them the command line opens the tasks' "
                   "ledger, [hetero_gpu] ledger_url, and none is set\n")
    assert list(tmp_path.iterdir()) == []   # nothing created under $AIRFLOW_HOME
