"""An auth manager for the page's tests: Airflow's simple auth manager, except that the users named
in ``HETERO_GPU_TEST_NO_DAG_USERS`` (comma-separated) may read no DAG at all, as a FAB user whose
role has no DAG permission. Everything else (login, tokens, the plugins view) is the simple
manager's.

    AIRFLOW__CORE__AUTH_MANAGER=dag_scoped_auth.DagScopedAuthManager   (tests/ on PYTHONPATH)
"""

from __future__ import annotations

import os

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

USERS_VAR = "HETERO_GPU_TEST_NO_DAG_USERS"


def _no_dag_users() -> set[str]:
    return {u.strip() for u in os.environ.get(USERS_VAR, "").split(",") if u.strip()}


class DagScopedAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        if user.get_name() in _no_dag_users():
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
