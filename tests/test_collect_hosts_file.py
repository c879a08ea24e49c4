"""``--hosts-file``: one ``[NAME=][USER@]HOST[:PORT]`` a line; bad lines are one-line errors."""

from __future__ import annotations

import pytest

from airflow_hetero_gpu.cli.app import main
from airflow_hetero_gpu.collect.targets import SshTarget, parse_hosts_file

GOOD = """\
# the A100 boxes
dgx-a1=gpu@10.0.0.11
dgx-a2=gpu@10.0.0.12:2222     # moved to another port

  127.0.0.13
[fd00::5]:2200
v6-bare=fd00::6
   # an indented comment
rtx=root@rtx-box.example.net
"""


def test_good_lines(tmp_path):
    path = tmp_path / "hosts"
    path.write_text(GOOD)
    assert parse_hosts_file(path) == [
        SshTarget("dgx-a1", "10.0.0.11", 22, "gpu"),
        SshTarget("dgx-a2", "10.0.0.12", 2222, "gpu"),
        SshTarget("127.0.0.13", "127.0.0.13", 22, None),
        SshTarget("fd00::5", "fd00::5", 2200, None),
        SshTarget("v6-bare", "fd00::6", 22, None),
        SshTarget("rtx", "rtx-box.example.net", 22, "root"),
    ]


@pytest.mark.parametrize("text, message", [
    ("a\ngpu1:0\n", "{path}:2: invalid host entry 'gpu1:0': port '0' must be a number 1-65535"),
    ("# x\n\nbad name=h\n", "{path}:3: one host a line, got 'bad name=h'"),
    ("a,b\n", "{path}:1: one host a line, got 'a,b'"),
    ("n=u@\n", "{path}:1: invalid host entry 'n=u@': no host"),
    ("x=h1\ny=h2\nx=h3\n", "{path}:3: host 'x' appears twice (first on line 1)"),
    ("h1\n[fd00::1\n", "{path}:2: invalid host entry '[fd00::1': missing ']' after an IPv6 address"),
    ("# only comments\n\n", "hosts file {path}: no hosts (one [NAME=][USER@]HOST[:PORT] a line)"),
    (b"\xff\xfe\n", "hosts file {path}: not UTF-8 text (invalid start byte at byte 0)"),
])
def test_bad_lines(tmp_path, text, message):
    path = tmp_path / "hosts"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError) as caught:
        parse_hosts_file(path)
    assert str(caught.value) == message.format(path=path)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"hosts file .*/nope: No such file or directory"):
        parse_hosts_file(tmp_path / "nope")


@pytest.mark.parametrize("text, message", [
    ("gpu1:0\n", "hetero-gpu collect: error: {path}:1: invalid host entry 'gpu1:0': port '0' must be a number 1-65535"),
    (None, "hetero-gpu collect: error: hosts file {path}: No such file or directory"),
])
def test_the_command_says_it_in_one_line_and_exits_2(tmp_path, capsys, text, message):
    path = tmp_path / "hosts"
    if text is not None:
        path.write_text(text)
    code = main(["collect", "--hosts-file", str(path), "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert (code, out, err) == (2, "", message.format(path=path) + "\n")
    assert not (tmp_path / "out").exists()


def test_hosts_and_hosts_file_are_alternatives(tmp_path, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["collect", "--hosts", "a", "--hosts-file", str(tmp_path / "h"), "--out", str(tmp_path)])
    assert caught.value.code == 2
    assert "argument --hosts-file: not allowed with argument --hosts" in capsys.readouterr().err
