"""The Airflow plugin that adds the "GPU cluster" page to the UI.

Airflow imports plugins in every process, task runners included, so this module stays light:
it imports neither FastAPI nor the placement engine. The api-server mounts :class:`LazyApp` at
``/hetero-gpu``; the real FastAPI app (:mod:`airflow_hetero_gpu.plugins.app`) is built on the
first request. The nav entry ("Browse" → "GPU cluster") shows the page inside the Airflow UI.
"""

from __future__ import annotations

import base64
import threading
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_hetero_gpu.plugins.paths import PLUGIN_NAME, URL_PREFIX

_ICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" fill="none" stroke="{c}" stroke-width="1.8" '
    'stroke-linecap="round" stroke-linejoin="round"><rect x="3" y="6" width="18" height="12" rx="2"/>'
    '<rect x="6" y="9" width="5" height="6" rx="1"/><rect x="13" y="9" width="5" height="6" rx="1"/>'
    '<path d="M7 6V3M12 6V3M17 6V3M7 18v3M12 18v3M17 18v3"/></svg>'
)


def _icon(colour: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(_ICON.format(c=colour).encode()).decode()


class LazyApp:
    """An ASGI app that builds the page's FastAPI app on its first request."""

    def __init__(self) -> None:
        self._app: Any = None
        self._lock = threading.Lock()

    def _build(self) -> Any:
        if self._app is None:
            with self._lock:
                if self._app is None:
                    from airflow_hetero_gpu.plugins.app import create_app

                    self._app = create_app()
        return self._app

    async def __call__(self, scope, receive, send) -> None:
        await self._build()(scope, receive, send)


class HeteroGpuPlugin(AirflowPlugin):
    """GPU cluster page: pools, GPUs, reservations, evictions and the topology, read-only."""

    name = PLUGIN_NAME
    fastapi_apps = [
        {"name": "GPU cluster", "app": LazyApp(), "url_prefix": URL_PREFIX},
    ]
    external_views = [
        {
            "name": "GPU cluster",
            # relative: the UI resolves it against its own base URL, so the page is found when
            # Airflow is served under a sub-path ([api] base_url) as well as at the root
            "href": f"{URL_PREFIX.lstrip('/')}/",
            "url_route": "hetero-gpu",
            "destination": "nav",
            "category": "browse",
            "icon": _icon("#4a5568"),
            "icon_dark_mode": _icon("#e2e8f0"),
        }
    ]
