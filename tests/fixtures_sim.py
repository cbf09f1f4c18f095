"""pytest fixtures: sim."""
