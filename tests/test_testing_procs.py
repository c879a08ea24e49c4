"""The emulated hosts' process helpers (testing/procs.py): what killing an emulated host leaves."""

from __future__ import annotations

import subprocess
import sys

from airflow_hetero_gpu.testing import procs


def test_a_rehash_lock_left_by_a_killed_shell_is_removed_and_a_held_one_kept(tmp_path):
    """pyenv's rehash lock, left by a shell that an emulated host's death SIGKILLed mid-rehash,
    would make every later shell wait 60 s for it: kill_all's cleanup removes it once no
    ``pyenv rehash`` runs, and keeps it while one does."""
    lock = tmp_path / "shims" / ".pyenv-shim"
    lock.parent.mkdir()
    lock.write_text("\n")
    holder = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)",
                               "pyenv-rehash"], stdout=subprocess.PIPE, text=True)
    try:
        # its first line: it runs, under its own command line (a scan between fork and exec
        # would still see this test's command line, and rightly remove the lock)
        assert holder.stdout.readline().strip() == "up"
        assert procs.release_stale_pyenv_lock(tmp_path) is False  # a rehash runs: its lock stays
        assert lock.exists()
        assert procs.kill_all({holder.pid: 1}) == []
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert procs.release_stale_pyenv_lock(tmp_path) is True  # stale: nobody holds it
    assert not lock.exists()
    assert procs.release_stale_pyenv_lock(tmp_path) is False  # nothing to remove
