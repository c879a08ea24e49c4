"""The page's security headers, and the inline assets their Content-Security-Policy allows.

The page is one HTML document with its style sheet and script inline (no extra requests behind
authentication, no flash of the wrong theme). The policy allows exactly those by their SHA-256
hash, plus the style element every wiring picture carries, and nothing else: no other script,
no style attribute, no plugin, no form target but the page itself, no framing but by Airflow's
own UI (``frame-ancestors 'self'``: the page is shown in an iframe of the same origin).
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache
from importlib.resources import files

from airflow_hetero_gpu.plugins.topology_svg import SVG_STYLE


@lru_cache(maxsize=None)
def asset(name: str) -> str:
    """The text of ``static/<name>`` (package data)."""
    return files("airflow_hetero_gpu.plugins").joinpath("static", name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


@lru_cache(maxsize=None)
def content_security_policy() -> str:
    styles = " ".join(_sha256(t) for t in (asset("page.css"), SVG_STYLE))
    return "; ".join([
        "default-src 'none'",
        f"style-src {styles}",
        f"script-src {_sha256(asset('page.js'))}",
        "img-src 'self' data:",
        "connect-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'self'",
    ])


def security_headers() -> dict[str, str]:
    """Headers every response of the page's app carries (HTML, JSON, SVG and errors alike)."""
    return {
        "Content-Security-Policy": content_security_policy(),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
        "X-Frame-Options": "SAMEORIGIN",
        "Cache-Control": "no-store",
    }
