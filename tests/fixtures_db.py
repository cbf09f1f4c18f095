"""pytest fixtures: db."""
