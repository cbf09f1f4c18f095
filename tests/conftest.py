"""Shared fixtures live in their own modules, one per concern."""

pytest_plugins = ["tests.fixtures_db", "tests.fixtures_sim", "tests.fixtures_ray"]
