"""Names of a package imported when first used (PEP 562).

A package's ``__init__`` that re-exports its modules' names makes every import of one of its
modules import them all. ``hetero-gpu``'s parser registers every sub-command, so the command
line would pay for the ledger and the admission pass before doing anything; with
:func:`exports` a package's names are imported on first use instead::

    __getattr__, __dir__ = exports(__name__, {"Ledger": "store", ...})
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping


def exports(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose name N lives in module ``where[N]``."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)  # the next lookup is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__
