"""Airflow UI plugin: the GPU cluster page (``/hetero-gpu/``).

:mod:`.cluster_page` holds the plugin class and stays light (Airflow imports plugins in task
runners too); the FastAPI app (:mod:`.app`) and the renderer (:mod:`.render`) are imported on
the page's first request only.
"""
