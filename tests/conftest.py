"""Shared fixtures live in their own modules, one per concern."""

pytest_plugins = ["tests.harness.db", "tests.harness.sim", "tests.harness.ray_session", "tests.harness.e2e"]
