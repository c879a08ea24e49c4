"""``make demo-ui``: the demo's emulated cluster behind ``airflow standalone``, on a port of your choice.

``airflow standalone`` starts the scheduler, dag-processor, api-server and triggerer as bare
``airflow`` commands looked up on ``PATH``: the demo's environment puts this interpreter's
``bin`` first (``demo_setup.demo_env``). Its api-server serves on ``port`` (checked free before
anything starts). It prints the ledger's URL (for ``hetero-gpu queue --ledger URL`` in another
shell). Ctrl-C and SIGTERM both stop standalone and every component it started (they run in their
own session, so they are stopped as one process group), then the emulated hosts, and remove the
demo directory; SIGTERM is a normal end (exit 0: ``make`` prints no error).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from airflow_hetero_gpu.demo_setup import DemoError, Stopped, demo_cluster, demo_env, stop_on_signals
from airflow_hetero_gpu.testing.airflow_env import airflow_command, migrate

DEFAULT_PORT = 8080


def check_port(port: int) -> None:
    """Fail in one line unless ``port`` can be listened on (every address, as the api-server does)."""
    if not 1 <= port <= 65535:
        raise DemoError(f"--port {port}: a TCP port is 1 to 65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise DemoError(f"port {port} is taken (another program listens on it): choose a free one, "
                                f"e.g. make demo-ui PORT={port + 1 if port < 65535 else 8081}") from None
            raise DemoError(f"cannot listen on port {port}: {err.strerror} (choose another: make demo-ui "
                            "PORT=N)") from None


def ui_env(env: dict[str, str], port: int) -> dict[str, str]:
    base = f"http://localhost:{port}"
    return {
        **env,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": base,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
        "AIRFLOW__HETERO_GPU__REFRESH_SECONDS": "30",
    }


def stop_group(proc: subprocess.Popen, grace: float = 30) -> None:
    """Stop standalone as Ctrl-C would (SIGINT: it stops its components), then whatever of its
    process group is left: SIGTERM, and SIGKILL after ``grace`` seconds."""
    steps = ((signal.SIGINT, grace), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0))
    for sig, wait in steps:
        try:
            if sig == signal.SIGINT:
                if proc.poll() is None:
                    proc.send_signal(sig)
            else:
                os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return  # the whole group is gone
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
        if sig != signal.SIGINT and not _group_alive(proc.pid):
            return


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def run_ui(dags: Path, *, port: int = DEFAULT_PORT, ssh_server: str = "auto", out=sys.stdout) -> int:
    check_port(port)
    root = Path(tempfile.mkdtemp(prefix="hetero-gpu-demo-ui-"))
    with stop_on_signals():
        try:
            out.write(f"demo directory: {root}\n")
            with demo_cluster(root / "cluster", ssh_server, out) as cluster:
                env = ui_env(demo_env(root, cluster, dags), port)
                ledger = env["AIRFLOW__HETERO_GPU__LEDGER_URL"]
                out.write(f"ledger: {ledger} (the tasks' ledger while the demo runs: hetero-gpu queue --ledger "
                          f"{ledger}, or export AIRFLOW__HETERO_GPU__LEDGER_URL={ledger})\n")
                migrate(env)
                out.write(f"starting `airflow standalone` on http://localhost:{port} (admin password: see its "
                          f"output or {root / 'airflow' / 'simple_auth_manager_passwords.json.generated'}); "
                          "Ctrl-C or SIGTERM stops everything\n")
                out.flush()
                proc = subprocess.Popen([*airflow_command(), "standalone"], env=env, start_new_session=True)
                try:
                    code = proc.wait()
                    out.write(f"airflow standalone exited with status {code}\n")
                    return code
                finally:  # Airflow goes before the hosts it talks to
                    stop_group(proc)
        except Stopped as sig:  # asked to stop, and stopped: success (`make demo-ui` says no "Error 143")
            out.write(f"\ndemo-ui stopped ({sig}): stopping Airflow and the emulated hosts, removing {root}\n")
            return 0
        except KeyboardInterrupt:
            out.write(f"\ndemo-ui interrupted: stopping Airflow and the emulated hosts, removing {root}\n")
            return 130
        finally:
            shutil.rmtree(root, ignore_errors=True)
            out.flush()
