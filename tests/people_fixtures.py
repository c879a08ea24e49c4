"""A real process of another user, for the tests of GPUs used outside the scheduler: import the
fixture explicitly (``from people_fixtures import other_users_process  # noqa: F401``)."""

from __future__ import annotations

import os
import pwd
import subprocess

import pytest


@pytest.fixture
def other_users_process():
    """A real process of another user (``nobody``, started with ``setpriv``) when the tests run as
    root, else of this user: (its pid, the owner ``ps`` names). The emulated host state lists the
    pid, so the collector's ``ps`` on the emulated host reads its real owner."""
    if os.geteuid() == 0:
        argv, user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sleep", "3600"], "nobody"
    else:
        argv, user = ["sleep", "3600"], pwd.getpwuid(os.geteuid()).pw_name
    proc = subprocess.Popen(argv, start_new_session=True)
    try:
        yield proc.pid, user
    finally:
        proc.kill()
        proc.wait(timeout=30)
