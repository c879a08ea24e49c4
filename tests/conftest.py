"""Shared test helpers. Fixtures of subsystems live beside them and are imported explicitly.

``ci_skips`` turns a skipped main-path test into a failure under ``CI=true``."""

pytest_plugins = ("ci_skips",)
