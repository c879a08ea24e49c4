"""Shared test helpers. Fixtures of subsystems live beside them and are imported explicitly."""
