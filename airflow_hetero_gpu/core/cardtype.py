"""Card-type matching (SPEC §4): case-insensitive, against the full name or the name without a
leading ``NVIDIA ``, ``Tesla `` or ``GeForce `` (so ``A100-SXM4-80GB`` and ``RTX 4090`` match).

As an extension, a requested type holding glob characters (``*``, ``?``, ``[``) is matched as a
case-insensitive shell pattern against the same forms (``A100*`` takes every A100 variant).

A MIG instance's card type is its GPU's name followed by ``MIG <profile>``
(``NVIDIA A100-SXM4-80GB MIG 3g.40gb``, the name NVML gives the MIG device). It matches only a
request that names MIG: ``A100*`` takes whole A100s, never slices of one; ``A100*MIG*`` or
``*MIG 1g.10gb`` take slices.
"""

from __future__ import annotations

import fnmatch
import re
from functools import lru_cache

_PREFIXES = ("nvidia ", "tesla ", "geforce ")
_GLOB = set("*?[")
_MIG_TYPE = re.compile(r"(?:^|\s)mig \d+(?:c\.\d+)?g\.\d+gb", re.IGNORECASE)


def mig_card_type(gpu_name: str, profile: str) -> str:
    """The card type of a MIG instance: ``NVIDIA A100-SXM4-80GB`` + ``3g.40gb`` ->
    ``NVIDIA A100-SXM4-80GB MIG 3g.40gb``."""
    return f"{gpu_name} MIG {profile}"


def is_mig_card_type(name: str) -> bool:
    """Whether a card type (or a requested one) names a MIG instance profile."""
    return _MIG_TYPE.search(" ".join(name.split())) is not None


@lru_cache(maxsize=4096)
def name_forms(card_type: str) -> tuple[str, ...]:
    """The lower-cased forms a card type answers to: ``NVIDIA GeForce RTX 4090`` gives
    ``nvidia geforce rtx 4090``, ``geforce rtx 4090`` and ``rtx 4090``."""
    forms = [" ".join(card_type.lower().split())]
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if forms[-1].startswith(prefix) and len(forms[-1]) > len(prefix):
                forms.append(forms[-1][len(prefix):].lstrip())
                changed = True
    return tuple(forms)


@lru_cache(maxsize=4096)
def card_type_matches(card_type: str, wanted: str) -> bool:
    """Whether a GPU of ``card_type`` satisfies a request for ``wanted``."""
    want = " ".join(wanted.lower().split())
    forms = name_forms(card_type)
    if _GLOB & set(want):
        if is_mig_card_type(card_type) and "mig" not in want:
            return False  # a pattern for whole GPUs does not take MIG slices
        return any(fnmatch.fnmatchcase(f, want) for f in forms)
    return want in forms
