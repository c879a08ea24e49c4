"""Deployment-wide defaults from Airflow's configuration, section ``[hetero_gpu]``.

An administrator names the fleet once (``AIRFLOW__HETERO_GPU__SSH_CONN_IDS``, ...) and every
DAG, the health sensor and the cluster page use it; an argument given to an operator, sensor or
hook wins over its setting. Read at run time only, never when a DAG file is parsed.
"""

from __future__ import annotations

SECTION = "hetero_gpu"

#: the ledger's history: a sample of an unchanged host every 5 min, kept for 7 days
DEFAULT_HISTORY_INTERVAL_S = 300.0
DEFAULT_HISTORY_RETENTION_S = 7 * 24 * 3600.0

#: option -> what it holds (declared in provider_info's ``config`` section too)
OPTIONS = {
    "ssh_conn_ids": "the GPU hosts' ssh connections: CONN,CONN or LABEL=CONN,LABEL=CONN",
    "hosts_file": "the health sensor's hosts: a file of [NAME=][USER@]HOST[:PORT] lines (with fleet_conn_id)",
    "fleet_conn_id": "the ssh connection that reaches every host of hosts_file (login, port, key_file, known_hosts)",
    "captures_dir": "the capture directory holding the last inventory",
    "cluster_config": "path of cluster.yaml (weights, thresholds, task types)",
    "topology_conf": "path of the Slurm-style topology.conf (switch tiers between hosts)",
    "ledger_conn_id": "Airflow connection of the reservation ledger",
    "ledger_url": "SQLAlchemy URL of the reservation ledger",
    "inventory_max_age": "seconds a host's inventory in the ledger may be old before a task collects it again",
    "history_interval": "seconds between two history samples of an unchanged host",
    "history_retention": "seconds the ledger keeps history samples and GPU events",
    "default_team": "the team of a job whose operator names none (docs/teams.md)",
    "preemption": "on (default) or off: whether a waiting job may preempt running jobs of lower priority",
    "preemption_min_runtime": "seconds a job runs after its (re)start before it may be preempted (600)",
    "preemption_delay": "seconds a job waits in the queue before it may preempt another (60)",
}


def setting(name: str) -> str | None:
    """The value of ``[hetero_gpu] <name>``, stripped; None when unset or empty. Through Airflow's
    configuration where the process has loaded it (tasks, triggers, the page), else through
    :func:`light_setting` (the environment variable, then airflow.cfg)."""
    if name not in OPTIONS and name != "refresh_seconds":
        raise KeyError(name)
    import sys

    if "airflow.configuration" not in sys.modules:
        # a process that has not loaded Airflow (the command line, a benchmark) reads the same
        # section without it: importing Airflow costs over a second and sets up its logging
        return light_setting(name)[0]
    from airflow.configuration import conf

    value = conf.get(SECTION, name, fallback=None)
    return value.strip() if isinstance(value, str) and value.strip() else None


#: The longest a ``[hetero_gpu]`` option of seconds may be: ten years (a finite number the
#: ledger's timestamps can add and subtract; ``inf``, ``nan`` and ``1e300`` are refused).
MAX_SETTING_S = 3650 * 86400.0


def _cfg_path(env) -> str:
    """airflow.cfg as Airflow finds it: ``$AIRFLOW_CONFIG``, else ``$AIRFLOW_HOME/airflow.cfg``."""
    import os

    if env.get("AIRFLOW_CONFIG"):
        return env["AIRFLOW_CONFIG"]
    home = env.get("AIRFLOW_HOME") or os.path.join(os.path.expanduser("~"), "airflow")
    return os.path.join(home, "airflow.cfg")


def light_setting(name: str, env=None) -> tuple[str | None, str]:
    """``[hetero_gpu] <name>`` read without importing Airflow (the command line's fast start):
    ``AIRFLOW__HETERO_GPU__<NAME>``, then airflow.cfg's ``[hetero_gpu]`` section. Returns the value
    (None when unset or empty) and where it came from."""
    import configparser
    import os

    env = os.environ if env is None else env
    var = f"AIRFLOW__{SECTION.upper()}__{name.upper()}"
    if (env.get(var) or "").strip():
        return env[var].strip(), var
    path = _cfg_path(env)
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        return None, path  # Airflow itself says what is wrong with its file
    value = parser.get(SECTION, name, fallback="").strip()
    return (value, f"[{SECTION}] {name} in {path}") if value else (None, path)


def cli_ledger_url(env=None) -> tuple[str | None, str]:
    """The ledger the operator uses, as the command line finds it with no ``--ledger``:
    ``[hetero_gpu] ledger_url`` (environment, then airflow.cfg). Returns (URL, where it came from),
    or (None, why) when no setting names one. ``ledger_conn_id`` (an Airflow connection, which the
    operator prefers) is a one-line ConfigError: the command line reads no connections."""
    from airflow_hetero_gpu.errors import ConfigError

    conn_id, conn_where = light_setting("ledger_conn_id", env)
    if conn_id:
        raise ConfigError(f"the tasks' ledger is the Airflow connection {conn_id!r} ({conn_where}), which the "
                          "command line does not read: give --ledger URL")
    return light_setting("ledger_url", env)


def seconds_setting(name: str, default: float) -> float:
    """A ``[hetero_gpu]`` option holding seconds (0 to ten years); a bad value is a one-line ConfigError."""
    from airflow_hetero_gpu.errors import ConfigError

    value = setting(name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ConfigError(f"[{SECTION}] {name}: expected seconds >= 0, got {value!r}")
    if not seconds <= MAX_SETTING_S:
        raise ConfigError(f"[{SECTION}] {name}: expected at most {MAX_SETTING_S:.0f} seconds (ten years), "
                          f"got {value!r}")
    return seconds


def preemption_settings():
    """The admission pass's preemption rules from ``[hetero_gpu] preemption*`` (None: off)."""
    from airflow_hetero_gpu.core.admission.preemption import (
        DEFAULT_MIN_RUNTIME_S, DEFAULT_PREEMPTION_DELAY_S, PreemptionRules,
    )
    from airflow_hetero_gpu.errors import ConfigError

    on = (setting("preemption") or "on").lower()
    if on not in ("on", "off"):
        raise ConfigError(f"[{SECTION}] preemption: expected on or off, got {on!r}")
    if on == "off":
        return None
    return PreemptionRules(seconds_setting("preemption_min_runtime", DEFAULT_MIN_RUNTIME_S),
                           seconds_setting("preemption_delay", DEFAULT_PREEMPTION_DELAY_S))


def history_settings() -> dict[str, float]:
    """``history_interval`` and ``history_retention`` for the ledger's history."""
    return {"history_interval": seconds_setting("history_interval", DEFAULT_HISTORY_INTERVAL_S),
            "history_retention": seconds_setting("history_retention", DEFAULT_HISTORY_RETENTION_S)}
