"""Launching distributed training on the chosen GPUs over SSH (the seed's step S9).

Pure Python and paramiko; no Airflow. The pieces, in the order a launch uses them:

- :mod:`~airflow_hetero_gpu.launch.command`: each host's remote command line (torchrun or any
  argv, and the payload file it may bring), with every user value shell-quoted, under
  ``setsid`` with its process group recorded, and the host's watchdog;
- :mod:`~airflow_hetero_gpu.launch.ports`: the rendezvous port (probed on the first host, or
  derived from the job id);
- :mod:`~airflow_hetero_gpu.launch.remote`: :class:`RemoteJob`, the job of many hosts: one
  process per host, failure on one host ends the job everywhere, ``kill()``;
  :func:`torchrun_job` builds one;
- :mod:`~airflow_hetero_gpu.launch.channel`: the channel pump of one host (its command, its
  output line by line, its exit status);
- :mod:`~airflow_hetero_gpu.launch.liveness`: SSH keepalives and the host timeout;
- :mod:`~airflow_hetero_gpu.launch.results` and :mod:`~airflow_hetero_gpu.launch.failures`:
  what a job hands back, and how it failed, in one line;
- :mod:`~airflow_hetero_gpu.launch.orphans`: finding and ending a job's processes left behind
  by a launcher that died.

See ``docs/launch.md``.
"""

from airflow_hetero_gpu.launch.command import (
    HOST_ENV,
    JOB_ENV,
    NODE_RANK_ENV,
    PAYLOAD_ENV,
    PAYLOAD_SCRIPT,
    PGID_MARKER,
    Command,
    HostShare,
    LaunchSpec,
    Torchrun,
    build_commands,
    build_host_command,
    validate_env_name,
    validate_job_id,
)
from airflow_hetero_gpu.launch.orphans import (
    RemoteProcess,
    SweepResult,
    find_orphans,
    kill_orphans,
    sweep_unreserved,
)
from airflow_hetero_gpu.launch.ports import FREE_PORT_COMMAND, PortProbeError, derive_port, probe_free_port
from airflow_hetero_gpu.launch.remote import (
    HostResult,
    JobFailure,
    JobKilled,
    JobResult,
    JobStartError,
    RemoteJob,
    Worker,
    choose_rdzv_port,
    placements_from_decision,
    torchrun_job,
)

__all__ = [
    "Command", "FREE_PORT_COMMAND", "HOST_ENV", "HostResult", "HostShare", "JOB_ENV", "JobFailure",
    "JobKilled", "JobResult", "JobStartError", "LaunchSpec", "NODE_RANK_ENV", "PAYLOAD_ENV",
    "PAYLOAD_SCRIPT", "PGID_MARKER",
    "PortProbeError", "RemoteJob", "RemoteProcess", "SweepResult", "Torchrun", "Worker",
    "build_commands", "build_host_command", "choose_rdzv_port", "derive_port", "find_orphans",
    "kill_orphans", "sweep_unreserved", "placements_from_decision", "probe_free_port", "torchrun_job",
    "validate_env_name", "validate_job_id",
]
