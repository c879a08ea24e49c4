"""Example training scripts shipped with the provider.

``train_tiny.py`` is a small but real PyTorch DDP training meant to be started by torchrun on
the GPUs a placement chose (or on CPUs with gloo, as the tests do). Find its path with
:func:`script_path` to pass it to :class:`airflow_hetero_gpu.launch.Torchrun`.
"""

from __future__ import annotations

from pathlib import Path


def script_path(name: str = "train_tiny.py") -> Path:
    """Absolute path of a shipped example script."""
    path = Path(__file__).resolve().parent / name
    if not path.is_file():
        raise FileNotFoundError(f"no example script {name!r} in {path.parent}")
    return path


__all__ = ["script_path"]
